"""NVML behind a small typed interface and the real binding (pynvml); the scriptable
fake is the development wing's (``gpuop.devcluster.nvml_fake``)."""

from gpuop.nodeagent.nvml.errors import (
    DriverNotLoaded,
    GpuLost,
    LibraryNotFound,
    NotSupported,
    NvmlError,
    Unknown,
)
from gpuop.nodeagent.nvml.interface import Nvml, XidEventSet
from gpuop.nodeagent.nvml.inventory import read_inventory
from gpuop.nodeagent.nvml.types import (
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
