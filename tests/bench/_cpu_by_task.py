"""``python -m tests.bench._cpu_by_task ARGS``: ``gpuop ARGS`` with its CPU counted per task.

For finding where the operator's CPU goes (``GPUOP_BENCH_CPU_BY_TASK=DIR``); never for
the figures themselves (it adds two clock reads to every callback). py-spy samples wall
time: on two cores shared with the control plane a preempted operator still looks
busy, so its shares follow the preemption, not the work. Here every callback the event
loop runs adds its ``time.thread_time`` to a bucket named for what ran: a work-queue
pass by its key's kind (``pass:node``, ``pass:cluster``), a watch by its resource
(``task:Informer.run:pods``), any other task by its coroutine, a transport callback by
its function (``cb:_SelectorSocketTransport._read_ready``). What the process spent
outside callbacks (the selector, the garbage collector, threads) is the rest.

Every ``SNAPSHOT_S`` the running totals are appended to ``$GPUOP_CPU_BY_TASK_OUT`` as a
JSON line; ``python -m tests.bench._cpu_by_task --report FILE --from EPOCH --seconds N``
prints what was spent between the snapshots around a window (a rollout's
``policy_applied_at`` and ``time_to_ready_s``).
"""

from __future__ import annotations

import argparse
import asyncio
import asyncio.events
import collections
import json
import os
import sys
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

SNAPSHOT_S = 5.0

SPENT: collections.defaultdict[str, float] = collections.defaultdict(float)
RUNS: collections.Counter[str] = collections.Counter()
#: The work-queue key kind each worker task is running a pass for.
PASS_OF: dict[asyncio.Task[Any], str] = {}
_NAMES: weakref.WeakKeyDictionary[asyncio.Task[Any], str] = weakref.WeakKeyDictionary()


def bucket(callback: Any, pass_kind: str | None) -> str:
    """The bucket a callback's CPU goes to (``pass_kind``: the pass its task ran)."""
    task = getattr(callback, "__self__", None)
    if not isinstance(task, asyncio.Task):
        fn = getattr(callback, "__func__", callback)
        return "cb:" + getattr(fn, "__qualname__", repr(fn))
    if pass_kind is not None:
        return "pass:" + pass_kind
    name = _NAMES.get(task)
    if name is None:
        coro = task.get_coro()
        name = getattr(coro, "__qualname__", repr(coro))
        frame = getattr(coro, "cr_frame", None)
        spec = getattr(frame.f_locals.get("self"), "spec", None) if frame else None
        if spec is not None and hasattr(spec, "name"):
            name += ":" + str(spec.name)
        _NAMES[task] = name
    return "task:" + name


def install() -> None:
    """Count every callback of every event loop, and name work-queue passes."""
    from gpuop.kube.workqueue import WorkQueue

    run = asyncio.events.Handle._run
    clock = time.thread_time

    def counted(handle: asyncio.events.Handle) -> None:
        task = getattr(handle._callback, "__self__", None)  # type: ignore[attr-defined]
        before = PASS_OF.get(task) if isinstance(task, asyncio.Task) else None
        started = clock()
        try:
            run(handle)
        finally:
            after = PASS_OF.get(task) if isinstance(task, asyncio.Task) else None
            key = bucket(handle._callback, before or after)  # type: ignore[attr-defined]
            SPENT[key] += clock() - started
            RUNS[key] += 1

    asyncio.events.Handle._run = counted  # type: ignore[assignment,method-assign]
    init = WorkQueue.__init__

    def named_passes(
        queue: WorkQueue, reconcile: Callable[[str], Awaitable[Any]], *args: Any, **kw: Any
    ) -> None:
        async def one(key: str) -> Any:
            task = asyncio.current_task()
            assert task is not None
            PASS_OF[task] = key.split("/", 1)[0]
            try:
                return await reconcile(key)
            finally:
                PASS_OF.pop(task, None)

        init(queue, one, *args, **kw)

    WorkQueue.__init__ = named_passes  # type: ignore[assignment,method-assign]


def _snapshots(path: str) -> None:
    while True:
        time.sleep(SNAPSHOT_S)
        # dict() of a dict copies it in one step under the GIL, as the loop adds to it.
        spent, runs = dict(SPENT), dict(RUNS)
        line = {"t": time.time(), "process": time.process_time(), "cpu": spent, "runs": runs}
        with open(path, "a") as out:
            out.write(json.dumps(line) + "\n")


def report(lines: list[dict[str, Any]], start: float, seconds: float) -> list[str]:
    """What was spent between the last snapshot at or before ``start`` and the first
    at or after ``start + seconds``, biggest first."""
    earlier = [s for s in lines if s["t"] <= start]
    later = [s for s in lines if s["t"] >= start + seconds]
    if not earlier or not later:
        raise ValueError(f"no snapshots around {start:.0f} + {seconds:.0f} s")
    before = max(earlier, key=lambda s: s["t"])
    after = min(later, key=lambda s: s["t"])
    process = after["process"] - before["process"]
    spent = {k: v - before["cpu"].get(k, 0.0) for k, v in after["cpu"].items()}
    runs = {k: n - before["runs"].get(k, 0) for k, n in after["runs"].items()}
    counted = sum(spent.values())
    rows = [
        f"{after['t'] - before['t']:.1f} s window: process {process:.2f} CPU-s, "
        f"callbacks {counted:.2f}, outside them {process - counted:.2f}"
    ]
    for key, cpu in sorted(spent.items(), key=lambda kv: -kv[1]):
        if cpu >= 0.001:
            share = 100 * cpu / process if process else 0.0
            rows.append(f"{cpu:8.3f} s {share:5.1f} % {runs[key]:8d} runs  {key}")
    return rows


def main() -> int:
    if "--report" in sys.argv:
        parser = argparse.ArgumentParser(prog="python -m tests.bench._cpu_by_task")
        parser.add_argument("--report", required=True, help="a $GPUOP_CPU_BY_TASK_OUT file")
        parser.add_argument("--from", dest="start", type=float, required=True, help="epoch")
        parser.add_argument("--seconds", type=float, required=True)
        args = parser.parse_args()
        try:
            with open(args.report) as lines:
                rows = report([json.loads(x) for x in lines], args.start, args.seconds)
        except (OSError, ValueError) as err:
            print(f"cpu_by_task: {args.report}: {err}", file=sys.stderr)
            return 2
        print("\n".join(rows))
        return 0
    install()
    threading.Thread(
        target=_snapshots, args=(os.environ["GPUOP_CPU_BY_TASK_OUT"],), daemon=True
    ).start()
    from gpuop.cli import main as gpuop_main

    sys.argv[0] = "gpuop"
    return gpuop_main()


if __name__ == "__main__":
    sys.exit(main())
