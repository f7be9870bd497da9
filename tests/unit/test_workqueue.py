"""The work queue: de-duplication, one worker per key, retries with backoff."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import Counter

from gpuop.kube.workqueue import WorkQueue


async def _run(queue: WorkQueue) -> asyncio.Task[None]:
    return asyncio.create_task(queue.run())


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def test_duplicate_keys_collapse_and_a_busy_key_runs_once_more() -> None:
    calls: Counter[str] = Counter()
    gate = asyncio.Event()

    async def reconcile(key: str) -> None:
        calls[key] += 1
        if key == "slow" and calls[key] == 1:
            await gate.wait()

    queue = WorkQueue(reconcile, workers=4)
    for _ in range(50):
        queue.add("a")
    queue.add("slow")
    task = await _run(queue)
    await asyncio.sleep(0.05)
    for _ in range(10):
        queue.add("slow")  # while it runs: marked dirty, runs exactly once more
    gate.set()
    await asyncio.wait_for(queue.wait_idle(), 2)
    await _stop(task)
    assert calls == Counter({"a": 1, "slow": 2})


async def test_one_key_is_never_processed_concurrently() -> None:
    active = 0
    peak = 0

    async def reconcile(key: str) -> None:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.01)
        active -= 1

    queue = WorkQueue(reconcile, workers=8)
    task = await _run(queue)
    for _ in range(20):
        queue.add("same")
        await asyncio.sleep(0.003)
    await asyncio.wait_for(queue.wait_idle(), 2)
    await _stop(task)
    assert peak == 1


async def test_failures_retry_with_growing_delay_then_reset() -> None:
    times: list[float] = []
    loop = asyncio.get_running_loop()

    async def reconcile(key: str) -> None:
        times.append(loop.time())
        if len(times) < 4:
            raise RuntimeError("API down")

    queue = WorkQueue(reconcile, workers=1, base_delay=0.02, max_delay=0.05)
    task = await _run(queue)
    queue.add("k")
    await asyncio.wait_for(queue.wait_idle(), 2)
    await _stop(task)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert len(times) == 4
    # Each retry waited at least its jittered backoff (upper bounds would only
    # measure load): a ceiling doubling to the cap, shortened by at most a quarter.
    ceilings = [round(queue.retry.ceiling(n), 3) for n in (1, 2, 3, 4)]
    assert ceilings == [0.02, 0.04, 0.05, 0.05]
    for gap, ceiling in zip(gaps, ceilings, strict=False):
        assert gap >= ceiling * (1 - queue.retry.jitter) - 0.001
    assert queue.stats.failed == 3
    assert queue.stats.processed == 4


async def test_add_after_keeps_the_earliest_timer_and_forget_cancels() -> None:
    seen: list[str] = []

    async def reconcile(key: str) -> None:
        seen.append(key)

    queue = WorkQueue(reconcile, workers=1)
    task = await _run(queue)
    queue.add_after("later", 0.05)
    queue.add_after("later", 5.0)  # a later deadline does not postpone the earlier one
    queue.add_after("gone", 0.05)
    queue.forget("gone")
    await asyncio.sleep(0.2)
    await _stop(task)
    assert seen == ["later"]


async def test_a_key_failing_for_days_keeps_its_capped_delay_and_the_worker_lives() -> None:
    """Failure 1,025 of one key used to raise OverflowError (0.2 * 2**1024) inside
    the worker, killing the queue and the process."""
    assert 0 < WorkQueue(_noop).backoff(1025) <= 60.0
    assert WorkQueue(_noop).backoff(10**9) <= 60.0
    seen: list[str] = []

    async def reconcile(key: str) -> None:
        seen.append(key)
        if key == "bad":
            raise RuntimeError("webhook denied the patch")

    queue = WorkQueue(reconcile, workers=1, max_delay=0.01)
    queue._failures["bad"] = 1024
    task = await _run(queue)
    queue.add("bad")
    await asyncio.sleep(0.05)
    queue.add("good")
    await asyncio.sleep(0.05)
    assert not task.done()
    assert "good" in seen
    assert queue._failures["bad"] > 1025
    await _stop(task)


async def test_longest_running_names_the_oldest_active_key() -> None:
    gate = asyncio.Event()

    async def reconcile(key: str) -> None:
        await gate.wait()

    queue = WorkQueue(reconcile, workers=2)
    assert queue.longest_running() is None
    task = await _run(queue)
    queue.add("node/a")
    await asyncio.sleep(0.01)
    queue.add("node/b")
    await asyncio.sleep(0.01)
    running = queue.longest_running(now=10**9)
    assert running is not None
    assert running[0] == "node/a"
    assert running[1] > 10**8
    gate.set()
    await asyncio.wait_for(queue.wait_idle(), 2)
    assert queue.longest_running() is None
    await _stop(task)


async def _noop(key: str) -> None:
    return None


async def test_quiet_within_ignores_timers_beyond_the_horizon_only() -> None:
    async def reconcile(key: str) -> None:
        return None

    queue = WorkQueue(reconcile, workers=1)
    assert queue.quiet_within(5)
    queue.add_after("far", 600)
    assert queue.quiet_within(5)
    assert not queue.is_idle()
    queue.add_after("near", 1)
    assert not queue.quiet_within(5)
    queue.forget("near")
    queue.add("now")
    assert not queue.quiet_within(5)
    task = await _run(queue)
    await asyncio.sleep(0.05)
    assert queue.quiet_within(5)
    await _stop(task)
    queue.forget("far")
