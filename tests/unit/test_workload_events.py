"""The node pass's workload Events: said once per change, never once per pass."""

from __future__ import annotations

from typing import Any, cast

import crd
from gpuop.controller._workload import WorkloadHandovers
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
    return WorkloadHandovers(nothing, nothing, cast(Any, events), lambda node: ""), events


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
