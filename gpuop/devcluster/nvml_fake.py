"""A scriptable in-memory NVML for tests and the local simulated cluster.

Tests build a node from GPU models, then script what the hardware does: toggle MIG,
lose a GPU after N calls or at once, inject XID events, uncorrectable ECC errors,
row-remap failures, pending resets and thermal slowdown (every fault the node agent's
health check knows), or fail ``init`` the way a missing library or an unloaded driver
does. Calls are thread-safe and record which
threads made them, so a test can prove NVML was called off the event loop.
"""

from __future__ import annotations

import queue
import threading
import uuid as uuidlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import TypeVar

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

T = TypeVar("T")
MiB = 1024 * 1024
DEFAULT_DRIVER_VERSION = "595.91.07"
DEFAULT_CUDA_VERSION = CudaVersion(13, 0)


@dataclass(frozen=True, slots=True)
class GpuModel:
    """What differs between GPU models as far as the node agent can tell."""

    name: str
    memory_total_bytes: int
    mig_capable: bool
    power_limit_watts: float
    row_remapping: bool  # Ampere and later remap rows; older GPUs retire pages


A100_SXM4_80GB = GpuModel("NVIDIA A100-SXM4-80GB", 81920 * MiB, True, 400.0, True)
H100_80GB_HBM3 = GpuModel("NVIDIA H100 80GB HBM3", 81559 * MiB, True, 700.0, True)
TESLA_T4 = GpuModel("Tesla T4", 15360 * MiB, False, 70.0, False)


@dataclass
class FakeGpu:
    """One scripted GPU; mutate its fields to change what the next read returns."""

    model: GpuModel
    uuid: str = ""
    temperature_celsius: float = 35.0
    power_usage_watts: float = 60.0
    memory_used_bytes: int = 0
    utilization: Utilization = field(default_factory=lambda: Utilization(0, 0))
    ecc: EccErrors = field(default_factory=lambda: EccErrors(0, 0, 0, 0))
    retired_pages: RetiredPages = field(default_factory=lambda: RetiredPages(0, 0, False))
    remapped_rows: RemappedRows = field(default_factory=lambda: RemappedRows(0, 0, False, False))
    throttle: ThrottleReason = ThrottleReason.GPU_IDLE
    mig: MigMode = field(default_factory=lambda: MigMode(False, False))
    lost: bool = False
    lose_after_calls: int | None = None
    calls: int = 0

    def __post_init__(self) -> None:
        if not self.uuid:
            self.uuid = f"GPU-{uuidlib.uuid4()}"


def make_gpus(*models: GpuModel, seed: str = "node") -> list[FakeGpu]:
    """GPUs with stable UUIDs derived from ``seed`` and their position."""
    return [
        FakeGpu(model, uuid=f"GPU-{uuidlib.uuid5(uuidlib.NAMESPACE_OID, f'{seed}/{i}')}")
        for i, model in enumerate(models)
    ]


