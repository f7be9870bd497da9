"""Units say when they want to run again (`_result.Result`, as controller-runtime's
reconcilers do) and the operator's worker loop queues their key: no unit's pass adds
its own key to the work queue."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from gpuop.operator.controller import Operator, OperatorConfig
from gpuop.operator.controller.base.keys import (
    CLUSTER_KEY,
    GC_KEY,
    NVD_KEY,
    REMEDIATION_KEY,
    UPGRADES_KEY,
)
from gpuop.operator.controller.base.result import Again, Result
from gpuop.operator.metrics import OperatorMetrics


async def _never(**_: Any) -> None:
    raise AssertionError("not listed in this test")


def _operator() -> tuple[Operator, list[tuple[str, float]]]:
    rest = SimpleNamespace(lister=lambda *_a, **_k: _never, observer=None)
    op = Operator(rest, OperatorConfig(namespace="gpu-operator"), OperatorMetrics())  # type: ignore[arg-type]
    after: list[tuple[str, float]] = []
    op.queue.add_after = lambda key, delay: after.append((key, delay))  # type: ignore[method-assign]
    return op, after


def test_the_soonest_wish_of_a_pass_wins_and_is_taken_once() -> None:
    again = Again()
    assert again.take() == Result()
    again.after(5.0)
    again.after(1.0)
    again.after(3.0)
    assert again.take() == Result(1.0)
    assert again.take() == Result()  # the next pass starts afresh


@pytest.mark.parametrize(
    ("key", "unit", "method"),
    [
        (CLUSTER_KEY, "cluster", "reconcile"),
        (UPGRADES_KEY, "node_passes", "reconcile_upgrades"),
        (GC_KEY, "gpuclusters", "reconcile"),
    ],
)
async def test_the_worker_loop_queues_a_key_again_when_its_pass_says_so(
    key: str, unit: str, method: str
) -> None:
    op, after = _operator()

    async def wants(again: float | None) -> Result:
        return Result(again)

    setattr(getattr(op, unit), method, lambda: wants(2.5))
    await op._reconcile(key)
    assert after == [(key, 2.5)]

    setattr(getattr(op, unit), method, lambda: wants(None))
    await op._reconcile(key)
    assert after == [(key, 2.5)]  # None: only news wakes it


async def test_remediation_says_when_again_through_the_same_loop() -> None:
    op, after = _operator()

    async def settle() -> float | None:
        return 30.0

    op.remediation.reconcile = settle  # type: ignore[method-assign]
    await op._reconcile(REMEDIATION_KEY)
    assert after == [(REMEDIATION_KEY, 30.0)]


async def test_a_refused_object_is_the_cluster_passes_wish_not_a_queue_timer() -> None:
    """The applier's refusal timer and the status writer's coalescing go to the cluster
    pass's own wish, returned by the pass."""
    op, after = _operator()
    op.applier._retry_after(4.0)
    op.cluster.status._write_again_after(2.0)
    assert after == []
    assert op.cluster.again.take() == Result(2.0)


async def test_the_nvidiadriver_pass_runs_again_only_on_news() -> None:
    op, after = _operator()

    async def nothing() -> None:
        return None

    op.nvd.reconcile = nothing  # type: ignore[method-assign]
    await op._reconcile(NVD_KEY)
    assert after == []
