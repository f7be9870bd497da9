"""The real pynvml path on a GPU machine; skips where NVML cannot load.

Run with ``pytest -m gpu -s tests/gpu`` to see what the hardware reported.
``GPUOP_DRIVER_ROOT`` picks the driver root (default ``/``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuop.nodeagent.driver import DriverCheck, DriverLayout
from gpuop.nodeagent.exporter import build_registry
from gpuop.nodeagent.nvml import (
    DriverNotLoaded,
    LibraryNotFound,
    NotSupported,
    ThrottleReason,
    XidEvent,
    read_inventory,
)
from gpuop.nodeagent.nvml.real import PynvmlNvml
from gpuop.nodeagent.status import StatusFiles

pytestmark = pytest.mark.gpu
T = TypeVar("T")
DRIVER_ROOT = Path(os.environ.get("GPUOP_DRIVER_ROOT", "/"))


@pytest.fixture(scope="module")
def nvml() -> Iterator[PynvmlNvml]:
    real = PynvmlNvml(DRIVER_ROOT)
    try:
        real.init()
    except (LibraryNotFound, DriverNotLoaded) as exc:
        pytest.skip(f"NVML unavailable under {DRIVER_ROOT}: {type(exc).__name__}: {exc}")
    yield real
    real.shutdown()


def optional(read: Callable[[int], T], index: int) -> T | str:
    try:
        return read(index)
    except NotSupported:
        return "not supported"


def test_versions(nvml: PynvmlNvml) -> None:
    driver = nvml.driver_version()
    cuda = nvml.cuda_driver_version()
    print(f"driver {driver}, CUDA {cuda}, {nvml.device_count()} GPU(s)")
    assert re.fullmatch(r"\d+\.\d+(\.\d+)?", driver)
    assert cuda.major >= 10


def test_every_device_field(nvml: PynvmlNvml) -> None:
    assert nvml.device_count() >= 1
    for i in range(nvml.device_count()):
        uuid = nvml.device_uuid(i)
        mem = nvml.device_memory(i)
        temp = nvml.device_temperature_celsius(i)
        util = nvml.device_utilization(i)
        throttle = nvml.device_throttle_reasons(i)
        fields = {
            "name": nvml.device_name(i),
            "uuid": uuid,
            "memory": mem,
            "mig": optional(nvml.device_mig_mode, i),
            "temperature_celsius": temp,
            "power_usage_watts": optional(nvml.device_power_usage_watts, i),
            "power_limit_watts": optional(nvml.device_power_limit_watts, i),
            "utilization": util,
            "ecc": optional(nvml.device_ecc_errors, i),
            "retired_pages": optional(nvml.device_retired_pages, i),
            "remapped_rows": optional(nvml.device_remapped_rows, i),
            "throttle": throttle,
        }
        print(f"gpu {i}: {fields}")
        assert uuid.startswith("GPU-")
        assert mem.total_bytes > 0
        assert 0 <= mem.used_bytes <= mem.total_bytes
        assert 0 < temp < 130
        assert 0 <= util.gpu_percent <= 100
        assert isinstance(throttle, ThrottleReason)


def test_inventory_and_driver_check(nvml: PynvmlNvml) -> None:
    inventory = read_inventory(nvml)  # nested init/shutdown is refcounted
    print(f"inventory: {inventory}")
    assert len(inventory.devices) == nvml.device_count()


async def test_driver_check(nvml: PynvmlNvml) -> None:
    # A real node's root as both host and driver root: a host driver is found under it.
    layout = DriverLayout(host_root_here=DRIVER_ROOT, driver_root_here=DRIVER_ROOT)
    result = await DriverCheck(lambda _root: nvml, layout).run()
    print(f"driver check: {result}")
    assert result.ok, result.reason


def test_xid_event_set(nvml: PynvmlNvml) -> None:
    try:
        events = nvml.xid_events()
    except NotSupported as exc:
        print(f"xid events not supported: {exc}")
        return
    try:
        event = events.wait(100)
        print(f"xid wait(100ms): {event}")
        assert event is None or isinstance(event, XidEvent)
    finally:
        events.close()


def test_exporter_scrape(nvml: PynvmlNvml, tmp_path: Path) -> None:
    text = generate_latest(build_registry(nvml, "gpu-test", StatusFiles(tmp_path))).decode()
    samples = {
        (s.name, s.labels.get("gpu", "")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    print(text)
    assert samples[("gpu_operator_node_nvml_up", "")] == 1
    for i in range(nvml.device_count()):
        assert samples[("gpu_operator_node_gpu_up", str(i))] == 1


def test_health_reads_every_gpu_of_a_healthy_machine(nvml: PynvmlNvml) -> None:
    """The health check's NVML queries all answer on real hardware (a fault found here is
    a real one: the message says which GPU and why)."""
    from gpuop.nodeagent.health import read_faults, verdict

    faults = read_faults(nvml, {})
    assert faults is not None
    result = verdict(faults)
    print(f"GPUHealthy={result.status} reason={result.reason}: {result.message}")
    assert result.status == "True", result.message
