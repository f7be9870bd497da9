"""The driver check: find the driver as upstream's validator does, see NVML work there,
link /dev/char, and write ``driver-ready`` with upstream's keys and values.

A driver on the host wins. Otherwise, where the policy runs a driver container, that
container must have said it is done (``.driver-ctr-ready``, which also names the
GPUDirect modules it loads: each must be loaded, and gets its own ``*-ready`` file).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpuop.log import get_logger
from gpuop.nodeagent.checks import CheckResult
from gpuop.nodeagent.devchar import DevCharError, DevCharLinker
from gpuop.nodeagent.driver_root import (
    DEFAULT_DRIVER_INSTALL_DIR,
    DriverInfo,
    container_driver,
    host_driver,
    host_nvidia_smi,
    is_wsl,
)
from gpuop.nodeagent.nvml import (
    DriverNotLoaded,
    GpuLost,
    LibraryNotFound,
    Nvml,
    NvmlError,
    read_inventory,
)
from gpuop.nodeagent.status import DEFAULT_VALIDATIONS_DIR

log = get_logger(__name__)

CONTAINER_DRIVER_ROOT = Path(DEFAULT_DRIVER_INSTALL_DIR)
DRIVER_CTR_READY = ".driver-ctr-ready"
#: Flags in ``.driver-ctr-ready``: (status file, kernel module, module name anywhere in
#: the line rather than at its start). Upstream matches nvidia_fs loosely.
GPUDIRECT_FLAGS = {
    "GDRCOPY_ENABLED": ("gdrcopy", "gdrdrv", False),
    "GDS_ENABLED": ("nvidia-fs", "nvidia_fs", True),
    "GPU_DIRECT_RDMA_ENABLED": ("nvidia-peermem", "nvidia_peermem", False),
}
_DEV_CHAR_HINT = (
    "; containers may lose their GPUs after systemctl daemon-reload (NVIDIA/gpu-operator#430);"
    " to skip the links set DISABLE_DEV_CHAR_SYMLINK_CREATION=true in validator.driver.env"
)


def nvml_failure(exc: NvmlError) -> str:
    """One line saying what an NVML failure means for the node."""
    if isinstance(exc, LibraryNotFound):
        return f"NVML library not found: {exc}"
    if isinstance(exc, DriverNotLoaded):
        return f"NVIDIA driver not loaded: {exc}"
    if isinstance(exc, GpuLost):
        return f"GPU lost (fell off the bus or needs a reset): {exc}"
    return f"NVML error ({type(exc).__name__}): {exc}"


@dataclass(frozen=True, slots=True)
class DriverLayout:
    """Where things are. ``*_here``: paths in this container; the others: host paths."""

    host_root_here: Path = Path("/host")
    driver_root_here: Path = CONTAINER_DRIVER_ROOT
    validations_here: Path = DEFAULT_VALIDATIONS_DIR
    proc_modules_here: Path = Path("/proc/modules")
    host_rootfs: str = "/"
    driver_install_dir: str = DEFAULT_DRIVER_INSTALL_DIR


def parse_flags(text: str) -> dict[str, bool]:
    """``.driver-ctr-ready``: ``KEY: true|false`` lines."""
    out: dict[str, bool] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip().lower() == "true"
    return out


def module_loaded(modules: str, module: str, *, anywhere: bool) -> bool:
    lines = modules.splitlines()
    if anywhere:
        return any(module in line for line in lines)
    return any(line.split(" ", 1)[0] == module for line in lines)


class DriverCheck:
    name = "driver"
    recheck = True

    def __init__(
        self,
        nvml_for: Callable[[Path], Nvml],
        layout: DriverLayout | None = None,
        *,
        driver_container: bool = False,
        dev_char: DevCharLinker | None = None,
    ) -> None:
        """``nvml_for``: NVML loaded from a driver root (as seen here). ``driver_container``:
        the policy runs a driver DaemonSet, whose ``.driver-ctr-ready`` to wait for.
        ``dev_char``: None where the links are not wanted."""
        self.nvml_for = nvml_for
        self.layout = layout or DriverLayout()
        self.driver_container = driver_container
        self.dev_char = dev_char
        self._nvml: dict[Path, Nvml] = {}

    def _nvml_at(self, root: Path) -> Nvml:
        if root not in self._nvml:
            self._nvml[root] = self.nvml_for(root)
        return self._nvml[root]

    def _gpudirect(self) -> CheckResult:
        """The GPUDirect modules the driver container enabled, each loaded."""
        ready = self.layout.validations_here / DRIVER_CTR_READY
        try:
            flags = parse_flags(ready.read_text())
            modules = self.layout.proc_modules_here.read_text()
        except OSError as exc:
            return CheckResult.failed(f"cannot read {exc.filename}: {exc.strerror or exc}")
        companions: list[str] = []
        for flag, (status, module, anywhere) in GPUDIRECT_FLAGS.items():
            if not flags.get(flag):
                continue
            if not module_loaded(modules, module, anywhere=anywhere):
                return CheckResult.failed(f"{flag} is set but kernel module {module} is not loaded")
            companions.append(status)
        return CheckResult.passed(companions=tuple(companions))

    def _locate(self) -> tuple[DriverInfo, Path] | CheckResult:
        layout = self.layout
        if is_wsl(layout.host_root_here) or host_nvidia_smi(layout.host_root_here):
            return host_driver(layout.host_rootfs), layout.host_root_here
        ready = layout.validations_here / DRIVER_CTR_READY
        if self.driver_container and not ready.is_file():
            return CheckResult.failed(
                f"no driver on the host and the driver container is not ready ({ready} missing)"
            )
        info = container_driver(
            layout.host_rootfs, layout.driver_install_dir, layout.driver_root_here
        )
        return info, layout.driver_root_here

    def _run(self) -> CheckResult:
        located = self._locate()
        if isinstance(located, CheckResult):
            return located
        info, root = located
        try:
            inventory = read_inventory(self._nvml_at(root))
        except NvmlError as exc:
            return CheckResult.failed(nvml_failure(exc))
        if not inventory.devices:
            return CheckResult.failed("NVML initialised but sees no GPU")
        gpudirect = CheckResult.passed()
        if self.driver_container and not info.is_host_driver:
            gpudirect = self._gpudirect()
            if not gpudirect.ok:
                return gpudirect
        if self.dev_char is not None and not is_wsl(self.layout.host_root_here):
            try:
                self.dev_char.link(info, root)
            except (DevCharError, OSError) as exc:
                return CheckResult.failed(f"cannot link /dev/char: {exc}{_DEV_CHAR_HINT}")
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
        facts = {
            "DRIVER_VERSION": inventory.driver_version,
            "CUDA_DRIVER_VERSION": str(inventory.cuda_driver_version),
            "GPU_COUNT": str(len(inventory.devices)),
            "NVML_ROOT": str(root),
        }
        return CheckResult.passed(info.fields(), gpudirect.companions, facts)

    async def run(self) -> CheckResult:
        return await asyncio.to_thread(self._run)
