"""NVIDIADriver status: what a resource's status should say, and writing only changes.

Split from the reconcile so the status shape (conditions, state) is one pure function and
the write path (patch only a difference, an Event on a state change) is one method.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from pydantic import ValidationError

from components.driver import DAEMONSET_NAME as POLICY_DRIVER_DS
from crd import (
    CONDITION_ERROR,
    CONDITION_READY,
    NVD_API_VERSION,
    NVD_KIND,
    REASON_DRIVER_NOT_READY,
    Condition,
    NVIDIADriverStatus,
    ready_error_conditions,
    set_conditions,
)
from gpuop.controller._status import StatusWrite, status_patch, write_status
from gpuop.informer import Informer, Obj
from gpuop.log import get_logger
from gpuop.rest import by_kind

if TYPE_CHECKING:
    from gpuop.events import EventRecorder
    from gpuop.rest import Rest

log = get_logger(__name__)

NVD = by_kind(NVD_API_VERSION, NVD_KIND)
#: The condition types this writer owns on an NVIDIADriver.
_OWNED = frozenset({CONDITION_READY, CONDITION_ERROR})
Verdict = tuple[bool, str, str]
"""(holds, reason, message) of one condition."""


def _now() -> datetime:
    return datetime.now(UTC)


def is_policy_driver(name: str) -> bool:
    """Whether a DaemonSet (or the `app` of a pod) is the ClusterPolicy's driver."""
    return name == POLICY_DRIVER_DS or name.startswith(POLICY_DRIVER_DS + "-")


def is_driver_object(obj: Obj) -> bool:
    """Whether an object (a DaemonSet, say) is part of a driver: the ClusterPolicy's
    (by name) or an NVIDIADriver's (by owner)."""
    return nvd_owner(obj) is not None or is_policy_driver(obj["metadata"]["name"])


def nvd_owner(obj: Obj) -> str | None:
    """Name of the NVIDIADriver that controls ``obj``, if one does."""
    for ref in obj["metadata"].get("ownerReferences") or ():
        if ref.get("kind") == NVD_KIND and ref.get("controller"):
            return str(ref["name"])
    return None


def desired_status(
    state: str,
    ready: Verdict,
    error: Verdict,
    namespace: str,
    generation: int | None,
    previous: Obj | None,
) -> Obj:
    """The status to hold: Ready and Error conditions keep their transition times
    when unchanged (set_conditions), so a repeated verdict writes nothing."""
    new = ready_error_conditions(ready, error, generation, _now())
    old: list[Condition] = []
    if previous:
        try:
            old = NVIDIADriverStatus.model_validate(previous).conditions or []
        except ValidationError:
            old = []
    status = NVIDIADriverStatus(
        state=state,  # type: ignore[arg-type]
        namespace=namespace,
        conditions=set_conditions(old, *new),
    )
    dumped: Obj = status.model_dump(by_alias=True, exclude_none=True, mode="json")
    return dumped


class StatusWriter:
    """Writes NVIDIADriver statuses through the client and Event recorder it is given."""

    def __init__(
        self, rest: Rest, namespace: str, events: EventRecorder, drivers: Informer
    ) -> None:
        self._rest = rest
        self._namespace = namespace
        self._events = events
        self._drivers = drivers

    async def write(
        self,
        raw: Obj,
        state: str,
        ready: Verdict,
        error: Verdict,
    ) -> None:
        """Patch the resource's status (only what changed) and tell of a new state."""
        meta = raw["metadata"]
        desired = desired_status(
            state,
            ready,
            error,
            self._namespace,
            meta.get("generation"),
            raw.get("status"),
        )
        if status_patch(raw.get("status"), desired) is None:
            return
        # Ready and Error only: a condition someone else wrote is kept, even one written
        # after our cache was filled (see write_status).
        mine = [c for c in desired.get("conditions") or [] if c["type"] in _OWNED]
        write = StatusWrite(_OWNED, mine, fields=desired)
        if await write_status(self._rest, NVD, self._drivers, raw, write) is None:
            return
        if state != (raw.get("status") or {}).get("state"):
            log.info("NVIDIADriver state", nvidiadriver=meta["name"], state=state)
            involved = {"apiVersion": NVD_API_VERSION, "kind": NVD_KIND, "metadata": meta}
            reason, message = (ready[1], ready[2]) if ready[0] else (error[1], error[2])
            await self._events.record(
                involved,
                reason,
                f"NVIDIADriver is {state}: {message}",
                warning=state == "notReady" and error[1] != REASON_DRIVER_NOT_READY,
            )
