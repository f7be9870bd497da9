"""Turning a rollout outcome into a ClusterPolicy status, and the patch that writes it.

:func:`cluster_status` is pure: what the cluster pass observed (and when) in, the status
and the ``reconciliation_status`` metric out, so every branch is a unit test.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from crd import (
    CONDITION_ERROR,
    CONDITION_READY,
    CONDITION_UNSUPPORTED_FIELDS,
    REASON_DRIVER_CONFIG_MISSING,
    REASON_INVALID_SPEC,
    REASON_NFD_LABELS_MISSING,
    REASON_OPERAND_NOT_READY,
    REASON_RECONCILE_FAILED,
    ClusterPolicy,
    ClusterPolicyStatus,
    ComponentState,
    Condition,
    find_condition,
    not_ready_status,
    ready_status,
    set_condition,
    unsupported_fields,
    with_unsupported_fields,
)
from crd import (
    format_time as format_condition_time,
)
from gpuop.controller._rollout_view import RolloutView
from gpuop.informer import Informer, Obj
from gpuop.kinds import by_kind
from gpuop.metrics import STATUS_ERROR, STATUS_NOT_READY, STATUS_READY
from gpuop.rest import Kind, Rest
from statemachine.remediation import (
    BLIND_MESSAGE,
    CONDITION_REMEDIATION_BLIND,
    REASON_NODE_AGENT_DISABLED,
    blind,
)
from statemachine.rollout import ROLLOUT_ORDER, ComponentStatus, RolloutPlan

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
#: A refused object is retried after this, doubling per refusal, up to the cap; an
#: event-driven pass in between does not send it again (the answer would not change).
REFUSAL_RETRY_BASE = 10.0
REFUSAL_RETRY_CAP = 600.0
#: Client errors that say "try again" rather than "this object is wrong":
#: 409 conflict, 408 timeout, 425 too early, 429 throttled.
_TRANSIENT_4XX = frozenset({408, 409, 425, 429})


def is_refusal(status: int | None) -> bool:
    """A 4xx the same object would get again (invalid, forbidden, namespace missing).

    Transient codes and 5xx are left to the work queue's backoff instead."""
    return status is not None and 400 <= status < 500 and status not in _TRANSIENT_4XX


def server_message(reason: str | None) -> str:
    """The ``message`` of the API server's Status body, else the body as it is."""
    text = (reason or "").strip()
    try:
        body = json.loads(text)
    except ValueError:
        return text[:1000]
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return str(body["message"])[:1000]
    return text[:1000]


@dataclass(frozen=True)
class Refusal:
    """One object the API server refused, for the status and the next retry."""

    kind: str
    namespace: str | None
    name: str
    code: int
    message: str
    applied_hash: str
    attempts: int
    retry_at: float

    def describe(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.kind} {where} refused by the API server ({self.code}): {self.message}"


def refusal_delay(attempts: int, base: float = REFUSAL_RETRY_BASE) -> float:
    """Delay before sending a refused object again after ``attempts`` refusals."""
    return float(min(REFUSAL_RETRY_CAP, base * 2 ** max(0, attempts - 1)))


def refusals_message(refusals: list[Refusal], limit: int = 4000) -> str:
    """One status message naming every refused object (in apply order)."""
    return "; ".join(r.describe() for r in refusals)[:limit]


def parse_status(raw: Obj) -> ClusterPolicyStatus | None:
    """The policy's stored status, or None when it has none or one we cannot read (it
    is then rewritten whole)."""
    data = raw.get("status")
    if not data:
        return None
    try:
        return ClusterPolicyStatus.model_validate(data)
    except ValueError:
        return None


# ------------------------------------------------------------ the status itself
NFD_MISSING_MESSAGE = (
    "no node has NFD's PCI labels (feature.node.kubernetes.io/pci-10de.present);"
    " deploy Node Feature Discovery or enable it in the chart"
)


@dataclass(frozen=True)
class ClusterObservation:
    """What one cluster pass saw and did, as far as the ClusterPolicy status tells."""

    namespace: str
    model: ClusterPolicy
    generation: int | None
    previous: ClusterPolicyStatus | None
    plan: RolloutPlan
    snapshot: Mapping[str, ComponentStatus]
    actual: Mapping[str, tuple[bool, str]]
    """Each enabled component's (ready, message) after node counts and hand-over."""
    view: RolloutView
    refused: Sequence[Refusal]
    has_nfd: bool
    config_problems: Sequence[str] = ()
    """Why the driver's site configuration could not be rendered (the driver DaemonSets
    were left as they are)."""


