"""Start and stop the control-plane processes, tracked by pid in a state file.

A pid alone is not an identity (pids are reused), so each record also keeps the
process start time from ``/proc``; ``down`` only signals a pid whose start time
still matches, which makes a stale state file from a crashed run safe to act on.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from ._errors import ClusterError

_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class ProcRecord:
    name: str
    pid: int
    start_ticks: int
    log: str


def _start_ticks(pid: int) -> int | None:
    """Process start time in clock ticks since boot (field 22 of /proc/PID/stat)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces; fields resume after the last ')'.
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[19])


def is_alive(record: ProcRecord) -> bool:
    ticks = _start_ticks(record.pid)
    if ticks is None or ticks != record.start_ticks:
        return False
    state = Path(f"/proc/{record.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state != "Z"


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    """Ask the kernel to SIGTERM this child when its parent dies (Linux only)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def spawn(
    name: str, argv: Sequence[str], log: Path, env: dict[str, str], tie_to_parent: bool
) -> tuple[subprocess.Popen[bytes], ProcRecord]:
    """Start ``argv`` in its own session, logging to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        preexec: Callable[[], None] | None = _die_with_parent if tie_to_parent else None
        try:
            proc = subprocess.Popen(
                list(argv),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
                preexec_fn=preexec,
            )
        except OSError as err:
            raise ClusterError(
                f"cannot start {name} ({argv[0]}): {err}", "rebuild the cache"
            ) from err
    ticks = _start_ticks(proc.pid) or 0
    return proc, ProcRecord(name=name, pid=proc.pid, start_ticks=ticks, log=str(log))


def terminate(
    records: Sequence[ProcRecord],
    children: Mapping[int, subprocess.Popen[bytes]] | None = None,
    grace: float = 10.0,
) -> list[str]:
    """SIGTERM every live recorded process (whole process group), then SIGKILL stragglers.

    ``children`` are the Popen handles when this process started them, polled so
    they are reaped rather than left as zombies. Returns the names stopped.
    """
    kids = children or {}

    def _reap() -> None:
        for child in kids.values():
            child.poll()

    live = [r for r in records if is_alive(r)]
    for record in reversed(live):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(record.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(is_alive(r) for r in live):
        _reap()
        time.sleep(0.1)
    for record in live:
        if is_alive(record):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(record.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and any(is_alive(r) for r in live):
        _reap()
        time.sleep(0.05)
    return [r.name for r in live]


def save(path: Path, records: Sequence[ProcRecord], extra: dict[str, object]) -> None:
    payload = {"processes": [asdict(r) for r in records], **extra}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, indent=2))
    tmp.replace(path)


def load(path: Path) -> tuple[list[ProcRecord], dict[str, object]]:
    try:
        payload = json.loads(path.read_text())
    except FileNotFoundError:
        return [], {}
    except (OSError, ValueError) as err:
        raise ClusterError(
            f"cluster state file {path} is unreadable: {err}",
            "remove the directory by hand once no cluster process is running",
        ) from err
    records = [ProcRecord(**r) for r in payload.pop("processes", [])]
    return records, payload