class FakeNvml:
    """Implements :class:`gpuop.nodeagent.nvml.interface.Nvml` over scripted :class:`FakeGpu`
    objects."""

    def __init__(
        self,
        gpus: Iterable[FakeGpu] = (),
        *,
        driver_version: str = DEFAULT_DRIVER_VERSION,
        cuda_driver_version: CudaVersion = DEFAULT_CUDA_VERSION,
        init_error: NvmlError | None = None,
    ) -> None:
        self.gpus = list(gpus)
        self.driver = driver_version
        self.cuda = cuda_driver_version
        self.init_error = init_error
        self.init_calls = 0
        self.shutdown_calls = 0
        self.threads: set[int] = set()
        self._refcount = 0
        self._lock = threading.RLock()
        self._event_sets: list[FakeXidEventSet] = []

    @classmethod
    def library_not_found(cls) -> FakeNvml:
        return cls(init_error=LibraryNotFound("libnvidia-ml.so.1 not found under /fake"))

    @classmethod
    def driver_not_loaded(cls) -> FakeNvml:
        return cls(init_error=DriverNotLoaded("Driver Not Loaded"))

    # scripting ------------------------------------------------------------------------

    def lose_gpu(self, index: int, after_calls: int = 0) -> None:
        """The GPU answers ``after_calls`` more device calls, then raises GpuLost for good."""
        with self._lock:
            gpu = self.gpus[index]
            gpu.lose_after_calls = gpu.calls + after_calls
            if after_calls == 0:
                gpu.lost = True

    def set_mig(self, index: int, current: bool, pending: bool | None = None) -> None:
        with self._lock:
            self.gpus[index].mig = MigMode(current, current if pending is None else pending)

    def inject_xid(self, index: int, xid: int) -> None:
        """Deliver an XID event to every open event set."""
        with self._lock:
            for event_set in self._event_sets:
                event_set.push(XidEvent(gpu_index=index, xid=xid))

    def inject_ecc_uncorrectable(self, index: int, count: int = 1) -> None:
        """Uncorrectable (double-bit) ECC errors, as volatile and aggregate counts."""
        with self._lock:
            gpu = self.gpus[index]
            e = gpu.ecc
            gpu.ecc = EccErrors(
                e.volatile_corrected,
                e.volatile_uncorrected + count,
                e.aggregate_corrected,
                e.aggregate_uncorrected + count,
            )

    def fail_row_remap(self, index: int) -> None:
        """Row remapping failed (Ampere and later; older GPUs have no row remapper)."""
        with self._lock:
            rows = self.gpus[index].remapped_rows
            self.gpus[index].remapped_rows = replace(
                rows, uncorrectable=rows.uncorrectable + 1, failure=True
            )

    def require_reset(self, index: int) -> None:
        """A row remap (or, before Ampere, a page retirement) waits for a GPU reset."""
        with self._lock:
            gpu = self.gpus[index]
            if gpu.model.row_remapping:
                gpu.remapped_rows = replace(gpu.remapped_rows, pending=True)
            else:
                gpu.retired_pages = replace(gpu.retired_pages, pending=True)

    def thermal_slowdown(self, index: int, temperature_celsius: float = 92.0) -> None:
        """The GPU reached its slowdown temperature: hardware thermal slowdown is on."""
        with self._lock:
            gpu = self.gpus[index]
            gpu.temperature_celsius = temperature_celsius
            gpu.throttle = (gpu.throttle & ~ThrottleReason.GPU_IDLE) | (
                ThrottleReason.HW_THERMAL_SLOWDOWN
            )

    def heal(self, index: int) -> None:
        """Clear every injected fault of one GPU (as a reset and driver reload would)."""
        with self._lock:
            gpu = self.gpus[index]
            gpu.lost = False
            gpu.lose_after_calls = None
            gpu.ecc = EccErrors(0, 0, gpu.ecc.aggregate_corrected, gpu.ecc.aggregate_uncorrected)
            gpu.remapped_rows = RemappedRows(gpu.remapped_rows.correctable, 0, False, False)
            gpu.retired_pages = replace(gpu.retired_pages, pending=False)
            gpu.throttle = ThrottleReason.GPU_IDLE
            gpu.temperature_celsius = 35.0

    @property
    def initialized(self) -> bool:
        return self._refcount > 0

    # Nvml ---------------------------------------------------------------------------

    def _enter(self) -> None:
        self.threads.add(threading.get_ident())
        if self._refcount == 0:
            raise UnknownError("Uninitialized", 1)

    def init(self) -> None:
        with self._lock:
            self.threads.add(threading.get_ident())
            self.init_calls += 1
            if self.init_error is not None:
                raise self.init_error
            self._refcount += 1

    def shutdown(self) -> None:
        with self._lock:
            self._enter()
            self.shutdown_calls += 1
            self._refcount -= 1

    def driver_version(self) -> str:
        with self._lock:
            self._enter()
            return self.driver

    def cuda_driver_version(self) -> CudaVersion:
        with self._lock:
            self._enter()
            return self.cuda

    def device_count(self) -> int:
        with self._lock:
            self._enter()
            return len(self.gpus)

    def _device(self, index: int, read: Callable[[FakeGpu], T]) -> T:
        with self._lock:
            self._enter()
            if not 0 <= index < len(self.gpus):
                raise UnknownError(f"Invalid Argument: no GPU {index}", 2)
            gpu = self.gpus[index]
            gpu.calls += 1
            if gpu.lose_after_calls is not None and gpu.calls > gpu.lose_after_calls:
                gpu.lost = True
            if gpu.lost:
                raise GpuLost("GPU is lost", 15)
            return read(gpu)

    def device_name(self, index: int) -> str:
        return self._device(index, lambda g: g.model.name)

    def device_uuid(self, index: int) -> str:
        return self._device(index, lambda g: g.uuid)

    def device_memory(self, index: int) -> MemoryInfo:
        return self._device(
            index, lambda g: MemoryInfo(g.model.memory_total_bytes, g.memory_used_bytes)
        )

    def device_mig_mode(self, index: int) -> MigMode:
        def read(g: FakeGpu) -> MigMode:
            if not g.model.mig_capable:
                raise NotSupported("Not Supported", 3)
            return replace(g.mig)

        return self._device(index, read)

    def device_temperature_celsius(self, index: int) -> float:
        return self._device(index, lambda g: g.temperature_celsius)

    def device_power_usage_watts(self, index: int) -> float:
        return self._device(index, lambda g: g.power_usage_watts)

    def device_power_limit_watts(self, index: int) -> float:
        return self._device(index, lambda g: g.model.power_limit_watts)

    def device_utilization(self, index: int) -> Utilization:
        return self._device(index, lambda g: g.utilization)

    def device_ecc_errors(self, index: int) -> EccErrors:
        return self._device(index, lambda g: g.ecc)

    def device_retired_pages(self, index: int) -> RetiredPages:
        def read(g: FakeGpu) -> RetiredPages:
            if g.model.row_remapping:
                raise NotSupported("Not Supported", 3)
            return g.retired_pages

        return self._device(index, read)

    def device_remapped_rows(self, index: int) -> RemappedRows:
        def read(g: FakeGpu) -> RemappedRows:
            if not g.model.row_remapping:
                raise NotSupported("Not Supported", 3)
            return g.remapped_rows

        return self._device(index, read)

    def device_throttle_reasons(self, index: int) -> ThrottleReason:
        return self._device(index, lambda g: g.throttle)

    def xid_events(self) -> FakeXidEventSet:
        with self._lock:
            self._enter()
            event_set = FakeXidEventSet(self)
            self._event_sets.append(event_set)
            return event_set

    def _forget(self, event_set: FakeXidEventSet) -> None:
        with self._lock:
            if event_set in self._event_sets:
                self._event_sets.remove(event_set)


class FakeXidEventSet:
    """Events pushed by :meth:`FakeNvml.inject_xid`, handed out by ``wait``."""

    def __init__(self, owner: FakeNvml) -> None:
        self._owner = owner
        self._queue: queue.Queue[XidEvent] = queue.Queue()
        self.closed = False

    def push(self, event: XidEvent) -> None:
        self._queue.put(event)

    def wait(self, timeout_ms: int) -> XidEvent | None:
        self._owner.threads.add(threading.get_ident())
        if self.closed:
            raise UnknownError("event set closed")
        try:
            return self._queue.get(timeout=timeout_ms / 1000.0)
        except queue.Empty:
            return None

    def close(self) -> None:
        self.closed = True
        self._owner._forget(self)
