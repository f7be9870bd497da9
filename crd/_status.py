"""ClusterPolicy status and pure helpers that build it.

The helpers are written so that the same observation always yields an *equal* status: a
condition keeps its `lastTransitionTime` unless its status flips, and nothing else in the
status depends on the clock. Comparing old and new status then tells the caller whether to
write at all, so a reconcile that changes nothing writes nothing (no status flapping).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import Field

from crd._common import K8sModel

State = Literal["ready", "notReady", "ignored"]
STATE_READY: State = "ready"
STATE_NOT_READY: State = "notReady"
STATE_IGNORED: State = "ignored"

CONDITION_READY = "Ready"
CONDITION_ERROR = "Error"
CONDITION_UNSUPPORTED_FIELDS = "UnsupportedFields"
"""gpuop's own condition type (upstream has only Ready and Error): True while the spec
sets fields the operator accepts but does not act on; absent otherwise."""

REASON_RECONCILED = "Reconciled"
"""Every enabled operand is deployed and ready."""
REASON_OPERAND_NOT_READY = "OperandNotReady"
"""Operands are still rolling out; not an error."""
REASON_RECONCILE_FAILED = "ReconcileFailed"
"""Writing the desired objects failed (API error, conflict)."""
REASON_INVALID_SPEC = "InvalidSpec"
"""The spec passed the API server's schema but makes no sense (see crd.validate_spec)."""
REASON_NFD_LABELS_MISSING = "NFDLabelsMissing"
REASON_DRIVER_CONFIG_MISSING = "DriverConfigMissing"
"""A ConfigMap the driver's site configuration names is missing (or the OS unknown)."""
"""No node carries Node Feature Discovery's NVIDIA PCI labels."""
REASON_IGNORED = "Ignored"
"""Another ClusterPolicy is the active one."""
REASON_NO_ERROR = "NoError"
"""Reason of an Error condition that is False."""
REASON_FIELDS_NOT_ACTED_ON = "FieldsNotActedOn"
"""Reason of the UnsupportedFields condition (and of its Warning Event)."""

_REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
_TYPE_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)


class Condition(K8sModel):
    """One observation about the policy (the metav1.Condition shape)."""

    type: Annotated[str, Field(max_length=316, pattern=_TYPE_PATTERN)]
    """Condition type: Ready or Error."""
    status: Literal["True", "False", "Unknown"]
    """Whether the condition holds."""
    observed_generation: Annotated[int, Field(ge=0)] | None = None
    """metadata.generation of the spec this condition describes."""
    last_transition_time: Annotated[str, Field(json_schema_extra={"format": "date-time"})]
    """When status last changed (RFC 3339, UTC, whole seconds)."""
    reason: Annotated[str, Field(min_length=1, max_length=1024, pattern=_REASON_PATTERN)]
    """Machine-readable CamelCase cause."""
    message: Annotated[str, Field(max_length=32768)]
    """Human-readable details."""


Conditions = Annotated[
    list[Condition],
    Field(
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}
    ),
]
"""A status's conditions: a list the API server merges by `type`, as metav1 declares it."""


class ComponentState(K8sModel):
    """Rollout progress of one operand state (a gpuop extension of upstream's status)."""

    name: str
    """Rollout state name, e.g. driver or device-plugin."""
    state: Literal["ready", "notReady", "pending", "disabled"]
    """ready, notReady (not yet ready on every node it runs on), disabled (pending: unused)."""
    message: str | None = None
    """What is missing, e.g. 3/4 pods available."""
    nodes_ready: Annotated[int, Field(ge=0)] | None = None
    """GPU nodes where this component's pod is Ready on the current revision."""
    nodes_not_ready: Annotated[int, Field(ge=0)] | None = None
    """GPU nodes it should run on whose pod is missing, not Ready or on an old revision."""
    nodes_at: Annotated[int, Field(ge=0)] | None = None
    """GPU nodes whose per-node rollout state is this component (first not Ready there)."""


class ClusterPolicyStatus(K8sModel):
    """Observed state of the policy."""

    state: State | None = None
    """ready, notReady, or ignored (another policy is active)."""
    namespace: str | None = None
    """Namespace the operands run in."""
    conditions: Conditions | None = None
    """Ready and Error conditions."""
    rollout_state: str | None = None
    """The rollout state machine's current state (``ready`` when every operand is)."""
    components: (
        Annotated[
            list[ComponentState],
            Field(
                json_schema_extra={
                    "x-kubernetes-list-type": "map",
                    "x-kubernetes-list-map-keys": ["name"],
                }
            ),
        ]
        | None
    ) = None
    """Per-state rollout progress, in rollout order."""


