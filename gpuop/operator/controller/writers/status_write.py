"""Writing a ClusterPolicy's (or an NVIDIADriver's) status: the patch, the
conditions each writer owns, and the server's refusals as the status reports them.

What the status says is assembled in :mod:`gpuop.operator.controller.views.cluster_status`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from crd import (
    CONDITION_ERROR,
    CONDITION_READY,
    CONDITION_UNSUPPORTED_FIELDS,
    ClusterPolicyStatus,
    Condition,
    set_condition,
)
from crd import (
    format_time as format_condition_time,
)
from gpuop.kube.informer import Informer, Obj
from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Kind, Rest
from gpuop.operator.controller.views.objects import parse_status
from statemachine.remediation import (
    CONDITION_REMEDIATION_BLIND,
)

POLICY = by_kind("nvidia.com/v1", "ClusterPolicy")


#: The condition types the cluster pass owns (RemediationBlind too: it follows from the
#: spec alone); every other type on a policy belongs to another writer
#: (RemediationPaused, DriverUpgradeGate) and is never dropped by it.
CLUSTER_PASS_CONDITIONS = frozenset(
    {
        CONDITION_READY,
        CONDITION_ERROR,
        CONDITION_UNSUPPORTED_FIELDS,
        CONDITION_REMEDIATION_BLIND,
    }
)
#: A status write that meets a newer object re-reads it and tries again, this often.
STATUS_WRITE_ATTEMPTS = 5


def merge_owned(
    stored: Sequence[Obj] | None, ours: Sequence[Obj], owned: Collection[str]
) -> list[Obj]:
    """``stored`` with the conditions of the ``owned`` types replaced by ``ours``: ours
    take their type's place (new types go last), every other type stays exactly as
    stored, so a writer never drops or rewrites another writer's condition."""
    mine = {c["type"]: c for c in ours}
    merged: list[Obj] = []
    for cond in stored or ():
        kind = cond.get("type")
        if kind not in owned:
            merged.append(cond)
        elif kind in mine:
            merged.append(mine.pop(kind))
    merged.extend(c for c in ours if c["type"] in mine)
    return merged


@dataclass(frozen=True)
class StatusWrite:
    """What one writer puts in a status: its conditions (of ``owned`` types; an owned
    type it has no condition for is removed) and, for the writer that owns them,
    every other status field (``fields``; None leaves them as stored)."""

    owned: frozenset[str]
    conditions: Sequence[Obj] = ()
    fields: Obj | None = None

    def __post_init__(self) -> None:
        strays = sorted({c["type"] for c in self.conditions} - self.owned)
        if strays:
            raise ValueError(f"condition(s) {', '.join(strays)} not owned by this writer")

    def status_for(self, stored: Obj | None) -> Obj:
        """The whole status this writer wants, given what is stored now."""
        stored = stored or {}
        if self.fields is not None:
            status = {k: v for k, v in self.fields.items() if k != "conditions"}
        else:
            status = {k: v for k, v in stored.items() if k != "conditions"}
        conditions = merge_owned(stored.get("conditions"), self.conditions, self.owned)
        if conditions:
            status["conditions"] = conditions
        return status


async def write_status(
    rest: Rest, kind: Kind, cache: Informer, raw: Obj, write: StatusWrite
) -> Obj | None:
    """Read-modify-write of a status, merged onto the freshest object.

    The patch carries the resourceVersion it was computed from; when another writer
    got there first (409) the object is read again and the write merged onto it. So
    a condition another key wrote after our cache was filled is never dropped, and a
    stale copy of it is never written back. Returns the stored object, or None when
    nothing changed or the object is gone.
    """
    name = raw["metadata"]["name"]
    for attempt in range(STATUS_WRITE_ATTEMPTS):
        patch = status_patch(raw.get("status"), write.status_for(raw.get("status")))
        if patch is None:
            return None
        patch["metadata"] = {"resourceVersion": raw["metadata"].get("resourceVersion")}
        try:
            patched: Obj = await rest.merge_patch(kind, name, patch, subresource="status")
        except ApiException as err:
            if err.status == 404:
                return None  # deleted meanwhile; its DELETED event brings the next pass
            if err.status != 409 or attempt == STATUS_WRITE_ATTEMPTS - 1:
                raise
            fresh = await rest.get(kind, name)
            if fresh is None:
                return None
            cache.observe(fresh)
            raw = fresh
            continue
        cache.observe(patched)
        return patched
    return None  # not reached: the last attempt returns or raises


async def write_policy_conditions(
    rest: Rest, policies: Informer, raw: Obj, wanted: list[Condition], *, owned: str
) -> None:
    """Write the policy's condition of type ``owned`` as ``wanted`` has it (removed when
    it has none), leaving every other condition and field as the server holds them."""
    mine = [
        c.model_dump(by_alias=True, exclude_none=True, mode="json")
        for c in wanted
        if c.type == owned
    ]
    await write_status(
        rest, POLICY, policies, raw, StatusWrite(owned=frozenset({owned}), conditions=mine)
    )


@dataclass(frozen=True)
class ConditionChange:
    """The policy's stored conditions, and what they become with one condition set."""

    stored: list[Condition]
    wanted: list[Condition]


def condition_change(
    raw: Obj,
    kind: str,
    condition: tuple[str, str, str] | None,
    now: datetime,
    *,
    parse: Callable[[Obj], Any] | None = None,
) -> ConditionChange | None:
    """Set the condition ``kind`` to (status, reason, message), or with None remove it;
    None when the stored status cannot be read (writing ours alone would drop Ready and
    Error). A condition that does not change keeps its transition time. ``parse``: how
    the stored status is read (a ClusterPolicy's unless told; it has ``conditions``)."""
    previous = (parse or parse_status)(raw)
    if previous is None and (raw.get("status") or {}).get("conditions"):
        return None
    conditions = list(previous.conditions or []) if previous is not None else []
    if condition is None:
        return ConditionChange(conditions, [c for c in conditions if c.type != kind])
    status, reason, message = condition
    new = Condition(
        type=kind,
        status=status,  # type: ignore[arg-type]
        reason=reason,
        message=message,
        observed_generation=raw["metadata"].get("generation"),
        last_transition_time=format_condition_time(now),
    )
    return ConditionChange(conditions, set_condition(conditions, new))


def status_dict(status: ClusterPolicyStatus) -> Obj:
    dumped: Obj = status.model_dump(by_alias=True, exclude_none=True, mode="json")
    return dumped


def status_patch(observed: Obj | None, desired: Obj) -> Obj | None:
    """A merge patch turning ``observed`` into ``desired``; None when they are equal.

    Keys the new status no longer has are set to null, so stale fields vanish.
    """
    observed = observed or {}
    if observed == desired:
        return None
    patch: Obj = dict(desired)
    for key in observed:
        if key not in desired:
            patch[key] = None
    return {"status": patch}


# ------------------------------------------------------------ refused objects
