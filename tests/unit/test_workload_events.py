"""The node pass's workload Events: said once per change, never once per pass.

The plan (`statemachine.node_plan`) says them; what it said last is its snapshot's
memo (``said_invalid``, ``said_step``), carried here from one pass to the next as the
node pass's writer keeps it (``WorkloadHandovers.remember``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, cast

import crd
from gpuop.operator.controller.passes.node import read_live
from gpuop.operator.controller.writers.workload_handover import WorkloadHandovers
from statemachine.node_plan import (
    NodeSnapshot,
    Reads,
    handover,
    handover_say,
    labels_of,
    nothing_holds_claim,
    workload_say,
)
from statemachine.workload_handover import (
    DRIVER_LEAVING,
    GPU_PODS_LEAVING,
    HandoverStep,
    held,
    pending_claim,
)


class _Events:
    def __init__(self) -> None:
        self.said: list[tuple[str, str, bool]] = []

    async def record(
        self, involved: dict[str, Any], reason: str, message: str, warning: bool = False
    ) -> None:
        self.said.append((reason, message, warning))


class _Said:
    """The memo of one node's Events across passes, and what each pass said."""

    def __init__(self) -> None:
        self.said: list[tuple[str, str, bool]] = []
        self.invalid: str | None = None
        self.step: str | None = None

    def report_workload(self, node: dict[str, Any], spec: crd.ClusterPolicySpec | None) -> None:
        snap = NodeSnapshot("gpu-node-0001", node, spec=spec, said_invalid=self.invalid)
        self.invalid, say = workload_say(snap, labels_of(node))
        if say is not None:
            self.said.append((say.reason, say.message, say.warning))

    def report(self, node: dict[str, Any], target: str, claim: str, step: HandoverStep) -> None:
        snap = NodeSnapshot("gpu-node-0001", node, said_step=self.step)
        self.step, say = handover_say(snap, target, claim, step)
        if say is not None:
            self.said.append((say.reason, say.message, say.warning))


async def hold(
    handovers: WorkloadHandovers,
    emptying: Any,
    node: dict[str, Any],
    changes: dict[str, str | None],
) -> tuple[dict[str, str | None], HandoverStep | None]:
    """The label patch a node pass writes and its hand-over step, for ``changes``: the
    claimants the cache shows, and (nothing there holding the claim) the API's, as the
    node pass reads them (`read_live`) and plans them (`statemachine.node_plan`)."""
    claim = pending_claim(changes)
    if claim is None:
        return dict(changes), None
    name = node["metadata"]["name"]
    namespace = getattr(emptying, "namespace", "gpu-operator")
    snap = NodeSnapshot(name, node, namespace=namespace, claimant_pods=handovers.claimants_on(name))
    if nothing_holds_claim(snap, labels_of(node), claim):
        reads = Reads(node_pods=True, unbound=True)
        snap = replace(snap, live=await read_live(name, reads, emptying, handovers))
    step = handover(snap, labels_of(node), claim)
    return held(changes, step), step


def _node(workload: str | None) -> dict[str, Any]:
    labels = {"feature.node.kubernetes.io/pci-10de.present": "true"}
    if workload is not None:
        labels["nvidia.com/gpu.workload.config"] = workload
    return {"metadata": {"name": "gpu-node-0001", "uid": "u", "labels": labels}}


SANDBOX = crd.ClusterPolicySpec.model_validate(
    {"sandboxWorkloads": {"enabled": True, "defaultWorkload": "vm-vgpu"}}
)


async def test_an_invalid_workload_is_a_warning_once_per_value() -> None:
    handovers = events = _Said()
    for _ in range(3):
        handovers.report_workload(_node("vm-passtrough"), SANDBOX)
    assert len(events.said) == 1
    reason, message, warning = events.said[0]
    assert (reason, warning) == ("GPUWorkloadConfigInvalid", True)
    assert "gpu-node-0001" in message
    assert "'vm-passtrough'" in message
    assert "'vm-vgpu'" in message  # what it serves instead
    handovers.report_workload(_node("vm-passthrough"), SANDBOX)  # fixed
    handovers.report_workload(_node("banana"), SANDBOX)
    handovers.report_workload(_node("banana"), SANDBOX)
    handovers.report_workload(_node("vm-passtrough"), SANDBOX)  # a new change
    assert [m.split("=")[1].split(" ")[0] for _, m, _ in events.said] == [
        "'vm-passtrough'",
        "'banana'",
        "'vm-passtrough'",
    ]


