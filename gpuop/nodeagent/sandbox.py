"""``gpuop node-agent validate-sandbox``: the sandbox validator's checks of a VM host.

One component per run (`COMPONENT`, as upstream's validator reads it), each an init
container of `nvidia-sandbox-validator`:

- ``vfio-pci``: on a vm-passthrough node, every NVIDIA GPU is bound to vfio-pci
  (`vfio-pci-ready`); only then may a device plugin hand GPUs to VMs.
- ``vgpu-manager``: on a vm-vgpu node, the vGPU host driver answers ``nvidia-smi`` (ours
  in /run/nvidia/driver, or one installed on the host) and its parent devices are there
  (`vgpu-manager-ready`, or `host-vgpu-manager-ready` for a host driver).
- ``vgpu-devices``: on a vm-vgpu node, vGPU devices exist (`vgpu-devices-ready`).
- ``cc-manager``: on a CC-capable node, the CC manager has applied the mode
  (`cc-manager-ready`, written on other nodes at once).

The workload checks first record the node's workload in `workload-type` (its
`nvidia.com/gpu.workload.config` label, else the policy's default) and pass at once
where it is another workload. With `WITH_WAIT` a check retries until it passes; the
status files are written only then, so what waits on them never starts early.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from components.keys import (
    VM_PASSTHROUGH_WORKLOAD,
    VM_VGPU_WORKLOAD,
    WORKLOAD_CONFIG_LABEL,
    WORKLOADS,
)
from gpuop.log import get_logger
from gpuop.nodeagent.driver_root import resolve_in_root

log = get_logger(__name__)

COMPONENTS = ("cc-manager", "vfio-pci", "vgpu-manager", "vgpu-devices")
VFIO_DRIVERS = frozenset({"vfio-pci", "nvgrace_gpu_vfio_pci"})
"""The drivers a GPU handed to a VM is bound to (Grace Hopper systems have their own)."""
NVIDIA_VENDOR = "0x10de"
GPU_CLASS_PREFIX = "0x03"
"""PCI display controllers (VGA 0x0300, 3D 0x0302): the GPUs among NVIDIA's functions."""
CC_CAPABLE_LABEL = "nvidia.com/cc.capable"
CC_MANAGER_CTR_READY = ".cc-manager-ctr-ready"
WORKLOAD_TYPE_FILE = "workload-type"
HOST_NVIDIA_SMI = ("usr/bin/nvidia-smi", "usr/sbin/nvidia-smi", "bin/nvidia-smi")
RETRY_SECONDS = 5.0


@dataclass(frozen=True)
class Outcome:
    """One attempt: passed (and which status file to write), or why not yet."""

    ready_file: str | None
    """The file to write once passed (None: nothing to write, e.g. another workload)."""
    passed: bool = True
    reason: str = ""


def node_workload(labels: Mapping[str, str], default: str) -> str:
    """The node's workload as the operator reads it: its label when valid, else the
    policy's default (`DEFAULT_GPU_WORKLOAD_CONFIG`), else `container`."""
    value = labels.get(WORKLOAD_CONFIG_LABEL)
    if value in WORKLOADS:
        return str(value)
    return default if default in WORKLOADS else WORKLOADS[0]


def _pci_gpus(sysfs: Path) -> list[Path]:
    devices = sysfs / "bus" / "pci" / "devices"
    found = []
    for device in sorted(devices.iterdir()) if devices.is_dir() else ():
        with contextlib.suppress(OSError):
            vendor = (device / "vendor").read_text().strip().lower()
            klass = (device / "class").read_text().strip().lower()
            if vendor == NVIDIA_VENDOR and klass.startswith(GPU_CLASS_PREFIX):
                found.append(device)
    return found


def _driver(device: Path) -> str:
    link = device / "driver"
    return os.path.basename(os.readlink(link)) if link.is_symlink() else ""


def vfio_check(sysfs: Path) -> Outcome:
    """Every NVIDIA GPU on the PCI bus is bound to a VFIO driver."""
    for device in _pci_gpus(sysfs):
        driver = _driver(device)
        if driver not in VFIO_DRIVERS:
            reason = f"GPU {device.name} is bound to {driver or 'no driver'!r}, not vfio-pci"
            return Outcome("vfio-pci-ready", passed=False, reason=reason)
    return Outcome("vfio-pci-ready")


