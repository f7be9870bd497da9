"""NVML behind a small typed interface: the real binding (pynvml) and a scriptable fake."""

from gpuop.nvml.errors import (
    DriverNotLoaded,
    GpuLost,
    LibraryNotFound,
    NotSupported,
    NvmlError,
    Unknown,
)
from gpuop.nvml.interface import Nvml, XidEventSet
from gpuop.nvml.inventory import read_inventory
from gpuop.nvml.types import (
    KNOWN_THROTTLE_REASONS,
    CudaVersion,
    DeviceInfo,
    EccErrors,
    Inventory,
    MemoryInfo,
    MigMode,
    RemappedRows,
    RetiredPages,
    ThrottleReason,
    Utilization,
    XidEvent,
)

__all__ = [
    "KNOWN_THROTTLE_REASONS",
    "CudaVersion",
    "DeviceInfo",
    "DriverNotLoaded",
    "EccErrors",
    "GpuLost",
    "Inventory",
    "LibraryNotFound",
    "MemoryInfo",
    "MigMode",
    "NotSupported",
    "Nvml",
    "NvmlError",
    "RemappedRows",
    "RetiredPages",
    "ThrottleReason",
    "Unknown",
    "Utilization",
    "XidEvent",
    "XidEventSet",
    "read_inventory",
]
