"""The node status exporter's metrics, parsed back with prometheus-client's parser."""

from __future__ import annotations

import asyncio
import itertools
import socket
import threading
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuop.devcluster.nvml_fake import A100_SXM4_80GB, H100_80GB_HBM3, TESLA_T4, FakeNvml, make_gpus
from gpuop.nodeagent.devices import DevicePluginDevices, gpu_capacity, nvidia_pci_devices
from gpuop.nodeagent.exporter import build_registry, make_app, serve
from gpuop.nodeagent.kube import KubeError
from gpuop.nodeagent.nvml import EccErrors, RemappedRows, RetiredPages, ThrottleReason, Utilization
from gpuop.nodeagent.status import StatusFiles
from gpuop.nodeagent.xid import XidCounts, XidWatcher

NODE = "gpu-node-1"
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def scrape(registry: CollectorRegistry) -> Samples:
    return parse(generate_latest(registry).decode())


def named(samples: Samples, name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {labels: v for (n, labels), v in samples.items() if n == name}


def gpu(index: int, nvml: FakeNvml, **extra: str) -> frozenset[tuple[str, str]]:
    g = nvml.gpus[index]
    labels = {"node": NODE, "gpu": str(index), "uuid": g.uuid, "model_name": g.model.name}
    return frozenset({**labels, **extra}.items())


def node(**extra: str) -> frozenset[tuple[str, str]]:
    return frozenset({"node": NODE, **extra}.items())


@pytest.fixture
def nvml() -> FakeNvml:
    fake = FakeNvml(make_gpus(A100_SXM4_80GB, H100_80GB_HBM3, TESLA_T4))
    a100, h100, t4 = fake.gpus
    a100.mig = a100.mig.__class__(True, True)
    a100.temperature_celsius = 41.0
    a100.power_usage_watts = 88.5
    a100.memory_used_bytes = 1024
    a100.utilization = Utilization(gpu_percent=75, memory_percent=20)
    a100.ecc = EccErrors(1, 0, 5, 2)
    a100.remapped_rows = RemappedRows(3, 1, True, False)
    h100.throttle = ThrottleReason.SW_POWER_CAP | ThrottleReason.HW_THERMAL_SLOWDOWN
    t4.retired_pages = RetiredPages(2, 1, True)
    return fake


def test_healthy_node(tmp_path: Path, nvml: FakeNvml) -> None:
    files = StatusFiles(tmp_path)
    files.write("driver", {"DRIVER_VERSION": "595.91.07"})
    s = scrape(build_registry(nvml, NODE, files))

    assert s[("gpu_operator_node_nvml_up", node())] == 1
    assert s[("gpu_operator_node_gpu_count", node())] == 3
    info = node(driver_version="595.91.07", cuda_driver_version="13.0")
    assert s[("gpu_operator_node_driver_info", info)] == 1
    # Upstream's node-status-exporter names: one gauge per validation step.
    assert s[("gpu_operator_node_driver_ready", node())] == 1
    assert s[("gpu_operator_node_toolkit_ready", node())] == 0
    assert s[("gpu_operator_node_cuda_ready", node())] == 0
    assert s[("gpu_operator_node_plugin_ready", node())] == 0
    assert s[("gpu_operator_node_driver_validation", node())] == 1
    assert s[("gpu_operator_node_driver_validation_last_success_ts_seconds", node())] > 0
    assert s[("gpu_operator_node_metrics_ready_ts_seconds", node())] > 0
    assert not [n for n, _ in s if n.startswith("gpuop_")]
    assert s[("gpu_operator_node_validations_readable", node())] == 1
    assert all(v == 1 for v in named(s, "gpu_operator_node_gpu_up").values())
    assert len(named(s, "gpu_operator_node_gpu_up")) == 3

    a100 = gpu(0, nvml)
    assert s[("gpu_operator_node_gpu_temperature_celsius", a100)] == 41.0
    assert s[("gpu_operator_node_gpu_power_usage_watts", a100)] == 88.5
    assert s[("gpu_operator_node_gpu_power_limit_watts", a100)] == 400.0
    assert s[("gpu_operator_node_gpu_memory_used_bytes", a100)] == 1024
    assert s[("gpu_operator_node_gpu_memory_total_bytes", a100)] == 81920 * 1024 * 1024
    assert s[("gpu_operator_node_gpu_utilization_ratio", a100)] == 0.75
    assert s[("gpu_operator_node_gpu_memory_utilization_ratio", a100)] == 0.2
    assert s[("gpu_operator_node_gpu_mig_mode_enabled", a100)] == 1
    assert s[("gpu_operator_node_gpu_mig_mode_pending_enabled", a100)] == 1
    ecc = "gpu_operator_node_gpu_ecc_errors_total"
    assert s[(ecc, gpu(0, nvml, error_type="corrected", counter="volatile"))] == 1
    assert s[(ecc, gpu(0, nvml, error_type="uncorrected", counter="aggregate"))] == 2
    assert s[("gpu_operator_node_gpu_remapped_rows", gpu(0, nvml, error_type="correctable"))] == 3
    assert s[("gpu_operator_node_gpu_remapped_rows", gpu(0, nvml, error_type="uncorrectable"))] == 1
    assert s[("gpu_operator_node_gpu_remapped_rows_pending", a100)] == 1
    assert s[("gpu_operator_node_gpu_remapped_rows_failed", a100)] == 0
    assert ("gpu_operator_node_gpu_retired_pages_pending", a100) not in s  # Ampere remaps rows

    t4 = gpu(2, nvml)
    assert ("gpu_operator_node_gpu_mig_mode_enabled", t4) not in s  # T4 is not MIG-capable
    assert s[("gpu_operator_node_gpu_retired_pages", gpu(2, nvml, cause="single_bit_ecc"))] == 2
    assert s[("gpu_operator_node_gpu_retired_pages", gpu(2, nvml, cause="double_bit_ecc"))] == 1
    assert s[("gpu_operator_node_gpu_retired_pages_pending", t4)] == 1
    assert ("gpu_operator_node_gpu_remapped_rows_pending", t4) not in s

    throttle = {
        dict(labels)["reason"]: v
        for labels, v in named(s, "gpu_operator_node_gpu_clock_throttle_active").items()
        if dict(labels)["gpu"] == "1"
    }
    assert throttle["sw_power_cap"] == 1
    assert throttle["hw_thermal_slowdown"] == 1
    assert throttle["gpu_idle"] == 0
    assert len(throttle) == 9
    assert not nvml.initialized  # nothing held open between scrapes


@pytest.mark.parametrize(
    ("fake", "reason"),
    [
        (FakeNvml.library_not_found(), "library_not_found"),
        (FakeNvml.driver_not_loaded(), "driver_not_loaded"),
    ],
)
def test_nvml_down(tmp_path: Path, fake: FakeNvml, reason: str) -> None:
    s = scrape(build_registry(fake, NODE, StatusFiles(tmp_path)))
    assert s[("gpu_operator_node_nvml_up", node())] == 0
    assert s[("gpu_operator_node_nvml_failure_info", node(reason=reason))] == 1
    assert not [n for n, _ in s if n.startswith("gpu_operator_node_gpu_")]
    assert ("gpu_operator_node_driver_ready", node()) in s  # still reports validation state
    assert s[("gpu_operator_node_driver_validation", node())] == 0
    assert ("gpu_operator_node_driver_validation_last_success_ts_seconds", node()) not in s


def test_gpu_lost_between_scrapes_keeps_its_identity(tmp_path: Path, nvml: FakeNvml) -> None:
    registry = build_registry(nvml, NODE, StatusFiles(tmp_path))
    assert scrape(registry)[("gpu_operator_node_gpu_up", gpu(1, nvml))] == 1
    nvml.lose_gpu(1)
    s = scrape(registry)
    assert s[("gpu_operator_node_nvml_up", node())] == 1
    assert s[("gpu_operator_node_gpu_up", gpu(1, nvml))] == 0
    assert ("gpu_operator_node_gpu_temperature_celsius", gpu(1, nvml)) not in s
    assert s[("gpu_operator_node_gpu_up", gpu(0, nvml))] == 1
    assert s[("gpu_operator_node_gpu_up", gpu(2, nvml))] == 1


def test_gpu_lost_mid_scrape(tmp_path: Path, nvml: FakeNvml) -> None:
    nvml.lose_gpu(0, after_calls=4)  # identity and a few fields, then gone
    s = scrape(build_registry(nvml, NODE, StatusFiles(tmp_path)))
    assert s[("gpu_operator_node_gpu_up", gpu(0, nvml))] == 0
    up = "gpu_operator_node_gpu_up"
    assert not [n for n, labels in s if dict(labels).get("gpu") == "0" and n != up]


def test_unreadable_validations_dir(
    tmp_path: Path, nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    def denied(self: StatusFiles, check: str) -> bool:
        raise PermissionError(13, "Permission denied", str(self.directory))

    monkeypatch.setattr(StatusFiles, "is_ready", denied)
    s = scrape(build_registry(nvml, NODE, StatusFiles(tmp_path)))
    assert s[("gpu_operator_node_validations_readable", node())] == 0
    assert not named(s, "gpu_operator_node_driver_ready")
    assert s[("gpu_operator_node_nvml_up", node())] == 1


async def _until(predicate: Callable[[], bool], timeout: float = 3.0) -> None:
    """Poll: files and worker threads have no event to await."""
    async with asyncio.timeout(timeout):
        for _ in itertools.count():
            if predicate():
                return
            await asyncio.sleep(0.005)


async def test_xid_errors_are_counted(tmp_path: Path, nvml: FakeNvml) -> None:
    watcher = XidWatcher(nvml, XidCounts(), poll_ms=10)
    registry = build_registry(nvml, NODE, StatusFiles(tmp_path), xid_watcher=watcher)
    stop = asyncio.Event()
    task = asyncio.create_task(watcher.run(stop))
    await _until(lambda: watcher.watching)
    nvml.inject_xid(0, 79)
    nvml.inject_xid(0, 79)
    nvml.inject_xid(2, 48)
    await _until(lambda: sum(watcher.counts.snapshot().values()) == 3)
    assert threading.get_ident() not in nvml.threads  # the watcher waits in threads
    s = scrape(registry)
    assert s[("gpu_operator_node_gpu_xid_errors_total", gpu(0, nvml, xid="79"))] == 2
    assert s[("gpu_operator_node_gpu_xid_errors_total", gpu(2, nvml, xid="48"))] == 1
    assert s[("gpu_operator_node_xid_events_watching", node())] == 1
    stop.set()
    await asyncio.wait_for(task, 2)
    assert not nvml.initialized


async def test_xid_watcher_survives_missing_library() -> None:
    nvml = FakeNvml.library_not_found()
    watcher = XidWatcher(nvml, XidCounts(), poll_ms=10, retry_s=0.01)
    stop = asyncio.Event()
    task = asyncio.create_task(watcher.run(stop))
    await _until(lambda: nvml.init_calls >= 3)  # keeps retrying, never raises
    assert not watcher.watching
    stop.set()
    await asyncio.wait_for(task, 2)


async def test_http_metrics_off_the_event_loop(tmp_path: Path, nvml: FakeNvml) -> None:
    app = make_app(build_registry(nvml, NODE, StatusFiles(tmp_path)))
    async with TestClient(TestServer(app)) as client:
        resp = await client.get("/metrics")
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain; version=")
        s = parse(await resp.text())
        assert s[("gpu_operator_node_nvml_up", node())] == 1
        assert (await client.get("/healthz")).status == 200
    assert nvml.threads
    assert threading.get_ident() not in nvml.threads


async def test_serve_until_stopped(tmp_path: Path, nvml: FakeNvml) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    stop = asyncio.Event()
    task = asyncio.create_task(
        serve(nvml, NODE, StatusFiles(tmp_path), stop, host="127.0.0.1", port=port)
    )
    async with aiohttp.ClientSession() as session:
        async with asyncio.timeout(3):
            while True:
                try:
                    async with session.get(f"http://127.0.0.1:{port}/metrics") as resp:
                        text = await resp.text()
                        break
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.01)
    assert ("gpu_operator_node_gpu_up", gpu(0, nvml)) in parse(text)
    stop.set()
    await asyncio.wait_for(task, 5)
    assert not nvml.initialized


# ------------------------------------------------- upstream's device counts


class _Capacity:
    """The node's capacity as the API server would answer, or a failure."""

    def __init__(self, capacity: dict[str, str] | None) -> None:
        self.capacity = capacity
        self.error: KubeError | None = None
        self.calls = 0

    async def get_node_capacity(self, name: str) -> dict[str, str] | None:
        self.calls += 1
        assert name == NODE
        if self.error is not None:
            raise self.error
        return self.capacity


def _pci(root: Path, devices: dict[str, str]) -> Path:
    """A sysfs tree whose PCI bus holds ``devices`` (address -> vendor id)."""
    bus = root / "bus" / "pci" / "devices"
    bus.mkdir(parents=True)
    for address, vendor in devices.items():
        (bus / address).mkdir()
        (bus / address / "vendor").write_text(f"{vendor}\n")
    return root


def test_nvidia_pci_devices_counts_nvidias_vendor_id(tmp_path: Path) -> None:
    sysfs = _pci(
        tmp_path,
        {
            "0000:3b:00.0": "0x10de",  # a GPU
            "0000:3b:00.1": "0x10DE",  # its audio function
            "0000:00:1f.0": "0x8086",
            "0000:00:02.0": "0x1af4",
        },
    )
    assert nvidia_pci_devices(sysfs) == 2
    assert nvidia_pci_devices(tmp_path / "absent") == -1  # as upstream's failed lspci


def test_gpu_capacity_sums_full_gpus_and_mig_devices() -> None:
    capacity = {
        "cpu": "64",
        "nvidia.com/gpu": "4",
        "nvidia.com/mig-1g.10gb": "7",
        "nvidia.com/mig-2g.20gb": "0",
        "example.com/gpu": "2",
    }
    assert gpu_capacity(capacity) == 11
    assert gpu_capacity({"cpu": "8"}) == 0


async def test_device_plugin_devices_are_served_as_upstream(tmp_path: Path, nvml: FakeNvml) -> None:
    api = _Capacity({"nvidia.com/gpu": "8"})
    devices = DevicePluginDevices(api, NODE)
    sysfs = _pci(tmp_path / "sys", {"0000:3b:00.0": "0x10de"})
    registry = build_registry(
        nvml,
        NODE,
        StatusFiles(tmp_path),
        plugin_devices=devices,
        pci_devices=lambda: nvidia_pci_devices(sysfs),
    )
    s = scrape(registry)
    # Before the first read of the node: no count (a 0 would fire the alert on it).
    assert ("gpu_operator_node_device_plugin_devices_total", node()) not in s
    assert s[("gpu_operator_nvidia_pci_devices_total", node())] == 1

    await devices.read()
    s = scrape(registry)
    assert s[("gpu_operator_node_device_plugin_devices_total", node())] == 8
    found_at = s[("gpu_operator_node_device_plugin_validation_last_success_ts_seconds", node())]
    assert found_at > 0

    api.capacity = {"nvidia.com/gpu": "0"}  # the plugin stopped advertising
    await devices.read()
    s = scrape(registry)
    assert s[("gpu_operator_node_device_plugin_devices_total", node())] == 0
    last = "gpu_operator_node_device_plugin_validation_last_success_ts_seconds"
    assert s[(last, node())] == found_at  # the last success stays

    api.error = KubeError("API unreachable: refused")
    await devices.read()
    assert scrape(registry)[("gpu_operator_node_device_plugin_devices_total", node())] == -1
    api.error, api.capacity = None, None  # the node is gone
    await devices.read()
    assert scrape(registry)[("gpu_operator_node_device_plugin_devices_total", node())] == -1


async def test_device_plugin_poll_runs_until_stopped() -> None:
    api = _Capacity({"nvidia.com/gpu": "2"})
    devices = DevicePluginDevices(api, NODE, interval_s=0.01)
    stop = asyncio.Event()
    task = asyncio.create_task(devices.run(stop))
    await _until(lambda: api.calls >= 3)
    stop.set()
    await asyncio.wait_for(task, 3)
    assert devices.count == 2
