"""Node agent GPU health: each fault the fake NVML injects becomes the GPUHealthy
condition with its reason, naming the GPU; writes happen only on change."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gpuop.devcluster.nvml_fake import A100_SXM4_80GB, H100_80GB_HBM3, TESLA_T4, FakeNvml, make_gpus
from gpuop.nodeagent.health import (
    CONDITION_TYPE,
    CRITICAL_XIDS,
    FaultKind,
    HealthReporter,
    condition,
    read_faults,
    verdict,
)
from gpuop.nodeagent.xid import XidCounts, XidWatcher


def fake() -> FakeNvml:
    return FakeNvml(make_gpus(A100_SXM4_80GB, H100_80GB_HBM3, TESLA_T4, seed="n1"))


def test_healthy_gpus_report_true() -> None:
    v = verdict(read_faults(fake(), {}))
    assert (v.status, v.reason) == ("True", "GpusHealthy")


FAULTS: list[tuple[str, Callable[[FakeNvml], None], str, str]] = [
    ("gpu lost", lambda n: n.lose_gpu(1), "GpuLost", "GPU 1"),
    ("double-bit ecc", lambda n: n.inject_ecc_uncorrectable(0, 2), "EccUncorrectable", "GPU 0"),
    ("row remap failure", lambda n: n.fail_row_remap(1), "RowRemapFailure", "GPU 1"),
    ("row remap pending", lambda n: n.require_reset(0), "GpuResetRequired", "GPU 0"),
    ("page retirement pending", lambda n: n.require_reset(2), "GpuResetRequired", "GPU 2"),
    ("thermal slowdown", lambda n: n.thermal_slowdown(2, 95.0), "ThermalSlowdown", "GPU 2"),
]


@pytest.mark.parametrize(
    ("inject", "reason", "gpu"), [f[1:] for f in FAULTS], ids=[f[0] for f in FAULTS]
)
def test_each_fault_makes_the_condition_false(
    inject: Callable[[FakeNvml], None], reason: str, gpu: str
) -> None:
    nvml = fake()
    inject(nvml)
    v = verdict(read_faults(nvml, {}))
    assert v.status == "False"
    assert v.reason == reason
    assert v.message.startswith(gpu)
    if reason != "GpuLost":  # a lost GPU cannot say its UUID any more
        nvml.init()
        assert nvml.device_uuid(int(gpu.split()[1])) in v.message


@pytest.mark.parametrize("xid", sorted(CRITICAL_XIDS))
def test_each_critical_xid_makes_the_condition_false(xid: int) -> None:
    nvml = fake()
    v = verdict(read_faults(nvml, {(1, xid): 1}))
    assert (v.status, v.reason) == ("False", "XidCritical")
    assert f"XID {xid} ({CRITICAL_XIDS[xid]})" in v.message
    assert v.message.startswith("GPU 1 (GPU-")


def test_application_xids_stay_metrics_only() -> None:
    assert verdict(read_faults(fake(), {(0, 13): 5, (0, 31): 1, (0, 43): 2})).status == "True"


def test_the_worst_fault_is_the_reason_and_all_are_named() -> None:
    nvml = fake()
    nvml.thermal_slowdown(0)
    nvml.lose_gpu(2)
    v = verdict(read_faults(nvml, {(1, 79): 1}))
    assert v.reason == FaultKind.GPU_LOST.value
    assert "GPU 2" in v.message
    assert "XID 79" in v.message
    assert "thermal slowdown" in v.message


def test_no_nvml_is_unknown_not_unhealthy() -> None:
    """A node without a loaded driver (or mid driver upgrade) says nothing about GPUs."""
    assert verdict(read_faults(FakeNvml.driver_not_loaded(), {})).status == "Unknown"
    assert verdict(read_faults(FakeNvml.library_not_found(), {})).status == "Unknown"


def test_read_faults_leaves_nvml_shut_down() -> None:
    nvml = fake()
    nvml.lose_gpu(0)
    read_faults(nvml, {})
    assert not nvml.initialized


def test_transition_time_moves_only_with_the_status() -> None:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    first = condition(verdict([]), None, t0)
    same = condition(verdict([]), first, t0 + timedelta(minutes=5))
    assert same["lastTransitionTime"] == first["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert same["lastHeartbeatTime"] == "2026-01-01T00:05:00Z"
    flipped = condition(verdict(read_faults(_lost(), {})), same, t0 + timedelta(minutes=9))
    assert flipped["lastTransitionTime"] == "2026-01-01T00:09:00Z"
    assert flipped["type"] == CONDITION_TYPE


def _lost() -> FakeNvml:
    nvml = fake()
    nvml.lose_gpu(0)
    return nvml


class StatusStore:
    """The agent's view of the API (its own two-call interface), kept in memory."""

    def __init__(self, existing: Mapping[str, Any] | None = None) -> None:
        self.conditions: dict[str, dict[str, Any]] = {}
        if existing is not None:
            self.conditions[existing["type"]] = dict(existing)
        self.patches: list[Mapping[str, Any]] = []

    async def node_condition(self, node: str, type_: str) -> Mapping[str, Any] | None:
        return self.conditions.get(type_)

    async def patch_node_status(self, node: str, patch: Mapping[str, Any]) -> None:
        self.patches.append(patch)
        for cond in patch["status"]["conditions"]:
            self.conditions[cond["type"]] = cond


