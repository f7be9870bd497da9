"""What a pass says about its own key, as controller-runtime's ``reconcile.Result``.

A unit returns when it wants to run again (a retry timer, a look later) instead of
touching the work queue; the operator's worker loop (``Operator._reconcile``) queues
its key again after that long. Keys of other units are woken through the router; a
node pass also says what its own writes woke (``fleet``, ``progress``), as the router
would have said for a watch event (our own writes wake none).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Result:
    """``requeue_after``: seconds until the pass wants to run again; None: only when
    news wakes it."""

    requeue_after: float | None = None
    now: bool = False
    """Run again at once (after this run: the queue marks a running key dirty)."""
    forget: bool = False
    """Drop the key's pending timer and backoff first (no clock runs for it now)."""
    fleet: bool = False
    """Wake the fleet pass, coalesced (``NodeReconciler.fleet_soon``)."""
    progress: bool = False
    """Wake the cluster pass, paced (``Operator._progress``)."""

    def apply(
        self,
        key: str,
        queue: _Queue,
        fleet_soon: Callable[[], None],
        progress: Callable[[], None],
    ) -> None:
        """What the worker loop does with a pass's result, in this order."""
        if self.forget:
            queue.forget(key)
        if self.requeue_after is not None:
            queue.add_after(key, self.requeue_after)
        if self.now:
            queue.add(key)
        if self.progress:
            progress()
        if self.fleet:
            fleet_soon()


class _Queue(Protocol):
    def add(self, key: str) -> None: ...
    def add_after(self, key: str, delay: float) -> None: ...
    def forget(self, key: str) -> None: ...


DONE = Result()


class Again:
    """Collects, during one pass, when it wants to run again: its helpers (the applier's
    refusal timers, the status writer's coalescing) are handed ``after``; the soonest
    wins, as the queue's own timers do."""

    def __init__(self) -> None:
        self._after: float | None = None

    def after(self, delay: float) -> None:
        self._after = delay if self._after is None else min(self._after, delay)

    def take(self) -> Result:
        """The pass's result, forgetting it (the next pass starts afresh)."""
        result, self._after = Result(self._after), None
        return result
