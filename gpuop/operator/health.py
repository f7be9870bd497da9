"""Liveness: is every root loop of the process alive and making progress?

``/healthz`` used to answer ok unconditionally, so a process whose loops were stuck
or dead was never restarted. Each loop now reports on itself from memory (a
liveness probe must not add requests to the API server): an informer says how long
it has been unable to list or watch, the work queue how long its oldest running
key has run, and a root task that ended is dead. A restart does not fix an API
server that is down, so the informer threshold is generous: it catches a process
whose connections are wedged while the rest of the cluster is fine.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from gpuop.kube.informer import Informer
from gpuop.kube.workqueue import WorkQueue

#: An informer unable to list or watch for this long makes the process unhealthy.
UNAVAILABLE_AFTER = 180.0
#: No reconcile waits on anything unbounded (requests time out after 30 s, drains
#: are steps, not waits), so one running this long is stuck.
STUCK_AFTER = 600.0


@dataclass
class Liveness:
    """What ``/healthz`` checks; sources are callables so they can appear later
    (a follower starts its informers only once it leads)."""

    informers: Callable[[], Iterable[Informer]] = list
    queue: Callable[[], WorkQueue | None] = lambda: None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    unavailable_after: float = UNAVAILABLE_AFTER
    stuck_after: float = STUCK_AFTER

    def check(self, now: float | None = None) -> tuple[bool, str]:
        """``(ok, why)``: every problem found, not just the first."""
        now = time.monotonic() if now is None else now
        problems: list[str] = []
        for task in self.tasks:
            if task.done() and not task.cancelled():
                problems.append(f"task {task.get_name()} ended")
        for informer in self.informers():
            down = informer.unavailable_for(now)
            if down > self.unavailable_after:
                problems.append(f"watch {informer.spec.name} failing for {down:.0f}s")
        queue = self.queue()
        busiest = queue.longest_running(now) if queue is not None else None
        if busiest is not None and busiest[1] > self.stuck_after:
            problems.append(f"reconcile {busiest[0]} running for {busiest[1]:.0f}s")
        return (not problems, "; ".join(problems) or "ok")
