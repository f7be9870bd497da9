"""The bench's CPU-by-task counter (tests.bench._cpu_by_task): what a callback's CPU is
booked to, and the report of a window between two snapshots."""

from __future__ import annotations

import asyncio

import pytest

from tests.bench._cpu_by_task import bucket, report


def test_a_window_reports_what_was_spent_between_the_snapshots_around_it() -> None:
    lines = [
        {"t": 100.0, "process": 1.0, "cpu": {"pass:node": 0.5}, "runs": {"pass:node": 5}},
        {"t": 105.0, "process": 2.0, "cpu": {"pass:node": 0.9}, "runs": {"pass:node": 9}},
        {
            "t": 110.0,
            "process": 4.0,
            "cpu": {"pass:node": 1.5, "task:Informer.run:pods": 1.0},
            "runs": {"pass:node": 20, "task:Informer.run:pods": 7},
        },
        {"t": 115.0, "process": 9.0, "cpu": {"pass:node": 9.0}, "runs": {"pass:node": 99}},
    ]
    rows = report(lines, start=103.0, seconds=5.0)  # snapshots at 100 and 110
    assert rows[0] == "10.0 s window: process 3.00 CPU-s, callbacks 2.00, outside them 1.00"
    assert rows[1].split() == ["1.000", "s", "33.3", "%", "15", "runs", "pass:node"]
    assert rows[2].split()[-1] == "task:Informer.run:pods"
    with pytest.raises(ValueError, match="no snapshots around 99"):
        report(lines, start=99.0, seconds=1.0)  # no snapshot before the window


async def test_callbacks_are_booked_to_their_pass_their_watch_or_their_function() -> None:
    class Informer:
        class spec:  # what an informer has: its resource's name
            name = "pods"

        async def run(self) -> None:
            await asyncio.sleep(0)

    task = asyncio.ensure_future(Informer().run())
    step = asyncio.get_running_loop()._ready[-1]._callback  # type: ignore[attr-defined]
    assert step.__self__ is task  # the task's first step, as the loop will run it
    assert bucket(step, None).endswith("<locals>.Informer.run:pods")
    assert bucket(step, "node") == "pass:node"
    await task
    assert bucket(report, None) == "cb:report"
