"""The validation runner: order, status files, retries, rechecks, shutdown."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
import structlog.testing

from gpuop.devcluster.nvml_fake import A100_SXM4_80GB, FakeNvml, make_gpus
from gpuop.nodeagent.checks import CheckResult
from gpuop.nodeagent.driver import DriverCheck, DriverLayout
from gpuop.nodeagent.status import StatusFiles
from gpuop.nodeagent.validate import Backoff, Validator

FAST = Backoff(initial_s=0.001, maximum_s=0.002)


def layout(tmp_path: Path) -> DriverLayout:
    """A node whose driver container installed into an empty tree."""
    return DriverLayout(
        host_root_here=tmp_path / "host",
        driver_root_here=tmp_path / "driver",
        validations_here=tmp_path,
    )


class Scripted:
    """A check whose outcomes are listed up front; the last one repeats."""

    def __init__(self, name: str, outcomes: Iterable[bool | Exception], recheck: bool = True):
        self.name = name
        self.recheck = recheck
        self.outcomes = list(outcomes)
        self.runs = 0

    async def run(self) -> CheckResult:
        outcome = self.outcomes[min(self.runs, len(self.outcomes) - 1)]
        self.runs += 1
        if isinstance(outcome, Exception):
            raise outcome
        if outcome:
            return CheckResult.passed({"RUN": str(self.runs)})
        return CheckResult.failed(f"{self.name} broken\nsecond line")


def ready(files: StatusFiles) -> list[str]:
    return sorted(p.name for p in files.directory.glob("*-ready"))


async def test_run_once_all_pass(tmp_path: Path) -> None:
    files = StatusFiles(tmp_path)
    checks = [Scripted(n, [True]) for n in ("driver", "toolkit", "cuda", "plugin")]
    assert await Validator(checks, files).run_once()
    assert ready(files) == ["cuda-ready", "driver-ready", "plugin-ready", "toolkit-ready"]
    assert files.read("driver") == {"RUN": "1"}


async def test_run_once_stops_at_first_failure_and_clears_later_files(tmp_path: Path) -> None:
    files = StatusFiles(tmp_path)
    for name in ("driver", "toolkit", "cuda", "plugin"):
        files.write(name, {})  # stale files of an earlier run
    checks = [
        Scripted("driver", [True]),
        Scripted("toolkit", [False]),
        Scripted("cuda", [True]),
        Scripted("plugin", [True]),
    ]
    assert not await Validator(checks, files).run_once()
    assert ready(files) == ["driver-ready"]
    assert checks[2].runs == 0


async def test_failure_is_logged_on_one_line(tmp_path: Path) -> None:
    validator = Validator([Scripted("driver", [False])], StatusFiles(tmp_path))
    with structlog.testing.capture_logs() as logs:
        assert not await validator.run_once()
    assert validator.last["driver"].reason == "driver broken second line"
    assert {
        "event": "check failed",
        "check": "driver",
        "reason": "driver broken second line",
        "log_level": "warning",
    }.items() <= next(e for e in logs if e["event"] == "check failed").items()


async def test_exception_in_a_check_is_a_failure(tmp_path: Path) -> None:
    validator = Validator([Scripted("plugin", [RuntimeError("API down")])], StatusFiles(tmp_path))
    assert not await validator.run_once()
    assert validator.last["plugin"].reason == "RuntimeError: API down"


def test_backoff_is_capped() -> None:
    backoff = Backoff(initial_s=1, maximum_s=30, factor=2)
    assert [backoff.delay(a) for a in range(7)] == [1, 2, 4, 8, 16, 30, 30]
    assert backoff.delay(10_000) == 30


async def _until(predicate: Callable[[], bool], timeout: float = 2.0) -> None:
    """Poll: files and worker threads have no event to await."""
    async with asyncio.timeout(timeout):
        for _ in itertools.count():
            if predicate():
                return
            await asyncio.sleep(0.001)


async def test_wait_retries_until_pass_then_removes_files_on_stop(tmp_path: Path) -> None:
    files = StatusFiles(tmp_path)
    driver = Scripted("driver", [False, False, True])
    toolkit = Scripted("toolkit", [False, True])
    cuda = Scripted("cuda", [True], recheck=False)
    validator = Validator([driver, toolkit, cuda], files, backoff=FAST, recheck_interval_s=60)
    stop = asyncio.Event()
    task = asyncio.create_task(validator.run_wait(stop))
    await _until(lambda: len(ready(files)) == 3)
    assert (driver.runs, toolkit.runs, cuda.runs) == (3, 2, 1)
    stop.set()
    await asyncio.wait_for(task, 1)
    assert ready(files) == []


async def test_wait_recheck_notices_a_lost_gpu(tmp_path: Path) -> None:
    files = StatusFiles(tmp_path)
    nvml = FakeNvml(make_gpus(A100_SXM4_80GB, A100_SXM4_80GB))
    cuda = Scripted("cuda", [True], recheck=False)
    validator = Validator(
        [DriverCheck(lambda _root: nvml, layout(tmp_path)), cuda],
        files,
        backoff=FAST,
        recheck_interval_s=0.01,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(validator.run_wait(stop))
    await _until(lambda: ready(files) == ["cuda-ready", "driver-ready"])
    nvml.lose_gpu(1)
    await _until(lambda: ready(files) == [])  # the driver file takes cuda's with it
    assert validator.last["driver"].reason.startswith("GPU lost")
    assert not task.done()  # no crash loop: it keeps trying
    nvml.gpus[1].lost = False
    nvml.gpus[1].lose_after_calls = None
    await _until(lambda: ready(files) == ["cuda-ready", "driver-ready"])
    assert cuda.runs == 2  # cuda ran again once the driver was back
    stop.set()
    await asyncio.wait_for(task, 1)
    assert ready(files) == []


async def test_wait_without_recheck_holds_until_stopped(tmp_path: Path) -> None:
    files = StatusFiles(tmp_path)
    driver = Scripted("driver", [True])
    validator = Validator([driver], files, recheck_interval_s=0)
    stop = asyncio.Event()
    task = asyncio.create_task(validator.run_wait(stop))
    await _until(lambda: ready(files) == ["driver-ready"])
    await asyncio.sleep(0.02)
    assert driver.runs == 1
    stop.set()
    await asyncio.wait_for(task, 1)
    assert ready(files) == []


async def test_wait_cancelled_still_removes_files(tmp_path: Path) -> None:
    files = StatusFiles(tmp_path)
    validator = Validator([Scripted("driver", [True])], files, recheck_interval_s=0)
    task = asyncio.create_task(validator.run_wait(asyncio.Event()))
    await _until(lambda: ready(files) == ["driver-ready"])
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ready(files) == []
