"""The driver check: NVML initialises and reports versions and GPUs."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gpuop.log import get_logger
from gpuop.nodeagent.checks import CheckResult
from gpuop.nvml import DriverNotLoaded, GpuLost, LibraryNotFound, Nvml, NvmlError, read_inventory

log = get_logger(__name__)

CONTAINER_DRIVER_ROOT = Path("/run/nvidia/driver")


def nvml_failure(exc: NvmlError) -> str:
    """One line saying what an NVML failure means for the node."""
    if isinstance(exc, LibraryNotFound):
        return f"NVML library not found: {exc}"
    if isinstance(exc, DriverNotLoaded):
        return f"NVIDIA driver not loaded: {exc}"
    if isinstance(exc, GpuLost):
        return f"GPU lost (fell off the bus or needs a reset): {exc}"
    return f"NVML error ({type(exc).__name__}): {exc}"


class DriverCheck:
    name = "driver"
    recheck = True

    def __init__(self, nvml: Nvml, driver_root: Path, host_root: Path = Path("/host")) -> None:
        self.nvml = nvml
        self.driver_root = driver_root
        self.host_root = host_root

    def _is_host_driver(self) -> bool:
        return self.driver_root in (Path("/"), self.host_root)

    async def run(self) -> CheckResult:
        try:
            inventory = await asyncio.to_thread(read_inventory, self.nvml)
        except NvmlError as exc:
            return CheckResult.failed(nvml_failure(exc))
        if not inventory.devices:
            return CheckResult.failed("NVML initialised but sees no GPU")
        for dev in inventory.devices:
            log.info(
                "gpu",
                gpu=dev.index,
                name=dev.name,
                uuid=dev.uuid,
                memory_total_bytes=dev.memory.total_bytes,
                mig_current=None if dev.mig is None else dev.mig.current,
                mig_pending=None if dev.mig is None else dev.mig.pending,
            )
        is_host = self._is_host_driver()
        return CheckResult.passed(
            {
                "IS_HOST_DRIVER": str(is_host).lower(),
                "NVIDIA_DRIVER_ROOT": "/" if is_host else str(self.driver_root),
                "DRIVER_VERSION": inventory.driver_version,
                "CUDA_DRIVER_VERSION": str(inventory.cuda_driver_version),
                "GPU_COUNT": str(len(inventory.devices)),
            }
        )
