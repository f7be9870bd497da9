"""Precompiled drivers upgrade per kernel pool: which driver DaemonSet a node follows,
what names one rollout across the pools, and the gate comparing each node with its own
pool's revision."""

from __future__ import annotations

from typing import Any

import components as c
import crd
from components import driver
from components.context import KERNEL_LABEL, OS_ID_LABEL, OS_VERSION_LABEL
from components.driver import DriverPool, pool_for, rollout_key
from components.keys import DEPLOY_DRIVER_LABEL
from statemachine.rollout_gate import GateNode, GatePhase, GatePolicy, plan_gate
from statemachine.upgrade_keys import UpgradeState as S

OLD_KERNEL = "5.15.0-124-generic"
NEW_KERNEL = "6.8.0-45-generic"


def gpu_node(kernel: str) -> dict[str, Any]:
    return {
        "metadata": {
            "labels": {OS_ID_LABEL: "ubuntu", OS_VERSION_LABEL: "22.04", KERNEL_LABEL: kernel}
        },
        "status": {"nodeInfo": {"containerRuntimeVersion": "containerd://1.7"}},
    }


def rendered(version: str, *kernels: str, precompiled: bool = True) -> list[dict[str, Any]]:
    """The driver DaemonSets the ClusterPolicy renders for GPU nodes of ``kernels``."""
    ctx = c.RenderContext(
        namespace="ns",
        operator_image="op:1",
        gpu_nodes=tuple(c.node_facts(gpu_node(k)) for k in kernels),
    )
    spec = crd.ClusterPolicySpec.model_validate(
        {"driver": {"usePrecompiled": precompiled, "version": version}}
    )
    return [o for o in driver.render(spec, ctx) if o["kind"] == "DaemonSet"]


def pools(daemonsets: list[dict[str, Any]], created: str = "") -> list[DriverPool]:
    return [
        DriverPool(d["metadata"]["name"], d["spec"]["template"]["spec"]["nodeSelector"], created)
        for d in daemonsets
    ]


def node_labels(kernel: str) -> dict[str, str]:
    return {DEPLOY_DRIVER_LABEL: "true", KERNEL_LABEL: kernel}


def test_each_node_follows_its_kernels_daemonset() -> None:
    found = pools(rendered("595", OLD_KERNEL, NEW_KERNEL))
    assert pool_for(node_labels(OLD_KERNEL), found) == (
        "nvidia-driver-daemonset-5.15.0-124-generic-ubuntu22.04"
    )
    assert pool_for(node_labels(NEW_KERNEL), found) == (
        "nvidia-driver-daemonset-6.8.0-45-generic-ubuntu22.04"
    )


def test_a_node_no_pool_selects_has_none() -> None:
    found = pools(rendered("595", OLD_KERNEL))
    assert pool_for(node_labels(NEW_KERNEL), found) is None  # its kernel's is not there yet
    assert pool_for({KERNEL_LABEL: OLD_KERNEL}, found) is None  # not a driver node
    assert pool_for(node_labels(OLD_KERNEL), []) is None


def test_the_compiled_driver_selects_every_driver_node() -> None:
    found = pools(rendered("595.91.07", OLD_KERNEL, precompiled=False))
    for kernel in (OLD_KERNEL, NEW_KERNEL):
        assert pool_for(node_labels(kernel), found) == driver.DAEMONSET_NAME


def test_while_switching_the_newest_daemonset_wins() -> None:
    """Both the compiled and a precompiled DaemonSet select the node until the old one is
    pruned: the node follows the one created last (what it will run)."""
    (compiled,) = pools(
        rendered("595.91.07", OLD_KERNEL, precompiled=False), "2026-01-01T00:00:00Z"
    )
    (kernel,) = pools(rendered("595", OLD_KERNEL), "2026-01-02T00:00:00Z")
    assert pool_for(node_labels(OLD_KERNEL), [compiled, kernel]) == kernel.name
    older = DriverPool(kernel.name, kernel.node_selector, "2025-12-31T00:00:00Z")
    assert pool_for(node_labels(OLD_KERNEL), [compiled, older]) == compiled.name


def templates(daemonsets: list[dict[str, Any]]) -> list[tuple[Any, Any]]:
    return [
        (d["spec"]["template"]["spec"]["nodeSelector"], d["spec"]["template"]["spec"])
        for d in daemonsets
    ]


def test_a_new_kernel_pool_is_the_same_rollout_a_new_version_is_not() -> None:
    one = rollout_key(templates(rendered("595", OLD_KERNEL)))
    two = rollout_key(templates(rendered("595", OLD_KERNEL, NEW_KERNEL)))
    assert one
    assert one == two
    assert rollout_key(templates(rendered("600", OLD_KERNEL, NEW_KERNEL))) != two


def test_the_compiled_drivers_key_is_its_digest() -> None:
    (ds,) = rendered("595.91.07", OLD_KERNEL, precompiled=False)
    assert rollout_key(templates([ds])) == driver.digest_in(ds["spec"]["template"]["spec"])


def test_the_gate_compares_each_node_with_its_own_pools_revision() -> None:
    """Two pools at different revisions: a node done on its own pool's newest counts as
    upgraded, so a canary in one pool validates and the rollout proceeds."""
    nodes = [
        GateNode("a", S.UPGRADE_DONE, revision="rev-a2", target="rev-a2"),
        GateNode("b", S.UPGRADE_REQUIRED, revision="rev-b1", target="rev-b2"),
        GateNode("c", S.UPGRADE_REQUIRED, revision="rev-a1", target="rev-a2"),
    ]
    first = plan_gate(GatePolicy(canary_nodes=1), nodes, "rev-a2,rev-b2", None, now=100.0)
    assert first.phase is GatePhase.CANARY
    assert first.record is not None
    assert first.record.canary == ("b",)
    assert set(first.held) == {"c"}
    done = [nodes[0], GateNode("b", S.UPGRADE_DONE, "rev-b2", target="rev-b2"), nodes[2]]
    second = plan_gate(GatePolicy(canary_nodes=1), done, "rev-a2,rev-b2", first.record, now=200.0)
    assert second.phase is GatePhase.PROCEEDING
    assert not second.held


def test_a_failure_at_its_own_pools_revision_halts() -> None:
    nodes = [
        GateNode("a", S.UPGRADE_FAILED, "rev-a1", failed_revision="rev-a2", target="rev-a2"),
        GateNode("b", S.UPGRADE_REQUIRED, revision="rev-b1", target="rev-b2"),
    ]
    decision = plan_gate(GatePolicy(halt_after_failures=1), nodes, "rev-a2,rev-b2", None, now=1.0)
    assert decision.phase is GatePhase.HALTED
    assert set(decision.held) == {"b"}
