"""A de-duplicating work queue with one serial worker per key.

A key (``cluster``, ``node/<name>``) is never processed by two workers at once;
adding a key while it is being processed marks it dirty so it runs once more
afterwards, and adding it while queued is a no-op. Failures are retried with the
shared capped, jittered backoff per key (``gpuop.kube.backoff``). This is what keeps
event storms from becoming reconcile storms: a thousand events for one node cost
one pass. The queue also says how long its oldest running key has run, so
``/healthz`` can tell a stuck worker from a busy one without asking the API server.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from gpuop.kube.backoff import Backoff
from gpuop.log import get_logger

log = get_logger(__name__)

Reconcile = Callable[[str], Awaitable[None]]


@dataclass
class QueueStats:
    processed: int = 0
    failed: int = 0
    retries_scheduled: int = 0
    last_durations: dict[str, float] = field(default_factory=dict)


class WorkQueue:
    """Keys in, reconcile calls out; ``workers`` keys in parallel, each key serial."""

    def __init__(
        self,
        reconcile: Reconcile,
        workers: int = 8,
        base_delay: float = 0.2,
        max_delay: float = 60.0,
    ) -> None:
        self._reconcile = reconcile
        self._workers = workers
        self.retry = Backoff(base_delay, max_delay)
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._queued: set[str] = set()
        self._active: set[str] = set()
        #: When each running key started (monotonic), for the liveness check.
        self._started: dict[str, float] = {}
        self._dirty: set[str] = set()
        self._failures: dict[str, int] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._idle = asyncio.Event()
        self._idle.set()
        self.stats = QueueStats()

    # ---------------------------------------------------------------- adding
    def add(self, key: str) -> None:
        if key in self._active:
            self._dirty.add(key)
            return
        if key in self._queued:
            return
        self._queued.add(key)
        self._idle.clear()
        self._queue.put_nowait(key)

    def add_after(self, key: str, delay: float) -> None:
        """Run ``key`` again after ``delay`` (the earliest pending timer wins)."""
        loop = asyncio.get_running_loop()
        existing = self._timers.get(key)
        due = loop.time() + delay
        if existing is not None and existing.when() <= due:
            return
        if existing is not None:
            existing.cancel()
        self._idle.clear()
        self._timers[key] = loop.call_at(due, self._fire, key)

    def _fire(self, key: str) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def forget(self, key: str) -> None:
        """Drop a key's backoff history and pending timer (the object is gone)."""
        self._failures.pop(key, None)
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        if self.is_idle():
            self._idle.set()

    def backoff(self, failures: int) -> float:
        """Delay before retry number ``failures``: doubling from the base, capped, jittered."""
        return self.retry.delay(failures)

    # ------------------------------------------------------------- observing
    def __len__(self) -> int:
        return len(self._queued) + len(self._active)

    def longest_running(self, now: float | None = None) -> tuple[str, float] | None:
        """The key that has been reconciling longest and for how many seconds."""
        if not self._started:
            return None
        key, started = min(self._started.items(), key=lambda item: item[1])
        return key, (time.monotonic() if now is None else now) - started

    def is_idle(self) -> bool:
        return not self._queued and not self._active and not self._timers

    def quiet_within(self, horizon: float) -> bool:
        """No key queued or running and no timer due in the next ``horizon`` seconds: a
        far-off timer (a node counted as stuck after ten minutes) is not pending work."""
        if self._queued or self._active:
            return False
        limit = asyncio.get_running_loop().time() + horizon
        return all(timer.when() > limit for timer in self._timers.values())

    async def wait_idle(self) -> None:
        while not self.is_idle():
            self._idle.clear()
            await self._idle.wait()

    # ---------------------------------------------------------------- running
    async def run(self) -> None:
        """Run the workers until cancelled."""
        async with asyncio.TaskGroup() as group:
            for index in range(self._workers):
                group.create_task(self._worker(), name=f"worker-{index}")

    async def _worker(self) -> None:
        while True:
            key = await self._queue.get()
            self._queued.discard(key)
            self._active.add(key)
            started = time.monotonic()
            self._started[key] = started
            try:
                await self._reconcile(key)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # one key's failure never stops the queue
                failures = self._failures.get(key, 0) + 1
                self._failures[key] = failures
                delay = self.backoff(failures)
                self.stats.failed += 1
                self.stats.retries_scheduled += 1
                log.warning(
                    "reconcile failed",
                    key=key,
                    attempt=failures,
                    retry_in=round(delay, 2),
                    error=f"{type(err).__name__}: {err}",
                    exc_info=failures == 1,
                )
                self.add_after(key, delay)
            else:
                self._failures.pop(key, None)
            finally:
                self.stats.processed += 1
                self.stats.last_durations[key.split("/", 1)[0]] = time.monotonic() - started
                self._active.discard(key)
                self._started.pop(key, None)
                self._queue.task_done()
                if key in self._dirty:
                    self._dirty.discard(key)
                    self.add(key)
                if self.is_idle():
                    self._idle.set()