async def test_no_event_without_sandbox_workloads() -> None:
    handovers = events = _Said()
    handovers.report_workload(_node("banana"), crd.ClusterPolicySpec())
    handovers.report_workload(_node("banana"), None)
    assert events.said == []


async def test_a_handover_says_each_wait_once_and_its_end() -> None:
    handovers = events = _Said()
    node = _node("vm-passthrough")
    driver = HandoverStep(DRIVER_LEAVING, ("the NVIDIA driver pod",))
    pods = HandoverStep(GPU_PODS_LEAVING, ("ns/a", "ns/b"))
    fewer = HandoverStep(GPU_PODS_LEAVING, ("ns/b",))
    for step in (driver, driver, pods, pods, fewer, fewer):
        handovers.report(node, "vm-passthrough", "vfio-manager", step)
    handovers.report(node, "vm-passthrough", "vfio-manager", HandoverStep("claiming"))
    handovers.report(node, "vm-passthrough", "vfio-manager", HandoverStep("claiming"))
    assert [(r, w) for r, _, w in events.said] == [
        ("GPUWorkloadHandover", False),
        ("GPUWorkloadHandover", True),
        ("GPUWorkloadHandover", True),
        ("GPUWorkloadHandedOver", False),
    ]
    assert "ns/a, ns/b" in events.said[1][1]
    assert "drain the node" in events.said[1][1]


# ------------------------------------------- claimants known by what their pods are


def _pod_cache(*pods: tuple[str, dict[str, str]]) -> Any:
    """A pods cache holding ``(name, labels)`` pods on gpu-node-0001."""
    from gpuop.kube.informer import Informer, ResourceSpec
    from gpuop.operator.controller.views.pod_records import pod_index, trim_pod

    cache: Informer[Any] = Informer(
        ResourceSpec("pods", cast(Any, None), transform=trim_pod, index=pod_index),
        lambda *_: None,
    )
    for i, (name, labels) in enumerate(pods):
        cache.observe(
            {
                "metadata": {
                    "name": name,
                    "namespace": "gpu-operator",
                    "uid": f"00000000-0000-0000-0000-00000000000{i}",
                    "resourceVersion": str(i + 1),
                    "labels": labels,
                },
                "spec": {"nodeName": "gpu-node-0001"},
                "status": {"phase": "Running"},
            }
        )
    return cache


NVD_DRIVER = {
    "app": "nvidia-gpu-driver-ubuntu22.04-7c9f5d",
    "app.kubernetes.io/component": "nvidia-driver",
}
PRECOMPILED = {
    "app": "nvidia-driver-daemonset-5.15.0-1048-aws-ubuntu22.04",
    "app.kubernetes.io/component": "nvidia-driver",
}
NVD_VGPU_HOST = {
    "app": "nvidia-vgpu-host-manager-ubuntu22.04-x1",
    "app.kubernetes.io/component": "nvidia-vgpu-host-manager",
}


async def test_a_vm_claim_waits_for_any_driver_pod_whatever_its_daemonset() -> None:
    """The hand-over's first patch removes `nvidia.com/gpu.deploy.driver`, so the driver
    DaemonSet no longer selects the node; its pod is found all the same."""
    for labels in (NVD_DRIVER, PRECOMPILED):
        handovers = WorkloadHandovers(_pod_cache(("driver", labels)), cast(Any, None))
        changes = {
            "nvidia.com/gpu.deploy.driver": None,
            "nvidia.com/gpu.deploy.vfio-manager": "true",
        }
        patch, step = await hold(handovers, None, _node("vm-passthrough"), changes)
        assert step is not None
        assert step.state == DRIVER_LEAVING, labels
        assert "nvidia.com/gpu.deploy.vfio-manager" not in patch
        assert patch["nvidia.com/gpu.deploy.driver"] is None


async def test_back_to_containers_waits_for_an_nvidiadriver_vgpu_host_manager() -> None:
    from statemachine.workload_handover import VM_MANAGER_LEAVING

    handovers = WorkloadHandovers(_pod_cache(("vgpu", NVD_VGPU_HOST)), cast(Any, None))
    changes = {"nvidia.com/gpu.deploy.vgpu-manager": None, "nvidia.com/gpu.deploy.driver": "true"}
    patch, step = await hold(handovers, None, _node("container"), changes)
    assert step is not None
    assert step.state == VM_MANAGER_LEAVING
    assert "nvidia.com/gpu.deploy.driver" not in patch
