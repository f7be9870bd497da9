"""The plugin check: the device plugin advertises GPUs in the node's allocatable."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from gpuop.nodeagent.checks import CheckResult
from gpuop.nodeagent.kube import KubeApi
from gpuop.nodeagent.workload import PLUGIN_VALIDATOR, WorkloadSpec, build_pod, run_pod

GPU_RESOURCE = "nvidia.com/gpu"
MIG_PREFIX = "nvidia.com/mig-"


def gpu_allocatable(allocatable: Mapping[str, str]) -> dict[str, int]:
    """GPU resources with a positive count: ``nvidia.com/gpu`` and ``nvidia.com/mig-*``."""
    out: dict[str, int] = {}
    for resource, quantity in allocatable.items():
        if resource != GPU_RESOURCE and not resource.startswith(MIG_PREFIX):
            continue
        try:
            count = int(quantity)
        except ValueError:
            continue
        if count > 0:
            out[resource] = count
    return out


class PluginCheck:
    name = "plugin"
    recheck = True

    def __init__(
        self,
        api: KubeApi,
        node_name: str,
        *,
        workload: WorkloadSpec | None = None,
        timeout_s: float = 300.0,
        poll_s: float = 2.0,
    ) -> None:
        self.api = api
        self.node_name = node_name
        self.workload = workload
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self._workload_done = False

    async def run(self) -> CheckResult:
        allocatable = await self.api.get_node_allocatable(self.node_name)
        if allocatable is None:
            return CheckResult.failed(f"node {self.node_name} not found")
        gpus = gpu_allocatable(allocatable)
        if not gpus:
            return CheckResult.failed(
                f"node {self.node_name} has no allocatable {GPU_RESOURCE} or {MIG_PREFIX}*"
            )
        facts = {"RESOURCES": ",".join(f"{k}:{v}" for k, v in sorted(gpus.items()))}
        if self.workload is not None and not self._workload_done:
            resource = GPU_RESOURCE if GPU_RESOURCE in gpus else sorted(gpus)[0]
            spec = replace(self.workload, app=PLUGIN_VALIDATOR, gpu_resource=resource)
            result = await run_pod(
                self.api, build_pod(spec), timeout_s=self.timeout_s, poll_s=self.poll_s
            )
            if not result.ok:
                return result
            self._workload_done = True  # once per process; rechecks only look at allocatable
        return CheckResult.passed(facts=facts)  # plugin-ready is empty, as upstream's
