"""The fleet pass's wait scales with what it last cost, within bounds, and what it reads
of the driver pods is asked only where it can matter."""

from __future__ import annotations

from typing import Any, cast

import pytest

from gpuop.kube.informer import Informer, ResourceSpec
from gpuop.operator.controller.base.keys import FLEET_COALESCE_MAX_S, FLEET_COALESCE_S, UPGRADES_KEY
from gpuop.operator.controller.passes.node import NodeReconciler
from gpuop.operator.controller.views.node_views import trim_node
from statemachine import BudgetNode
from statemachine.upgrade_keys import STATE_LABEL


class _Queue:
    def __init__(self) -> None:
        self.after: list[tuple[str, float]] = []

    def add_after(self, key: str, delay: float) -> None:
        self.after.append((key, delay))


@pytest.mark.parametrize(
    ("last_pass_cpu_s", "wait"),
    [(0.0, FLEET_COALESCE_S), (0.001, FLEET_COALESCE_S), (0.1, 2.0), (10.0, FLEET_COALESCE_MAX_S)],
)
def test_fleet_news_waits_twenty_times_the_last_pass(last_pass_cpu_s: float, wait: float) -> None:
    queue = _Queue()
    nothing = cast(Any, None)
    passes = NodeReconciler(
        rest=nothing,
        nodes=nothing,
        queue=cast(Any, queue),
        active_policy=nothing,
        upgrades=nothing,
        gate=nothing,
        owners=nothing,
        workloads=nothing,
    )
    passes._fleet_cpu_s = last_pass_cpu_s
    passes.fleet_soon()
    assert queue.after == [(UPGRADES_KEY, pytest.approx(wait))]


def _gpu_node(name: str, state: str | None, rv: str = "1") -> dict[str, Any]:
    node_labels = {"nvidia.com/gpu.present": "true"}
    if state:
        node_labels[STATE_LABEL] = state
    return {
        "metadata": {"name": name, "resourceVersion": rv, "labels": node_labels},
        "spec": {},
    }


def _passes_over(nodes: Informer) -> NodeReconciler:
    nothing = cast(Any, None)
    return NodeReconciler(
        rest=nothing,
        nodes=nodes,
        queue=nothing,
        active_policy=nothing,
        upgrades=nothing,
        gate=nothing,
        owners=nothing,
        workloads=nothing,
    )


def test_driver_pod_news_matters_only_while_a_node_waits_for_a_slot() -> None:
    nodes = Informer(ResourceSpec("nodes", cast(Any, None), transform=trim_node), lambda *_: None)
    passes = _passes_over(nodes)
    nodes.observe(_gpu_node("a", "upgrade-done"))
    nodes.observe(_gpu_node("b", None))
    assert not passes.upgrades_queued()
    nodes.observe(_gpu_node("b", "upgrade-required", rv="2"))
    assert passes.upgrades_queued()  # the memo follows the cache's version
    nodes.observe(_gpu_node("b", "cordon-required", rv="3"))
    assert not passes.upgrades_queued()


def test_the_budget_looks_up_driver_pods_of_candidates_only() -> None:
    asked: list[str] = []

    def has_driver_pod(name: str) -> bool:
        asked.append(name)
        return False

    done = BudgetNode.from_node(trim_node(_gpu_node("a", "upgrade-done")), has_driver_pod)
    queued = BudgetNode.from_node(trim_node(_gpu_node("b", "upgrade-required")), has_driver_pod)
    assert asked == ["b"]
    assert done.driver_pod_present
    assert not queued.driver_pod_present
