"""What a pass says about its own key, as controller-runtime's ``reconcile.Result``.

A unit returns when it wants to run again (a retry timer, a look later) instead of
touching the work queue; the operator's worker loop (``Operator._reconcile``) queues
its key again after that long. Keys of other units are woken through the router.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Result:
    """``requeue_after``: seconds until the pass wants to run again; None: only when
    news wakes it."""

    requeue_after: float | None = None


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
