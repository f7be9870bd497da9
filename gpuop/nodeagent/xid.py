"""Counts XID errors as the driver reports them, in the background.

NVML only hands out XID events to a registered event set, so they are seen as they
happen rather than at scrape time. Waiting blocks, so each wait runs in a thread with a
short timeout, which also bounds how long shutdown waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import Counter
from collections.abc import Callable

from gpuop.log import get_logger
from gpuop.nodeagent.driver import nvml_failure
from gpuop.nodeagent.nvml import Nvml, NvmlError, XidEvent, XidEventSet
from gpuop.nodeagent.timing import sleep_or_stop

log = get_logger(__name__)


class XidCounts:
    """Thread-safe tally of (gpu index, xid) since the exporter started."""

    def __init__(self) -> None:
        self._counts: Counter[tuple[int, int]] = Counter()
        self._lock = threading.Lock()

    def add(self, event: XidEvent) -> None:
        with self._lock:
            self._counts[(event.gpu_index, event.xid)] += 1

    def snapshot(self) -> dict[tuple[int, int], int]:
        with self._lock:
            return dict(self._counts)


class XidWatcher:
    def __init__(
        self,
        nvml: Nvml,
        counts: XidCounts,
        *,
        poll_ms: int = 1000,
        retry_s: float = 30.0,
        on_event: Callable[[XidEvent], None] | None = None,
    ) -> None:
        self.nvml = nvml
        self.counts = counts
        #: Called on the event loop after each event is counted (the health reporter
        #: re-checks at once instead of at its next interval).
        self.on_event = on_event
        self.poll_ms = poll_ms
        self.retry_s = retry_s
        self.watching = False

    def _open(self) -> XidEventSet:
        self.nvml.init()
        try:
            return self.nvml.xid_events()
        except BaseException:
            with contextlib.suppress(NvmlError):
                self.nvml.shutdown()
            raise

    def _close(self, event_set: XidEventSet) -> None:
        with contextlib.suppress(NvmlError):
            event_set.close()
        with contextlib.suppress(NvmlError):
            self.nvml.shutdown()

    async def run(self, stop: asyncio.Event) -> None:
        """Watch until ``stop``; on any NVML failure log it, wait ``retry_s`` and start over."""
        while not stop.is_set():
            try:
                event_set = await asyncio.to_thread(self._open)
            except NvmlError as exc:
                log.warning("xid events unavailable", reason=nvml_failure(exc))
                await sleep_or_stop(stop, self.retry_s)
                continue
            self.watching = True
            try:
                while not stop.is_set():
                    event = await asyncio.to_thread(event_set.wait, self.poll_ms)
                    if event is not None:
                        self.counts.add(event)
                        log.warning("xid error", gpu=event.gpu_index, xid=event.xid)
                        if self.on_event is not None:
                            self.on_event(event)
            except NvmlError as exc:
                log.warning("xid watch interrupted", reason=nvml_failure(exc))
            finally:
                self.watching = False
                await asyncio.shield(asyncio.to_thread(self._close, event_set))
            await sleep_or_stop(stop, self.retry_s)
