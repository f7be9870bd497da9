"""The cuda check: the vectorAdd sample runs to success on this node."""

from __future__ import annotations

from dataclasses import replace

from gpuop.nodeagent.checks import CheckResult
from gpuop.nodeagent.kube import KubeApi
from gpuop.nodeagent.workload import CUDA_VALIDATOR, WorkloadSpec, build_pod, run_pod


class CudaCheck:
    name = "cuda"
    recheck = False  # launching a pod is too heavy to repeat while nothing changed

    def __init__(
        self,
        api: KubeApi,
        spec: WorkloadSpec,
        *,
        timeout_s: float = 300.0,
        poll_s: float = 2.0,
    ) -> None:
        self.api = api
        self.spec = replace(spec, app=CUDA_VALIDATOR, gpu_resource=None)
        self.timeout_s = timeout_s
        self.poll_s = poll_s

    async def run(self) -> CheckResult:
        return await run_pod(
            self.api, build_pod(self.spec), timeout_s=self.timeout_s, poll_s=self.poll_s
        )