def cluster_status(seen: ClusterObservation, now: datetime) -> tuple[ClusterPolicyStatus, int]:
    """The status the active policy should hold, and the ``reconciliation_status`` metric
    (``STATUS_*``) that goes with it."""
    not_ready = [n for n, (ok, _) in seen.actual.items() if not ok]
    why: tuple[str, str, bool] | None  # (reason, message, error) of a notReady status
    if seen.refused:
        # The server's answer, not ours: an admin must see which object and why,
        # and the state must not keep saying ready (issue 14, item 7).
        why = (REASON_RECONCILE_FAILED, refusals_message(list(seen.refused)), True)
        outcome = STATUS_ERROR
    elif seen.config_problems:
        message = "driver DaemonSets left unchanged: " + "; ".join(seen.config_problems)
        why = (REASON_DRIVER_CONFIG_MISSING, message, True)
        outcome = STATUS_ERROR
    elif not seen.has_nfd:
        why = (REASON_NFD_LABELS_MISSING, NFD_MISSING_MESSAGE, False)
        outcome = STATUS_NOT_READY
    elif seen.plan.ready and not not_ready:
        why = None
        outcome = STATUS_READY
    else:
        blocking = seen.plan.current or not_ready[0]
        detail = seen.actual.get(blocking, (False, ""))[1]
        why = (REASON_OPERAND_NOT_READY, rollout_message(seen.view, blocking, detail), False)
        outcome = STATUS_NOT_READY
    if why is None:
        status = ready_status(
            seen.namespace, generation=seen.generation, now=now, previous=seen.previous
        )
    else:
        reason, message, error = why
        status = not_ready_status(
            seen.namespace,
            reason=reason,
            message=message,
            error=error,
            generation=seen.generation,
            now=now,
            previous=seen.previous,
        )
    components = component_states(seen.snapshot, seen.actual, seen.view)
    status = status.model_copy(update={"rollout_state": seen.plan.state, "components": components})
    return flag_spec_conditions(status, seen.model, seen.generation, now), outcome


def invalid_status(
    namespace: str,
    model: ClusterPolicy | None,
    problems: Sequence[str],
    generation: int | None,
    previous: ClusterPolicyStatus | None,
    now: datetime,
) -> ClusterPolicyStatus:
    """The status of a policy that does not validate: notReady, with every problem."""
    message = "invalid ClusterPolicy: " + "; ".join(problems)
    status = not_ready_status(
        namespace,
        reason=REASON_INVALID_SPEC,
        message=message[:32000],
        error=True,
        generation=generation,
        now=now,
        previous=previous,
    )
    return flag_spec_conditions(status, model, generation, now)


def flag_spec_conditions(
    status: ClusterPolicyStatus,
    model: ClusterPolicy | None,
    generation: int | None,
    now: datetime,
) -> ClusterPolicyStatus:
    """The conditions read off the active policy's spec alone (``model`` None: none)."""
    return flag_blind(flag_unsupported(status, model, generation, now), model, generation, now)


def flag_blind(
    status: ClusterPolicyStatus,
    model: ClusterPolicy | None,
    generation: int | None,
    now: datetime,
) -> ClusterPolicyStatus:
    """RemediationBlind while remediation is on without the node agent that reports
    GPUHealthy; absent otherwise, so a policy without remediation keeps upstream's
    status."""
    if model is None or not blind(model.spec):
        if find_condition(status.conditions, CONDITION_REMEDIATION_BLIND) is None:
            return status
        others = [c for c in status.conditions or () if c.type != CONDITION_REMEDIATION_BLIND]
        return status.model_copy(update={"conditions": others or None})
    condition = Condition(
        type=CONDITION_REMEDIATION_BLIND,
        status="True",
        reason=REASON_NODE_AGENT_DISABLED,
        message=BLIND_MESSAGE,
        observed_generation=generation,
        last_transition_time=format_condition_time(now),
    )
    return status.model_copy(update={"conditions": set_condition(status.conditions, condition)})


def flag_unsupported(
    status: ClusterPolicyStatus,
    model: ClusterPolicy | None,
    generation: int | None,
    now: datetime,
) -> ClusterPolicyStatus:
    """Add the UnsupportedFields condition for what the policy sets but we ignore."""
    fields = [str(f) for f in unsupported_fields(model.spec)] if model is not None else []
    return with_unsupported_fields(status, fields, generation=generation, now=now)


def component_states(
    snapshot: Mapping[str, ComponentStatus],
    actual: Mapping[str, tuple[bool, str]],
    view: RolloutView,
) -> list[ComponentState]:
    """``status.components``: every state in rollout order, with node counts for the
    ones that run pods on nodes."""
    states: list[ComponentState] = []
    for name in ROLLOUT_ORDER:
        if not snapshot[name].enabled:
            states.append(ComponentState(name=name, state="disabled"))
            continue
        ready, message = actual.get(name, (True, ""))
        counts = view.counts.get(name)
        states.append(
            ComponentState(
                name=name,
                state="ready" if ready else "notReady",
                message=message or None,
                nodes_ready=counts.ready if counts else None,
                nodes_not_ready=counts.not_ready if counts else None,
                nodes_at=counts.at if counts else None,
            )
        )
    return states


def rollout_message(view: RolloutView, blocking: str, detail: str) -> str:
    """The notReady message: stuck nodes (and where) first, then the first component,
    in rollout order, that is not ready everywhere."""
    component = f"{blocking} is not ready: {detail}"
    return f"{view.message}; {component}" if view.message else component
