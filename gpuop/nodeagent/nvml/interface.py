"""The NVML calls the node agent needs, as a Protocol both the real binding and the fake meet.

Every method blocks (the real one calls into the driver): async callers must use
``asyncio.to_thread``. Devices are addressed by index, as NVML enumerates them.
"""

from __future__ import annotations

from typing import Protocol

from gpuop.nodeagent.nvml.types import (
    CudaVersion,
    EccErrors,
    MemoryInfo,
    MigMode,
    RemappedRows,
    RetiredPages,
    ThrottleReason,
    Utilization,
    XidEvent,
)


class XidEventSet(Protocol):
    """XID events of every GPU that supports them."""

    def wait(self, timeout_ms: int) -> XidEvent | None:
        """The next XID event, or None when none came within the timeout."""
        ...

    def close(self) -> None: ...


class Nvml(Protocol):
    """Reference-counted like NVML itself: each ``init`` needs its ``shutdown``."""

    def init(self) -> None: ...

    def shutdown(self) -> None: ...

    def driver_version(self) -> str: ...

    def cuda_driver_version(self) -> CudaVersion: ...

    def device_count(self) -> int: ...

    def device_name(self, index: int) -> str: ...

    def device_uuid(self, index: int) -> str: ...

    def device_memory(self, index: int) -> MemoryInfo: ...

    def device_mig_mode(self, index: int) -> MigMode: ...

    def device_temperature_celsius(self, index: int) -> float: ...

    def device_power_usage_watts(self, index: int) -> float: ...

    def device_power_limit_watts(self, index: int) -> float: ...

    def device_utilization(self, index: int) -> Utilization: ...

    def device_ecc_errors(self, index: int) -> EccErrors: ...

    def device_retired_pages(self, index: int) -> RetiredPages: ...

    def device_remapped_rows(self, index: int) -> RemappedRows: ...

    def device_throttle_reasons(self, index: int) -> ThrottleReason: ...

    def xid_events(self) -> XidEventSet:
        """Register every GPU that supports XID events in a new event set."""
        ...
