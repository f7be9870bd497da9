"""What the ClusterPolicy status says after a cluster pass.

:func:`cluster_status` is pure: what the cluster pass observed (and when) in, the status
and the ``reconciliation_status`` metric out, so every branch is a unit test.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from crd import (
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
from gpuop.operator.controller.views.refusals import Refusal, refusals_message
from gpuop.operator.controller.views.rollout_view import RolloutView
from gpuop.operator.metrics import STATUS_ERROR, STATUS_NOT_READY, STATUS_READY
from statemachine.remediation import (
    BLIND_MESSAGE,
    CONDITION_REMEDIATION_BLIND,
    REASON_NODE_AGENT_DISABLED,
    blind,
)
from statemachine.rollout import ROLLOUT_ORDER, ComponentStatus, RolloutPlan

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
