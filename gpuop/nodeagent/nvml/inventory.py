"""One blocking read of what the driver check reports: versions and devices."""

from __future__ import annotations

import contextlib

from gpuop.nodeagent.nvml.errors import NotSupported, NvmlError
from gpuop.nodeagent.nvml.interface import Nvml
from gpuop.nodeagent.nvml.types import DeviceInfo, Inventory


def read_inventory(nvml: Nvml) -> Inventory:
    """Init NVML, read versions and devices, shut down again (so nothing stays open)."""
    nvml.init()
    try:
        devices = tuple(_device(nvml, i) for i in range(nvml.device_count()))
        return Inventory(nvml.driver_version(), nvml.cuda_driver_version(), devices)
    finally:
        with contextlib.suppress(NvmlError):
            nvml.shutdown()


def _device(nvml: Nvml, index: int) -> DeviceInfo:
    try:
        mig = nvml.device_mig_mode(index)
    except NotSupported:
        mig = None
    return DeviceInfo(
        index=index,
        name=nvml.device_name(index),
        uuid=nvml.device_uuid(index),
        memory=nvml.device_memory(index),
        mig=mig,
    )
