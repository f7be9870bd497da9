"""A free GPU claim waits `CLAIM_SETTLE_S` after our patch took another claimant's label
off the node: kube-controller-manager's DaemonSet controller may still make a pod of
the claimant it last saw selecting the node, after the API read found none (a chaos run
of tests/integration/test_chaos_workload.py caught a driver pod made two revisions after
our removal, and a vGPU manager granted beside it)."""

from __future__ import annotations

from typing import Any

import crd
from gpuop.operator.controller.writers.workload_handover import WorkloadHandovers
from statemachine.node_plan import GPU_PODS_RECHECK_S, NodeSnapshot, plan_node, plan_reads
from statemachine.workload_handover import CLAIM_SETTLE_S, GPU_CLAIMS

VGPU = crd.ClusterPolicySpec.model_validate(
    {"sandboxWorkloads": {"enabled": True, "defaultWorkload": "vm-vgpu"}}
)
VGPU_LABEL = next(k for k, c in GPU_CLAIMS.items() if c == "vgpu-manager")
DRIVER_LABEL = next(k for k, c in GPU_CLAIMS.items() if c == "driver")


def _node() -> dict[str, Any]:
    labels = {
        "feature.node.kubernetes.io/pci-10de.present": "true",
        "nvidia.com/gpu.workload.config": "vm-vgpu",
    }
    return {"metadata": {"name": "gpu-node-0001", "uid": "u", "labels": labels}}


def _granted(settle: float) -> tuple[bool, Any]:
    snap = NodeSnapshot("gpu-node-0001", _node(), spec=VGPU, claim_settle_s=settle)
    plan = plan_node(snap)
    labels = (plan.label_patch or {}).get("metadata", {}).get("labels") or {}
    return labels.get(VGPU_LABEL) == "true", plan.again


def test_a_free_claim_is_granted_at_once_without_a_recent_release() -> None:
    granted, _ = _granted(0.0)
    assert granted


def test_a_free_claim_waits_while_the_last_claimants_daemonset_settles() -> None:
    granted, again = _granted(1.5)
    assert not granted
    assert again.requeue_after == GPU_PODS_RECHECK_S >= CLAIM_SETTLE_S


def test_a_settling_claim_asks_the_api_nothing_it_could_not_use() -> None:
    """While the claim settles it is held whatever the API says: no LIST of the node's
    pods or of our unbound ones; once it is over, both are read before the grant."""
    settling = plan_reads(NodeSnapshot("gpu-node-0001", _node(), spec=VGPU, claim_settle_s=1.5))
    assert not settling.unbound
    assert not settling.node_pods
    free = plan_reads(NodeSnapshot("gpu-node-0001", _node(), spec=VGPU))
    assert free.unbound
    assert free.node_pods


def test_only_a_patch_that_removes_a_claimants_label_starts_the_settle() -> None:
    handovers = WorkloadHandovers(pods=None, emptying=None)  # type: ignore[arg-type]
    handovers.patched("n", {DRIVER_LABEL: "true", "other": None})
    assert handovers.claim_settle_s("n") == 0.0
    handovers.patched("n", {DRIVER_LABEL: None})
    assert 0.0 < handovers.claim_settle_s("n") <= CLAIM_SETTLE_S
    handovers.forget("n")
    assert handovers.claim_settle_s("n") == 0.0
