"""NVIDIADriver status: what a resource's status should say, and writing only changes.

Split from the reconcile so the status shape (conditions, state) is one pure function and
the write path (patch only a difference, an Event on a state change) is one method.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from pydantic import ValidationError

from crd import (
    CONDITION_ERROR,
    CONDITION_READY,
    CONDITION_UNSUPPORTED_FIELDS,
    NVD_API_VERSION,
    NVD_KIND,
    REASON_DRIVER_NOT_READY,
    REASON_FIELDS_NOT_ACTED_ON,
    Condition,
    NVIDIADriverStatus,
    nvidiadriver_unsupported_fields,
    parse_nvidiadriver,
    ready_error_conditions,
    set_conditions,
    with_unsupported_condition,
)
from crd._status import unsupported_fields_news
from gpuop.kube.informer import Informer, Obj
from gpuop.kube.kinds import by_kind
from gpuop.log import get_logger
from gpuop.operator.controller.writers.status_write import StatusWrite, status_patch, write_status

if TYPE_CHECKING:
    from gpuop.kube.rest import Rest
    from gpuop.operator.events import EventRecorder

log = get_logger(__name__)

NVD = by_kind(NVD_API_VERSION, NVD_KIND)
#: The condition types this writer owns on an NVIDIADriver.
_OWNED = frozenset({CONDITION_READY, CONDITION_ERROR, CONDITION_UNSUPPORTED_FIELDS})
Verdict = tuple[bool, str, str]
"""(holds, reason, message) of one condition."""


def _now() -> datetime:
    return datetime.now(UTC)


def unsupported(raw: Obj) -> list[str]:
    """The fields the resource sets that we do not act on (none when it does not parse:
    its Error condition says why)."""
    try:
        spec = parse_nvidiadriver(raw).spec
    except ValidationError:
        return []
    return [str(f) for f in nvidiadriver_unsupported_fields(spec)]


def desired_status(
    state: str,
    ready: Verdict,
    error: Verdict,
    namespace: str,
    generation: int | None,
    previous: Obj | None,
    unsupported_fields: Sequence[str] = (),
) -> Obj:
    """The status to hold: Ready and Error conditions keep their transition times
    when unchanged (set_conditions), so a repeated verdict writes nothing; the
    UnsupportedFields condition names what the resource sets but we ignore, as the
    ClusterPolicy's does, so nothing is dropped in silence."""
    now = _now()
    new = ready_error_conditions(ready, error, generation, now)
    old: list[Condition] = []
    if previous:
        try:
            old = NVIDIADriverStatus.model_validate(previous).conditions or []
        except ValidationError:
            old = []
    conditions = with_unsupported_condition(
        set_conditions(old, *new), unsupported_fields, generation=generation, now=now
    )
    status = NVIDIADriverStatus(
        state=state,  # type: ignore[arg-type]
        namespace=namespace,
        conditions=conditions,
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
            unsupported(raw),
        )
        if status_patch(raw.get("status"), desired) is None:
            return
        # Our condition types only: a condition someone else wrote is kept, even one
        # written after our cache was filled (see write_status).
        mine = [c for c in desired.get("conditions") or [] if c["type"] in _OWNED]
        write = StatusWrite(_OWNED, mine, fields=desired)
        if await write_status(self._rest, NVD, self._drivers, raw, write) is None:
            return
        await self._record_unsupported(raw, mine)
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

    async def _record_unsupported(self, raw: Obj, written: list[Obj]) -> None:
        """A Warning Event naming the fields set but not acted on, once per change of the
        UnsupportedFields condition (so once per generation that sets them)."""
        stored = (raw.get("status") or {}).get("conditions") or []
        message = unsupported_fields_news(stored, written)
        if message is None:
            return
        meta = raw["metadata"]
        involved = {"apiVersion": NVD_API_VERSION, "kind": NVD_KIND, "metadata": meta}
        await self._events.record(involved, REASON_FIELDS_NOT_ACTED_ON, message, warning=True)
        log.warning(
            "NVIDIADriver sets fields gpuop does not act on",
            nvidiadriver=meta["name"],
            message=message,
        )