def format_time(moment: datetime) -> str:
    """RFC 3339 in UTC with whole seconds: the precision metav1.Time keeps."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def find_condition(conditions: Iterable[Condition] | None, type_: str) -> Condition | None:
    """The condition of that type, if any."""
    for condition in conditions or ():
        if condition.type == type_:
            return condition
    return None


def set_condition(conditions: Sequence[Condition] | None, new: Condition) -> list[Condition]:
    """Return `conditions` with `new` in place of its type, order kept.

    When the status of that type does not change, the old `lastTransitionTime` wins, so
    re-asserting what is already true yields an equal list.
    """
    result: list[Condition] = []
    replaced = False
    for old in conditions or ():
        if old.type != new.type:
            result.append(old)
            continue
        if old.status == new.status:
            new = new.model_copy(update={"last_transition_time": old.last_transition_time})
        if not replaced:
            result.append(new)
            replaced = True
    if not replaced:
        result.append(new)
    return result


def set_conditions(conditions: Sequence[Condition] | None, *new: Condition) -> list[Condition]:
    """:func:`set_condition` for several conditions in turn."""
    result = list(conditions or ())
    for condition in new:
        result = set_condition(result, condition)
    return result


def _status(
    state: State,
    namespace: str | None,
    ready: tuple[bool, str, str],
    error: tuple[bool, str, str],
    generation: int | None,
    now: datetime,
    previous: ClusterPolicyStatus | None,
) -> ClusterPolicyStatus:
    old = previous.conditions if previous is not None else None
    return ClusterPolicyStatus(
        state=state,
        namespace=namespace,
        conditions=set_conditions(old, *ready_error_conditions(ready, error, generation, now)),
    )


def ready_error_conditions(
    ready: tuple[bool, str, str],
    error: tuple[bool, str, str],
    generation: int | None,
    now: datetime,
) -> list[Condition]:
    """The Ready and Error conditions (upstream's pair) from (holds, reason, message)
    verdicts; merged with set_conditions, an unchanged one keeps its transition time."""
    stamp = format_time(now)
    return [
        Condition(
            type=type_,
            status="True" if holds else "False",
            reason=reason,
            message=message,
            observed_generation=generation,
            last_transition_time=stamp,
        )
        for type_, (holds, reason, message) in ((CONDITION_READY, ready), (CONDITION_ERROR, error))
    ]


def ready_status(
    namespace: str,
    *,
    generation: int | None,
    now: datetime,
    previous: ClusterPolicyStatus | None = None,
) -> ClusterPolicyStatus:
    """Every enabled operand is ready: state ready, Ready=True, Error=False."""
    return _status(
        STATE_READY,
        namespace,
        (True, REASON_RECONCILED, "ClusterPolicy is ready: all enabled operands are ready"),
        (False, REASON_NO_ERROR, ""),
        generation,
        now,
        previous,
    )


def not_ready_status(
    namespace: str | None,
    *,
    reason: str,
    message: str,
    error: bool,
    generation: int | None,
    now: datetime,
    previous: ClusterPolicyStatus | None = None,
) -> ClusterPolicyStatus:
    """State notReady; with `error` the Error condition carries the reason too."""
    return _status(
        STATE_NOT_READY,
        namespace,
        (False, reason, message),
        (True, reason, message) if error else (False, REASON_NO_ERROR, ""),
        generation,
        now,
        previous,
    )


def ignored_status(
    active_name: str,
    *,
    generation: int | None,
    now: datetime,
    previous: ClusterPolicyStatus | None = None,
) -> ClusterPolicyStatus:
    """State ignored: only one ClusterPolicy is active, and this names it."""
    message = f"ClusterPolicy {active_name!r} is the active one; this one is ignored"
    return _status(
        STATE_IGNORED,
        None,
        (False, REASON_IGNORED, message),
        (False, REASON_NO_ERROR, ""),
        generation,
        now,
        previous,
    )


def with_unsupported_fields(
    status: ClusterPolicyStatus,
    fields: Sequence[str],
    *,
    generation: int | None,
    now: datetime,
) -> ClusterPolicyStatus:
    """`status` with the UnsupportedFields condition naming `fields`, or without it when
    there are none. Re-asserting the same fields keeps the condition equal (no write)."""
    conditions = with_unsupported_condition(
        status.conditions, fields, generation=generation, now=now
    )
    return status.model_copy(update={"conditions": conditions or None})


def with_unsupported_condition(
    conditions: Sequence[Condition] | None,
    fields: Sequence[str],
    *,
    generation: int | None,
    now: datetime,
) -> list[Condition]:
    """`conditions` with the UnsupportedFields condition naming `fields` (either
    resource's), or without it when there are none."""
    if not fields:
        return [c for c in conditions or () if c.type != CONDITION_UNSUPPORTED_FIELDS]
    message = "accepted but not acted on: " + "; ".join(fields)
    condition = Condition(
        type=CONDITION_UNSUPPORTED_FIELDS,
        status="True",
        reason=REASON_FIELDS_NOT_ACTED_ON,
        message=message[:32768],
        observed_generation=generation,
        last_transition_time=format_time(now),
    )
    return set_condition(conditions, condition)


def unsupported_fields_news(
    stored: Iterable[Mapping[str, Any]], written: Iterable[Mapping[str, Any]]
) -> str | None:
    """The message of the UnsupportedFields condition just `written` when it differs
    (message or observed generation) from the `stored` one, else None: the Warning
    Event is due once per change of it, so once per generation that sets such fields.
    Both are conditions as the API serves them (camelCase dicts)."""
    new = next((c for c in written if c.get("type") == CONDITION_UNSUPPORTED_FIELDS), None)
    if new is None:
        return None
    old = next((c for c in stored if c.get("type") == CONDITION_UNSUPPORTED_FIELDS), {})
    if (old.get("message"), old.get("observedGeneration")) == (
        new.get("message"),
        new.get("observedGeneration"),
    ):
        return None
    return str(new["message"])
