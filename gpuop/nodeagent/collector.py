"""A Prometheus collector that reads NVML at scrape time.

Every scrape initialises NVML, reads, and shuts it down again, so between scrapes the
exporter holds no device open that could stand in the way of a driver reload. A
failure of any kind becomes a metric (``gpu_operator_node_nvml_up 0``,
``gpu_operator_node_gpu_up 0``, ``gpu_operator_node_validations_readable 0``), never an
exception out of ``collect``. Names follow upstream's node-status-exporter
(``gpu_operator_node_*``); per-GPU health it does not export is ``gpu_operator_node_gpu_*``.
``collect`` blocks; the HTTP handler calls it in a thread.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuop.log import get_logger
from gpuop.nodeagent.devices import DevicePluginDevices
from gpuop.nodeagent.nvml import (
    KNOWN_THROTTLE_REASONS,
    DriverNotLoaded,
    GpuLost,
    LibraryNotFound,
    NotSupported,
    Nvml,
    NvmlError,
)
from gpuop.nodeagent.status import CHECK_NAMES, StatusFiles
from gpuop.nodeagent.xid import XidCounts, XidWatcher

log = get_logger(__name__)
T = TypeVar("T")

NODE_LABELS = ["node"]
GPU_LABELS = ["node", "gpu", "uuid", "model_name"]
Family = GaugeMetricFamily | CounterMetricFamily


def error_kind(exc: NvmlError) -> str:
    """A stable label value for what went wrong."""
    if isinstance(exc, LibraryNotFound):
        return "library_not_found"
    if isinstance(exc, DriverNotLoaded):
        return "driver_not_loaded"
    if isinstance(exc, GpuLost):
        return "gpu_lost"
    if isinstance(exc, NotSupported):
        return "not_supported"
    return "unknown"


#: Node-level families, labelled by node: key -> (name after `gpu_operator_`, help,
#: further labels).
NODE_FAMILIES: dict[str, tuple[str, ...]] = {
    "metrics_ready": (
        "node_metrics_ready_ts_seconds",
        "When this exporter started (Unix seconds).",
    ),
    "driver_validation": (
        "node_driver_validation",
        "1 when the driver answered (NVML initialised) at this scrape, 0 otherwise.",
    ),
    "driver_validation_last_success": (
        "node_driver_validation_last_success_ts_seconds",
        "When the driver last answered (Unix seconds).",
    ),
    "plugin_devices": (
        "node_device_plugin_devices_total",
        "GPU devices the device plugin advertises in the node's capacity; -1 when the"
        " node cannot be read.",
    ),
    "plugin_last_success": (
        "node_device_plugin_validation_last_success_ts_seconds",
        "When GPU devices were last found in the node's capacity (Unix seconds).",
    ),
    "pci_devices": (
        "nvidia_pci_devices_total",
        "NVIDIA devices on the node's PCI bus; -1 when it cannot be read.",
    ),
    "validations_readable": (
        "node_validations_readable",
        "0 when the validations directory cannot be read.",
    ),
    "nvml_up": ("node_nvml_up", "1 when NVML initialised and answered."),
    "nvml_failure": (
        "node_nvml_failure_info",
        "Why NVML is down (present only while it is).",
        "reason",
    ),
    "driver_info": (
        "node_driver_info",
        "The driver's version and the highest CUDA version it supports.",
        "driver_version",
        "cuda_driver_version",
    ),
    "gpu_count": ("node_gpu_count", "GPUs NVML enumerates."),
    "xid_watching": ("node_xid_events_watching", "1 while XID events are being received."),
}
#: Per-GPU families, labelled by node and GPU: key -> (name after
#: `gpu_operator_node_gpu_`, help, further labels).
GPU_FAMILIES: dict[str, tuple[str, ...]] = {
    "gpu_up": ("up", "0 when the GPU is lost."),
    "mig_current": ("mig_mode_enabled", "1 when MIG mode is on."),
    "mig_pending": (
        "mig_mode_pending_enabled",
        "1 when MIG mode will be on after the next GPU reset.",
    ),
    "temperature": ("temperature_celsius", "GPU core temperature."),
    "power_usage": ("power_usage_watts", "Power draw of the board."),
    "power_limit": ("power_limit_watts", "Enforced power limit."),
    "memory_used": ("memory_used_bytes", "Framebuffer memory in use."),
    "memory_total": ("memory_total_bytes", "Framebuffer memory size."),
    "utilization": ("utilization_ratio", "Share of the last sample period a kernel ran."),
    "memory_utilization": (
        "memory_utilization_ratio",
        "Share of the last sample period memory was read or written.",
    ),
    "ecc": (
        "ecc_errors",
        "ECC errors; counter=volatile resets with the driver, aggregate does not.",
        "error_type",
        "counter",
    ),
    "retired_pages": (
        "retired_pages",
        "Memory pages retired, by cause (pre-Ampere GPUs).",
        "cause",
    ),
    "retired_pending": ("retired_pages_pending", "1 when a page retirement waits for a reset."),
    "remapped_rows": (
        "remapped_rows",
        "Memory rows remapped, by error type (Ampere and later).",
        "error_type",
    ),
    "remap_pending": ("remapped_rows_pending", "1 when a row remap waits for a reset."),
    "remap_failed": ("remapped_rows_failed", "1 when a row remap failed (the GPU needs service)."),
    "throttle": (
        "clock_throttle_active",
        "1 while clocks are held down for this reason.",
        "reason",
    ),
    "xid": ("xid_errors", "XID errors seen since the exporter started, by XID code.", "xid"),
}
#: The families that count up (every other one is a gauge).
COUNTERS = frozenset({"ecc", "xid"})


def _family(key: str, name: str, doc: str, labels: list[str]) -> Family:
    kind = CounterMetricFamily if key in COUNTERS else GaugeMetricFamily
    return kind(name, doc, labels=labels)


class _Families:
    """The metric families of one scrape."""

    def __init__(self) -> None:
        # Upstream's names (its node-status-exporter): one gauge per validation step.
        self.ready = {
            check: GaugeMetricFamily(
                f"gpu_operator_node_{check}_ready",
                f"1 while the validator's {check}-ready status file exists, 0 otherwise.",
                labels=NODE_LABELS,
            )
            for check in CHECK_NAMES
        }
        self._by_key = {
            key: _family(key, f"gpu_operator_{name}", doc, [*NODE_LABELS, *extra])
            for key, (name, doc, *extra) in NODE_FAMILIES.items()
        }
        self._by_key.update(
            (key, _family(key, f"gpu_operator_node_gpu_{name}", doc, [*GPU_LABELS, *extra]))
            for key, (name, doc, *extra) in GPU_FAMILIES.items()
        )

    def __getitem__(self, key: str) -> Family:
        return self._by_key[key]

    def all(self) -> list[Metric]:
        return [*self._by_key.values(), *self.ready.values()]


class NodeCollector(Collector):
    def __init__(
        self,
        nvml: Nvml,
        node_name: str,
        status: StatusFiles,
        *,
        checks: Sequence[str] = CHECK_NAMES,
        xid_counts: XidCounts | None = None,
        xid_watcher: XidWatcher | None = None,
        plugin_devices: DevicePluginDevices | None = None,
        pci_devices: Callable[[], int] | None = None,
    ) -> None:
        self.nvml = nvml
        self.node = node_name
        self.status = status
        self.checks = tuple(checks)
        self.xid_counts = xid_counts or XidCounts()
        self.xid_watcher = xid_watcher
        self.plugin_devices = plugin_devices
        self.pci_devices = pci_devices
        self._identity: dict[int, tuple[str, str]] = {}  # index -> (uuid, model), kept if lost
        self._lock = threading.Lock()
        self._started = time.time()
        self._driver_ok_at: float | None = None

    def collect(self) -> Iterable[Metric]:
        fams = _Families()
        with self._lock:
            fams["metrics_ready"].add_metric([self.node], self._started)
            self._validation(fams)
            self._nvml(fams)
            self._xids(fams)
            up = [s.value for s in fams["nvml_up"].samples]
            fams["driver_validation"].add_metric([self.node], up[0] if up else 0)
            if up and up[0] == 1:
                self._driver_ok_at = time.time()
            if self._driver_ok_at is not None:
                fams["driver_validation_last_success"].add_metric([self.node], self._driver_ok_at)
        if self.xid_watcher is not None:
            fams["xid_watching"].add_metric([self.node], int(self.xid_watcher.watching))
        self._devices(fams)
        return [family for family in fams.all() if family.samples]

    def _devices(self, fams: _Families) -> None:
        plugin = self.plugin_devices
        if plugin is not None and plugin.count is not None:
            fams["plugin_devices"].add_metric([self.node], plugin.count)
        if plugin is not None and plugin.last_success is not None:
            fams["plugin_last_success"].add_metric([self.node], plugin.last_success)
        if self.pci_devices is not None:
            fams["pci_devices"].add_metric([self.node], self.pci_devices())

    def _validation(self, fams: _Families) -> None:
        try:
            ready = {check: self.status.is_ready(check) for check in self.checks}
        except OSError as exc:
            log.warning(
                "validations unreadable", directory=str(self.status.directory), error=str(exc)
            )
            fams["validations_readable"].add_metric([self.node], 0)
            return
        fams["validations_readable"].add_metric([self.node], 1)
        for check, ok in ready.items():
            if check in fams.ready:
                fams.ready[check].add_metric([self.node], int(ok))

    def _down(self, fams: _Families, exc: NvmlError) -> None:
        fams["nvml_up"].add_metric([self.node], 0)
        fams["nvml_failure"].add_metric([self.node, error_kind(exc)], 1)

    def _nvml(self, fams: _Families) -> None:
        try:
            self.nvml.init()
        except NvmlError as exc:
            self._down(fams, exc)
            return
        try:
            count = self.nvml.device_count()
            driver = self.nvml.driver_version()
            cuda = str(self.nvml.cuda_driver_version())
        except NvmlError as exc:
            self._down(fams, exc)
        else:
            fams["nvml_up"].add_metric([self.node], 1)
            fams["driver_info"].add_metric([self.node, driver, cuda], 1)
            fams["gpu_count"].add_metric([self.node], count)
            for index in range(count):
                self._gpu(fams, index)
        finally:
            with contextlib.suppress(NvmlError):
                self.nvml.shutdown()

    def _labels(self, index: int) -> list[str]:
        uuid, model = self._identity.get(index, ("", ""))
        return [self.node, str(index), uuid, model]

    def _gpu(self, fams: _Families, index: int) -> None:
        samples: list[tuple[GaugeMetricFamily | CounterMetricFamily, list[str], float]] = []
        nvml = self.nvml

        def opt(read: Callable[[int], T]) -> T | None:
            """A field this GPU may lack: NotSupported or an odd error only skips it."""
            try:
                return read(index)
            except GpuLost:
                raise
            except NvmlError as exc:
                if not isinstance(exc, NotSupported):
                    log.debug("gpu field unreadable", gpu=index, error=str(exc))
                return None

        try:
            self._identity[index] = (nvml.device_uuid(index), nvml.device_name(index))
            labels = self._labels(index)
            mig = opt(nvml.device_mig_mode)
            temp = opt(nvml.device_temperature_celsius)
            usage = opt(nvml.device_power_usage_watts)
            limit = opt(nvml.device_power_limit_watts)
            mem = opt(nvml.device_memory)
            util = opt(nvml.device_utilization)
            ecc = opt(nvml.device_ecc_errors)
            retired = opt(nvml.device_retired_pages)
            remapped = opt(nvml.device_remapped_rows)
            throttle = opt(nvml.device_throttle_reasons)
        except GpuLost as exc:
            log.warning("gpu lost", gpu=index, uuid=self._labels(index)[2], error=str(exc))
            fams["gpu_up"].add_metric(self._labels(index), 0)
            return
        except NvmlError as exc:  # identity unreadable for another reason
            log.warning("gpu unreadable", gpu=index, error=str(exc))
            fams["gpu_up"].add_metric(self._labels(index), 0)
            return

        samples.append((fams["gpu_up"], labels, 1))
        if mig is not None:
            samples.append((fams["mig_current"], labels, int(mig.current)))
            samples.append((fams["mig_pending"], labels, int(mig.pending)))
        for fam, value in (
            (fams["temperature"], temp),
            (fams["power_usage"], usage),
            (fams["power_limit"], limit),
        ):
            if value is not None:
                samples.append((fam, labels, value))
        if mem is not None:
            samples.append((fams["memory_used"], labels, mem.used_bytes))
            samples.append((fams["memory_total"], labels, mem.total_bytes))
        if util is not None:
            samples.append((fams["utilization"], labels, util.gpu_ratio))
            samples.append((fams["memory_utilization"], labels, util.memory_ratio))
        if ecc is not None:
            for etype, counter, value in (
                ("corrected", "volatile", ecc.volatile_corrected),
                ("uncorrected", "volatile", ecc.volatile_uncorrected),
                ("corrected", "aggregate", ecc.aggregate_corrected),
                ("uncorrected", "aggregate", ecc.aggregate_uncorrected),
            ):
                samples.append((fams["ecc"], [*labels, etype, counter], value))
        if retired is not None:
            samples.append(
                (fams["retired_pages"], [*labels, "single_bit_ecc"], retired.single_bit_ecc)
            )
            samples.append(
                (fams["retired_pages"], [*labels, "double_bit_ecc"], retired.double_bit_ecc)
            )
            samples.append((fams["retired_pending"], labels, int(retired.pending)))
        if remapped is not None:
            samples.append((fams["remapped_rows"], [*labels, "correctable"], remapped.correctable))
            samples.append(
                (fams["remapped_rows"], [*labels, "uncorrectable"], remapped.uncorrectable)
            )
            samples.append((fams["remap_pending"], labels, int(remapped.pending)))
            samples.append((fams["remap_failed"], labels, int(remapped.failure)))
        if throttle is not None:
            for reason in KNOWN_THROTTLE_REASONS:
                name = (reason.name or str(reason.value)).lower()
                samples.append((fams["throttle"], [*labels, name], int(reason in throttle)))
        for family, sample_labels, sample in samples:
            family.add_metric(sample_labels, sample)

    def _xids(self, fams: _Families) -> None:
        for (index, xid), count in sorted(self.xid_counts.snapshot().items()):
            fams["xid"].add_metric([*self._labels(index), str(xid)], count)
