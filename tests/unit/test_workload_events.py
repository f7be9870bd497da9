"""The node pass's workload Events: said once per change, never once per pass."""

from __future__ import annotations

from typing import Any, cast

import crd
from gpuop.operator.controller.writers.workload_handover import WorkloadHandovers
from statemachine.workload_handover import (
    DRIVER_LEAVING,
    GPU_PODS_LEAVING,
    HandoverStep,
)


class _Events:
    def __init__(self) -> None:
        self.said: list[tuple[str, str, bool]] = []

    async def record(
        self, involved: dict[str, Any], reason: str, message: str, warning: bool = False
    ) -> None:
        self.said.append((reason, message, warning))


def _handovers() -> tuple[WorkloadHandovers, _Events]:
    events = _Events()
    nothing = cast(Any, None)
    return WorkloadHandovers(nothing, nothing, cast(Any, events)), events


def _node(workload: str | None) -> dict[str, Any]:
    labels = {"feature.node.kubernetes.io/pci-10de.present": "true"}
    if workload is not None:
        labels["nvidia.com/gpu.workload.config"] = workload
    return {"metadata": {"name": "gpu-node-0001", "uid": "u", "labels": labels}}


SANDBOX = crd.ClusterPolicySpec.model_validate(
    {"sandboxWorkloads": {"enabled": True, "defaultWorkload": "vm-vgpu"}}
)


async def test_an_invalid_workload_is_a_warning_once_per_value() -> None:
    handovers, events = _handovers()
    for _ in range(3):
        await handovers.report_workload(_node("vm-passtrough"), SANDBOX)
    assert len(events.said) == 1
    reason, message, warning = events.said[0]
    assert (reason, warning) == ("GPUWorkloadConfigInvalid", True)
    assert "gpu-node-0001" in message
    assert "'vm-passtrough'" in message
    assert "'vm-vgpu'" in message  # what it serves instead
    await handovers.report_workload(_node("vm-passthrough"), SANDBOX)  # fixed
    await handovers.report_workload(_node("banana"), SANDBOX)
    await handovers.report_workload(_node("banana"), SANDBOX)
    await handovers.report_workload(_node("vm-passtrough"), SANDBOX)  # a new change
    assert [m.split("=")[1].split(" ")[0] for _, m, _ in events.said] == [
        "'vm-passtrough'",
        "'banana'",
        "'vm-passtrough'",
    ]


async def test_no_event_without_sandbox_workloads() -> None:
    handovers, events = _handovers()
    await handovers.report_workload(_node("banana"), crd.ClusterPolicySpec())
    await handovers.report_workload(_node("banana"), None)
    assert events.said == []


async def test_a_handover_says_each_wait_once_and_its_end() -> None:
    handovers, events = _handovers()
    node = _node("vm-passthrough")
    driver = HandoverStep(DRIVER_LEAVING, ("the NVIDIA driver pod",))
    pods = HandoverStep(GPU_PODS_LEAVING, ("ns/a", "ns/b"))
    fewer = HandoverStep(GPU_PODS_LEAVING, ("ns/b",))
    for step in (driver, driver, pods, pods, fewer, fewer):
        await handovers._report(node, "vm-passthrough", "vfio-manager", step)
    await handovers._report(node, "vm-passthrough", "vfio-manager", HandoverStep("claiming"))
    await handovers._report(node, "vm-passthrough", "vfio-manager", HandoverStep("claiming"))
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
        handovers = WorkloadHandovers(
            _pod_cache(("driver", labels)), cast(Any, None), cast(Any, _Events())
        )
        changes = {
            "nvidia.com/gpu.deploy.driver": None,
            "nvidia.com/gpu.deploy.vfio-manager": "true",
        }
        patch, step = await handovers.hold(_node("vm-passthrough"), changes, "vm-passthrough")
        assert step is not None
        assert step.state == DRIVER_LEAVING, labels
        assert "nvidia.com/gpu.deploy.vfio-manager" not in patch
        assert patch["nvidia.com/gpu.deploy.driver"] is None


async def test_back_to_containers_waits_for_an_nvidiadriver_vgpu_host_manager() -> None:
    from statemachine.workload_handover import VM_MANAGER_LEAVING

    handovers = WorkloadHandovers(
        _pod_cache(("vgpu", NVD_VGPU_HOST)), cast(Any, None), cast(Any, _Events())
    )
    changes = {"nvidia.com/gpu.deploy.vgpu-manager": None, "nvidia.com/gpu.deploy.driver": "true"}
    patch, step = await handovers.hold(_node("container"), changes, "container")
    assert step is not None
    assert step.state == VM_MANAGER_LEAVING
    assert "nvidia.com/gpu.deploy.driver" not in patch
