"""NVML through ``pynvml`` (the ``nvidia-ml-py`` distribution), loaded from a driver root.

The driver may be installed on the host (root ``/``, or the host mounted at ``/host``) or
run in the driver container, which exposes its root at ``/run/nvidia/driver``. pynvml only
knows how to ``dlopen`` the bare soname, so the library is loaded here from the root's
library directories first and handed to pynvml.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pynvml

from gpuop.nodeagent.nvml.errors import (
    DriverNotLoaded,
    GpuLost,
    LibraryNotFound,
    NotSupported,
    NvmlError,
)
from gpuop.nodeagent.nvml.errors import Unknown as UnknownError
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

LIBRARY_SONAME = "libnvidia-ml.so.1"
LIBRARY_DIRS = (
    "usr/lib64",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "usr/lib",
    "lib64",
    "lib/x86_64-linux-gnu",
    "lib/aarch64-linux-gnu",
    "lib",
)

T = TypeVar("T")

# pynvml error class -> ours. Looked up by isinstance so subclasses added later still map.
_ERROR_CLASSES: tuple[tuple[str, type[NvmlError]], ...] = (
    ("NVMLError_LibraryNotFound", LibraryNotFound),
    ("NVMLError_DriverNotLoaded", DriverNotLoaded),
    ("NVMLError_GpuIsLost", GpuLost),
    ("NVMLError_ResetRequired", GpuLost),
    ("NVMLError_NotSupported", NotSupported),
    ("NVMLError_FunctionNotFound", NotSupported),
)


def translate_error(exc: BaseException) -> NvmlError:
    """Map a pynvml exception to our typed error (``Unknown`` when nothing closer fits)."""
    if isinstance(exc, NvmlError):
        return exc
    code: int | None = getattr(exc, "value", None)
    for class_name, ours in _ERROR_CLASSES:
        theirs = getattr(pynvml, class_name, None)
        if theirs is not None and isinstance(exc, theirs):
            return ours(str(exc), code)
    if isinstance(exc, pynvml.NVMLLibraryMismatchError):
        return NotSupported(str(exc))
    return UnknownError(str(exc), code)


@contextmanager
def _translated() -> Iterator[None]:
    try:
        yield
    except (pynvml.NVMLError, pynvml.NVMLLibraryMismatchError) as exc:
        raise translate_error(exc) from exc


def library_candidates(driver_root: Path) -> list[Path]:
    """Where ``libnvidia-ml.so.1`` may live under a driver root, most likely first."""
    return [driver_root / d / LIBRARY_SONAME for d in LIBRARY_DIRS]


def load_library(driver_root: Path) -> None:
    """Load NVML from ``driver_root`` into pynvml unless some library is loaded already.

    With root ``/`` a miss falls back to the dynamic loader's own search path.
    """
    with pynvml.libLoadLock:
        if pynvml.nvmlLib is not None:
            return
        tried: list[str] = []
        for path in library_candidates(driver_root):
            try:
                if not path.exists():
                    continue
                pynvml.nvmlLib = ctypes.CDLL(str(path))
                return
            except OSError as exc:
                tried.append(f"{path}: {exc}")
        if driver_root == Path("/"):
            try:
                pynvml.nvmlLib = ctypes.CDLL(LIBRARY_SONAME)
                return
            except OSError as exc:
                tried.append(f"{LIBRARY_SONAME}: {exc}")
    detail = "; ".join(tried) if tried else "no candidate exists"
    raise LibraryNotFound(f"{LIBRARY_SONAME} not found under {driver_root} ({detail})")


class PynvmlNvml:
    """The real NVML. Thread-safe as far as NVML itself is."""

    def __init__(self, driver_root: Path = Path("/")) -> None:
        self.driver_root = driver_root
        self._handles: dict[int, Any] = {}
        self._lock = threading.Lock()

    def init(self) -> None:
        load_library(self.driver_root)
        with _translated():
            pynvml.nvmlInit()

    def shutdown(self) -> None:
        with self._lock:
            self._handles.clear()
        with _translated():
            pynvml.nvmlShutdown()

    def driver_version(self) -> str:
        with _translated():
            return str(pynvml.nvmlSystemGetDriverVersion())

    def cuda_driver_version(self) -> CudaVersion:
        with _translated():
            try:
                value = pynvml.nvmlSystemGetCudaDriverVersion_v2()
            except pynvml.NVMLError_FunctionNotFound:
                value = pynvml.nvmlSystemGetCudaDriverVersion()
        return CudaVersion.from_nvml(int(value))

    def device_count(self) -> int:
        with _translated():
            return int(pynvml.nvmlDeviceGetCount())

    def _handle(self, index: int) -> Any:
        with self._lock:
            handle = self._handles.get(index)
        if handle is None:
            with _translated():
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            with self._lock:
                self._handles[index] = handle
        return handle

    def _call(self, index: int, fn: Callable[[Any], T]) -> T:
        handle = self._handle(index)
        with _translated():
            return fn(handle)

    def device_name(self, index: int) -> str:
        return self._call(index, lambda h: str(pynvml.nvmlDeviceGetName(h)))

    def device_uuid(self, index: int) -> str:
        return self._call(index, lambda h: str(pynvml.nvmlDeviceGetUUID(h)))

    def device_memory(self, index: int) -> MemoryInfo:
        mem = self._call(index, pynvml.nvmlDeviceGetMemoryInfo)
        return MemoryInfo(total_bytes=int(mem.total), used_bytes=int(mem.used))

    def device_mig_mode(self, index: int) -> MigMode:
        current, pending = self._call(index, pynvml.nvmlDeviceGetMigMode)
        enabled = pynvml.NVML_DEVICE_MIG_ENABLE
        return MigMode(current=current == enabled, pending=pending == enabled)

    def device_temperature_celsius(self, index: int) -> float:
        return float(
            self._call(
                index, lambda h: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
            )
        )

    def device_power_usage_watts(self, index: int) -> float:
        return int(self._call(index, pynvml.nvmlDeviceGetPowerUsage)) / 1000.0

    def device_power_limit_watts(self, index: int) -> float:
        return int(self._call(index, pynvml.nvmlDeviceGetEnforcedPowerLimit)) / 1000.0

    def device_utilization(self, index: int) -> Utilization:
        rates = self._call(index, pynvml.nvmlDeviceGetUtilizationRates)
        return Utilization(gpu_percent=int(rates.gpu), memory_percent=int(rates.memory))

    def device_ecc_errors(self, index: int) -> EccErrors:
        def count(h: Any, error_type: int, counter: int) -> int:
            return int(pynvml.nvmlDeviceGetTotalEccErrors(h, error_type, counter))

        corrected = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
        uncorrected = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        volatile, aggregate = pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC
        return self._call(
            index,
            lambda h: EccErrors(
                volatile_corrected=count(h, corrected, volatile),
                volatile_uncorrected=count(h, uncorrected, volatile),
                aggregate_corrected=count(h, corrected, aggregate),
                aggregate_uncorrected=count(h, uncorrected, aggregate),
            ),
        )

    def device_retired_pages(self, index: int) -> RetiredPages:
        def read(h: Any) -> RetiredPages:
            single = pynvml.nvmlDeviceGetRetiredPages(
                h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
            )
            double = pynvml.nvmlDeviceGetRetiredPages(
                h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
            )
            pending = pynvml.nvmlDeviceGetRetiredPagesPendingStatus(h)
            return RetiredPages(
                single_bit_ecc=len(single),
                double_bit_ecc=len(double),
                pending=pending == pynvml.NVML_FEATURE_ENABLED,
            )

        return self._call(index, read)

    def device_remapped_rows(self, index: int) -> RemappedRows:
        corr, unc, pending, failure = self._call(index, pynvml.nvmlDeviceGetRemappedRows)
        return RemappedRows(
            correctable=int(corr),
            uncorrectable=int(unc),
            pending=bool(pending),
            failure=bool(failure),
        )

    def device_throttle_reasons(self, index: int) -> ThrottleReason:
        def read(h: Any) -> int:
            try:
                return int(pynvml.nvmlDeviceGetCurrentClocksEventReasons(h))
            except pynvml.NVMLError_FunctionNotFound:
                return int(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h))

        # Keep only the bits we name; newer drivers add reasons we do not export yet.
        known = 0
        for reason in ThrottleReason:
            known |= reason.value
        return ThrottleReason(self._call(index, read) & known)

    def xid_events(self) -> PynvmlXidEventSet:
        with _translated():
            event_set = pynvml.nvmlEventSetCreate()
        registered = 0
        try:
            for index in range(self.device_count()):
                try:
                    supported = self._call(index, pynvml.nvmlDeviceGetSupportedEventTypes)
                    if not int(supported) & pynvml.nvmlEventTypeXidCriticalError:
                        continue
                    self._call(
                        index,
                        lambda h: pynvml.nvmlDeviceRegisterEvents(
                            h, pynvml.nvmlEventTypeXidCriticalError, event_set
                        ),
                    )
                    registered += 1
                except NotSupported:
                    continue
        except NvmlError:
            with _translated():
                pynvml.nvmlEventSetFree(event_set)
            raise
        if registered == 0:
            with _translated():
                pynvml.nvmlEventSetFree(event_set)
            raise NotSupported("no GPU supports XID events")
        return PynvmlXidEventSet(event_set)


class PynvmlXidEventSet:
    """An NVML event set registered for XID critical errors."""

    def __init__(self, event_set: Any) -> None:
        self._set = event_set

    def wait(self, timeout_ms: int) -> XidEvent | None:
        with _translated():
            try:
                data = pynvml.nvmlEventSetWait_v2(self._set, timeout_ms)
            except pynvml.NVMLError_Timeout:
                return None
            if not int(data.eventType) & pynvml.nvmlEventTypeXidCriticalError:
                return None
            index = int(pynvml.nvmlDeviceGetIndex(data.device))
        return XidEvent(gpu_index=index, xid=int(data.eventData))

    def close(self) -> None:
        if self._set is None:
            return
        event_set, self._set = self._set, None
        with _translated():
            pynvml.nvmlEventSetFree(event_set)
