"""The shared backoff: doubling, capped before it is computed, jitter only shortens."""

from __future__ import annotations

from gpuop.kube.backoff import Backoff, Retry


def test_ceiling_doubles_to_the_cap_and_never_overflows() -> None:
    policy = Backoff(0.2, 60.0)
    assert [policy.ceiling(n) for n in (1, 2, 3)] == [0.2, 0.4, 0.8]
    assert policy.ceiling(0) == 0.2
    assert policy.ceiling(1025) == 60.0  # 0.2 * 2**1024 would raise OverflowError
    assert policy.ceiling(10**12) == 60.0


def test_jitter_stays_between_the_floor_and_the_cap() -> None:
    policy = Backoff(1.0, 8.0, jitter=0.25)
    assert policy.delay(3, rand=lambda: 0.0) == 4.0
    assert policy.delay(3, rand=lambda: 1.0) == 3.0
    assert policy.delay(99, rand=lambda: 0.0) == 8.0
    delays = {policy.delay(99) for _ in range(200)}
    assert all(6.0 <= d <= 8.0 for d in delays)
    assert len(delays) > 1  # really spread


def test_retry_counts_failures_and_starts_over_after_success() -> None:
    retry = Retry(Backoff(1.0, 100.0, jitter=0.0))
    assert [retry.failed() for _ in range(3)] == [1.0, 2.0, 4.0]
    retry.succeeded()
    assert retry.failed() == 1.0
