"""The scriptable NVML fake behaves like the hardware it stands in for."""

from __future__ import annotations

import pytest

from gpuop.devcluster.nvml_fake import A100_SXM4_80GB, H100_80GB_HBM3, TESLA_T4, FakeNvml, make_gpus
from gpuop.nodeagent.nvml import (
    DriverNotLoaded,
    GpuLost,
    LibraryNotFound,
    MigMode,
    NotSupported,
    ThrottleReason,
    Unknown,
    XidEvent,
    read_inventory,
)


@pytest.fixture
def nvml() -> FakeNvml:
    fake = FakeNvml(make_gpus(A100_SXM4_80GB, H100_80GB_HBM3, TESLA_T4))
    fake.init()
    return fake


def test_models_report_their_identity(nvml: FakeNvml) -> None:
    assert nvml.device_count() == 3
    assert [nvml.device_name(i) for i in range(3)] == [
        "NVIDIA A100-SXM4-80GB",
        "NVIDIA H100 80GB HBM3",
        "Tesla T4",
    ]
    uuids = {nvml.device_uuid(i) for i in range(3)}
    assert len(uuids) == 3
    assert all(u.startswith("GPU-") for u in uuids)
    assert nvml.device_memory(2).total_bytes == 15360 * 1024 * 1024
    assert nvml.driver_version() == "595.91.07"
    assert str(nvml.cuda_driver_version()) == "13.0"


def test_make_gpus_uuids_are_stable() -> None:
    assert [g.uuid for g in make_gpus(TESLA_T4, seed="a")] == [
        g.uuid for g in make_gpus(TESLA_T4, seed="a")
    ]
    assert make_gpus(TESLA_T4, seed="a")[0].uuid != make_gpus(TESLA_T4, seed="b")[0].uuid


def test_mig_on_off_and_not_capable(nvml: FakeNvml) -> None:
    assert nvml.device_mig_mode(0) == MigMode(False, False)
    nvml.set_mig(0, current=False, pending=True)
    assert nvml.device_mig_mode(0) == MigMode(False, True)
    nvml.set_mig(0, current=True)
    assert nvml.device_mig_mode(0) == MigMode(True, True)
    with pytest.raises(NotSupported):
        nvml.device_mig_mode(2)


def test_memory_health_api_depends_on_generation(nvml: FakeNvml) -> None:
    assert nvml.device_remapped_rows(0).correctable == 0
    with pytest.raises(NotSupported):
        nvml.device_retired_pages(0)
    assert nvml.device_retired_pages(2).double_bit_ecc == 0
    with pytest.raises(NotSupported):
        nvml.device_remapped_rows(2)


def test_scripted_readings(nvml: FakeNvml) -> None:
    gpu = nvml.gpus[1]
    gpu.temperature_celsius = 71.0
    gpu.throttle = ThrottleReason.SW_POWER_CAP | ThrottleReason.HW_SLOWDOWN
    assert nvml.device_temperature_celsius(1) == 71.0
    assert ThrottleReason.HW_SLOWDOWN in nvml.device_throttle_reasons(1)
    assert nvml.device_power_limit_watts(1) == 700.0


def test_gpu_lost_after_n_calls(nvml: FakeNvml) -> None:
    nvml.lose_gpu(1, after_calls=2)
    nvml.device_name(1)
    nvml.device_uuid(1)
    with pytest.raises(GpuLost):
        nvml.device_temperature_celsius(1)
    with pytest.raises(GpuLost):  # and stays lost
        nvml.device_name(1)
    assert nvml.device_name(0) == "NVIDIA A100-SXM4-80GB"
    assert nvml.device_count() == 3  # NVML still enumerates a lost GPU


def test_gpu_lost_on_command(nvml: FakeNvml) -> None:
    nvml.lose_gpu(0)
    with pytest.raises(GpuLost):
        nvml.device_name(0)


def test_library_not_found_and_driver_not_loaded() -> None:
    with pytest.raises(LibraryNotFound):
        FakeNvml.library_not_found().init()
    with pytest.raises(DriverNotLoaded):
        FakeNvml.driver_not_loaded().init()


def test_calls_need_init_and_init_is_refcounted() -> None:
    nvml = FakeNvml(make_gpus(TESLA_T4))
    with pytest.raises(Unknown):
        nvml.device_count()
    nvml.init()
    nvml.init()
    nvml.shutdown()
    assert nvml.initialized
    nvml.shutdown()
    assert not nvml.initialized
    with pytest.raises(Unknown):
        nvml.device_count()


def test_xid_events(nvml: FakeNvml) -> None:
    events = nvml.xid_events()
    assert events.wait(1) is None
    nvml.inject_xid(1, 79)
    assert events.wait(100) == XidEvent(gpu_index=1, xid=79)
    events.close()
    nvml.inject_xid(1, 48)  # no open set: nobody sees it
    with pytest.raises(Unknown):
        events.wait(1)


def test_read_inventory_reports_devices_and_shuts_down() -> None:
    nvml = FakeNvml(make_gpus(A100_SXM4_80GB, TESLA_T4))
    nvml.set_mig(0, current=True)
    inv = read_inventory(nvml)
    assert inv.driver_version == "595.91.07"
    assert [d.name for d in inv.devices] == ["NVIDIA A100-SXM4-80GB", "Tesla T4"]
    assert inv.devices[0].mig == MigMode(True, True)
    assert inv.devices[1].mig is None
    assert not nvml.initialized


def test_read_inventory_gpu_lost_still_shuts_down() -> None:
    nvml = FakeNvml(make_gpus(A100_SXM4_80GB))
    nvml.lose_gpu(0)
    with pytest.raises(GpuLost):
        read_inventory(nvml)
    assert not nvml.initialized