def _read_int(path: Path) -> int:
    try:
        return int(path.read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


def vgpu_parents_ready(sysfs: Path) -> bool:
    """The vGPU host driver's devices to split are there: with SR-IOV (Ampere and
    later) every virtual function of every GPU enabled, else mdev parent devices."""
    gpus = _pci_gpus(sysfs)
    total = sum(_read_int(g / "sriov_totalvfs") for g in gpus)
    enabled = sum(_read_int(g / "sriov_numvfs") for g in gpus)
    if enabled > 0:
        return enabled == total
    parents = sysfs / "class" / "mdev_bus"
    return parents.is_dir() and any(parents.iterdir())


def vgpu_device_count(sysfs: Path) -> int:
    devices = sysfs / "bus" / "mdev" / "devices"
    return sum(1 for _ in devices.iterdir()) if devices.is_dir() else 0


def host_nvidia_smi(host_root: Path) -> str | None:
    """The host's own nvidia-smi (a vGPU manager installed on the host), as a path
    inside the host root; None when the host has none. Links are followed under the
    host root (`resolve_in_root`): an absolute link is the host's, and followed in this
    container it would miss the host's binary."""
    for relative in HOST_NVIDIA_SMI:
        with contextlib.suppress(OSError):
            found = resolve_in_root(host_root, f"/{relative}")
            if found is not None and found.is_file():
                return f"/{relative}"
    return None


def _runs(command: list[str]) -> bool:
    try:
        result = subprocess.run(command, capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


def vgpu_manager_check(
    sysfs: Path,
    host_root: Path,
    driver_root: Path,
    runs: Callable[[list[str]], bool] = _runs,
) -> Outcome:
    """The vGPU host driver answers and its parent devices exist."""
    host_smi = host_nvidia_smi(host_root)
    if host_smi is not None:
        ready, command = "host-vgpu-manager-ready", ["chroot", str(host_root), host_smi]
    else:
        ready, command = "vgpu-manager-ready", ["chroot", str(driver_root), "nvidia-smi"]
    if not runs(command):
        return Outcome(ready, passed=False, reason="the vGPU manager does not answer nvidia-smi")
    if not vgpu_parents_ready(sysfs):
        return Outcome(ready, passed=False, reason="vGPU parent devices are not ready")
    return Outcome(ready)


def vgpu_devices_check(sysfs: Path) -> Outcome:
    if vgpu_device_count(sysfs) == 0:
        return Outcome("vgpu-devices-ready", passed=False, reason="no vGPU devices")
    return Outcome("vgpu-devices-ready")


def cc_manager_check(labels: Mapping[str, str], validations: Path) -> Outcome:
    """On a CC-capable node the CC manager must have marked itself ready."""
    capable = labels.get(CC_CAPABLE_LABEL) == "true"
    if capable and not (validations / CC_MANAGER_CTR_READY).is_file():
        return Outcome("cc-manager-ready", passed=False, reason="the CC manager is not ready")
    return Outcome("cc-manager-ready")


_WORKLOAD_OF = {
    "vfio-pci": VM_PASSTHROUGH_WORKLOAD,
    "vgpu-manager": VM_VGPU_WORKLOAD,
    "vgpu-devices": VM_VGPU_WORKLOAD,
}
"""The workload each workload check applies to."""


@dataclass(frozen=True)
class SandboxPaths:
    validations: Path
    sysfs: Path = Path("/sys")
    host_root: Path = Path("/host")
    driver_root: Path = Path("/run/nvidia/driver")


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def attempt(
    component: str,
    labels: Mapping[str, str],
    default_workload: str,
    paths: SandboxPaths,
    runs: Callable[[list[str]], bool] = _runs,
) -> Outcome:
    """One try of `component` on a node with `labels`; records the node's workload for
    the workload checks (what the device plugins' waits read)."""
    if component == "cc-manager":
        return cc_manager_check(labels, paths.validations)
    workload = node_workload(labels, default_workload)
    _write(paths.validations / WORKLOAD_TYPE_FILE, f"{workload}\n")
    if workload != _WORKLOAD_OF[component]:
        return Outcome(None)
    if component == "vfio-pci":
        return vfio_check(paths.sysfs)
    if component == "vgpu-manager":
        return vgpu_manager_check(paths.sysfs, paths.host_root, paths.driver_root, runs)
    return vgpu_devices_check(paths.sysfs)


_STALE = {
    "vfio-pci": ("vfio-pci-ready",),
    "vgpu-manager": ("vgpu-manager-ready", "host-vgpu-manager-ready"),
    "vgpu-devices": ("vgpu-devices-ready",),
    "cc-manager": ("cc-manager-ready",),
}
"""What a check removes before it starts: a file from an earlier run of the node (its
previous workload) must not let anything start before this run passes."""


async def validate_sandbox(
    component: str,
    node_labels: Callable[[], Awaitable[Mapping[str, str]]],
    default_workload: str,
    paths: SandboxPaths,
    *,
    wait: bool,
    retry_s: float = RETRY_SECONDS,
    runs: Callable[[list[str]], bool] = _runs,
) -> bool:
    """Run `component`'s check (again every `retry_s` while `wait`), writing its status
    file once it passes; whether it passed."""
    for name in _STALE[component]:
        (paths.validations / name).unlink(missing_ok=True)
    while True:
        outcome = attempt(component, await node_labels(), default_workload, paths, runs)
        if outcome.passed:
            if outcome.ready_file is not None:
                _write(paths.validations / outcome.ready_file, "")
            log.info("sandbox validation passed", component=component)
            return True
        log.info("sandbox validation waiting", component=component, reason=outcome.reason)
        if not wait:
            return False
        await asyncio.sleep(retry_s)
