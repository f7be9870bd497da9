"""Plain results of NVML queries, in base units (bytes, watts, celsius)."""

from __future__ import annotations

import enum
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CudaVersion:
    """The highest CUDA version the driver supports (NVML reports it as 1000*major + 10*minor)."""

    major: int
    minor: int

    @classmethod
    def from_nvml(cls, value: int) -> CudaVersion:
        return cls(value // 1000, (value % 1000) // 10)

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"


@dataclass(frozen=True, slots=True)
class MemoryInfo:
    total_bytes: int
    used_bytes: int


@dataclass(frozen=True, slots=True)
class MigMode:
    """MIG mode now and after the next GPU reset; they differ while a change is pending."""

    current: bool
    pending: bool


@dataclass(frozen=True, slots=True)
class Utilization:
    """Percent of the last sample period the GPU (or its memory) was busy, as NVML gives it."""

    gpu_percent: int
    memory_percent: int

    @property
    def gpu_ratio(self) -> float:
        return self.gpu_percent / 100.0

    @property
    def memory_ratio(self) -> float:
        return self.memory_percent / 100.0


@dataclass(frozen=True, slots=True)
class EccErrors:
    """ECC error counts: volatile since the last driver load, aggregate over the GPU's life."""

    volatile_corrected: int
    volatile_uncorrected: int
    aggregate_corrected: int
    aggregate_uncorrected: int


@dataclass(frozen=True, slots=True)
class RetiredPages:
    """Memory pages retired by older GPUs (pre-Ampere), by cause."""

    single_bit_ecc: int
    double_bit_ecc: int
    pending: bool


@dataclass(frozen=True, slots=True)
class RemappedRows:
    """Row remapping state of Ampere and later GPUs."""

    correctable: int
    uncorrectable: int
    pending: bool
    failure: bool


class ThrottleReason(enum.IntFlag):
    """Why clocks are held down; the bit values are NVML's ABI."""

    NONE = 0
    GPU_IDLE = 0x1
    APPLICATIONS_CLOCKS_SETTING = 0x2
    SW_POWER_CAP = 0x4
    HW_SLOWDOWN = 0x8
    SYNC_BOOST = 0x10
    SW_THERMAL_SLOWDOWN = 0x20
    HW_THERMAL_SLOWDOWN = 0x40
    HW_POWER_BRAKE_SLOWDOWN = 0x80
    DISPLAY_CLOCK_SETTING = 0x100


KNOWN_THROTTLE_REASONS: tuple[ThrottleReason, ...] = tuple(
    r for r in ThrottleReason if r is not ThrottleReason.NONE
)


@dataclass(frozen=True, slots=True)
class XidEvent:
    """A critical XID error the driver reported for one GPU."""

    gpu_index: int
    xid: int


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """What the driver check reports per GPU; ``mig`` is None where MIG is not supported."""

    index: int
    name: str
    uuid: str
    memory: MemoryInfo
    mig: MigMode | None


@dataclass(frozen=True, slots=True)
class Inventory:
    driver_version: str
    cuda_driver_version: CudaVersion
    devices: tuple[DeviceInfo, ...]