async def test_reporter_writes_only_on_change_and_keeps_an_old_transition_time() -> None:
    nvml = fake()
    old = {"type": CONDITION_TYPE, "status": "True", "lastTransitionTime": "2025-12-01T00:00:00Z"}
    store = StatusStore(old)
    reporter = HealthReporter(nvml, store, "n1", XidCounts())
    await reporter.check_once()
    await reporter.check_once()
    assert len(store.patches) == 1
    assert store.conditions[CONDITION_TYPE]["lastTransitionTime"] == "2025-12-01T00:00:00Z"
    nvml.inject_ecc_uncorrectable(1)
    await reporter.check_once()
    assert len(store.patches) == 2
    assert store.conditions[CONDITION_TYPE]["reason"] == "EccUncorrectable"
    nvml.heal(1)
    await reporter.check_once()
    assert store.conditions[CONDITION_TYPE]["status"] == "True"


async def _until(check: Callable[[], bool], attempts: int = 1000) -> None:
    for _ in range(attempts):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


async def test_an_xid_event_wakes_the_reporter_at_once() -> None:
    nvml = fake()
    store = StatusStore()
    counts = XidCounts()
    reporter = HealthReporter(nvml, store, "n1", counts, interval_s=3600)
    watcher = XidWatcher(nvml, counts, poll_ms=20, on_event=lambda _: reporter.wake.set())
    stop = asyncio.Event()
    tasks = [asyncio.create_task(watcher.run(stop)), asyncio.create_task(reporter.run(stop))]
    try:
        await _until(lambda: watcher.watching and bool(store.patches))
        nvml.inject_xid(0, 79)
        # Well before the hour-long interval: only the XID can have woken it.
        await _until(lambda: store.conditions[CONDITION_TYPE]["status"] == "False")
        assert store.conditions[CONDITION_TYPE]["reason"] == "XidCritical"
        assert counts.snapshot() == {(0, 79): 1}
    finally:
        stop.set()
        await asyncio.gather(*tasks)


async def test_a_lasting_fault_is_written_once_while_its_readings_drift() -> None:
    nvml = fake()
    store = StatusStore()
    reporter = HealthReporter(nvml, store, "n1", XidCounts())
    nvml.thermal_slowdown(0, 91.0)
    await reporter.check_once()
    nvml.thermal_slowdown(0, 94.0)
    await reporter.check_once()
    assert len(store.patches) == 1
    assert store.conditions[CONDITION_TYPE]["reason"] == "ThermalSlowdown"
