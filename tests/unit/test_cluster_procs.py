"""Process tracking: pids are checked against their start time before any signal."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

from gpuop.devcluster import _procs


def test_spawn_record_and_terminate(tmp_path: Path) -> None:
    proc, record = _procs.spawn(
        "sleeper",
        [sys.executable, "-c", "import time; time.sleep(60)"],
        tmp_path / "logs" / "sleeper.log",
        dict(os.environ),
        tie_to_parent=True,
    )
    assert _procs.is_alive(record)
    state = tmp_path / "state.json"
    _procs.save(state, [record], {"server": "https://127.0.0.1:1"})
    records, extra = _procs.load(state)
    assert records == [record]
    assert extra == {"server": "https://127.0.0.1:1"}
    assert _procs.terminate(records, {proc.pid: proc}, grace=5) == ["sleeper"]
    assert proc.poll() is not None
    assert not _procs.is_alive(record)


def test_a_stale_record_with_a_reused_pid_is_never_signalled(tmp_path: Path) -> None:
    proc, record = _procs.spawn(
        "bystander",
        [sys.executable, "-c", "import time; time.sleep(60)"],
        tmp_path / "b.log",
        dict(os.environ),
        tie_to_parent=True,
    )
    try:
        stale = dataclasses.replace(record, name="old", start_ticks=record.start_ticks - 1)
        assert not _procs.is_alive(stale)
        assert _procs.terminate([stale], grace=0.2) == []
        assert proc.poll() is None  # the bystander with that pid still runs
    finally:
        proc.kill()
        proc.wait()


def test_missing_state_file_means_nothing_recorded(tmp_path: Path) -> None:
    assert _procs.load(tmp_path / "none.json") == ([], {})
