"""What the remediation planner reads of the cluster: pure views of nodes and the policy.

Kept apart from the shell so the wake-up predicates (`node_facts`, `policy_facts`) and the
planner's inputs are one definition, read by both the operator's event handlers and the
remediation key.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from components.labels import is_gpu_node
from crd import ClusterPolicySpec
from gpuop.kube.informer import Obj
from gpuop.operator.controller.views.node_views import gpu_health, labels
from statemachine.cordon import CordonOwner, cordon_owner, upgrade_needs_cordon
from statemachine.remediation import (
    ACTION_ANNOTATION,
    CONDITION_REMEDIATION_PAUSED,
    DRAINED_ANNOTATION,
    HEALTHY_SEEN_ANNOTATION,
    QUARANTINED_ANNOTATION,
    RESUME_ANNOTATION,
    Health,
    HealthNodeView,
    RemediationAction,
    RemediationPolicyView,
    seen_at,
)
from statemachine.upgrade_keys import IN_PROGRESS_STATES, STATE_LABEL, parse_state


def policy_view(spec: ClusterPolicySpec | None) -> RemediationPolicyView:
    section = spec.health_remediation if spec is not None else None
    if section is None:
        return RemediationPolicyView()
    return RemediationPolicyView(
        enabled=section.enabled,
        dry_run=section.dry_run,
        action=RemediationAction(section.action),
        max_unhealthy=section.max_unhealthy,
        settle_seconds=section.settle_seconds,
    )


def _epoch(stamp: str | None) -> float | None:
    if not stamp:
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def transition(node: Obj) -> str:
    """The GPUHealthy condition's lastTransitionTime as the agent wrote it ("" if none):
    what a `HEALTHY_SEEN_ANNOTATION` record is keyed by."""
    return str((gpu_health(node) or {}).get("lastTransitionTime") or "")


def node_view(node: Obj) -> HealthNodeView:
    cond = gpu_health(node) or {}
    node_labels = labels(node)
    annotations = node["metadata"].get("annotations") or {}
    health = Health.parse(cond.get("status"))
    seen = seen_at(annotations.get(HEALTHY_SEEN_ANNOTATION), transition(node))
    return HealthNodeView(
        name=node["metadata"]["name"],
        health=health,
        since=_epoch(cond.get("lastTransitionTime")),
        healthy_seen=_epoch(seen) if health is Health.HEALTHY else None,
        reason=str(cond.get("reason") or ""),
        message=str(cond.get("message") or ""),
        gpu=is_gpu_node(node_labels),
        quarantined=QUARANTINED_ANNOTATION in annotations,
        cordoned_by_us=cordon_owner(node_labels, annotations) is CordonOwner.HEALTH_REMEDIATION,
        unschedulable=bool(node["spec"].get("unschedulable")),
        in_upgrade=parse_state(node_labels.get(STATE_LABEL)) in IN_PROGRESS_STATES,
        upgrade_holds_cordon=upgrade_needs_cordon(node_labels),
        drain_pending=QUARANTINED_ANNOTATION in annotations
        and annotations.get(ACTION_ANNOTATION) == RemediationAction.DRAIN.value
        and DRAINED_ANNOTATION not in annotations,
    )


def node_facts(node: Obj | None) -> Any:
    """What the planner reads of a node: a change in it wakes the remediation key."""
    return None if node is None else node_view(node)


def policy_facts(policy: Obj | None) -> Any:
    """What the planner reads of a policy besides its spec (generation)."""
    if policy is None:
        return None
    meta = policy["metadata"]
    paused = paused_condition(policy)
    return (
        meta.get("generation"),
        (meta.get("annotations") or {}).get(RESUME_ANNOTATION),
        paused.get("status") if paused else None,
    )


def paused_condition(policy: Obj) -> dict[str, Any] | None:
    for cond in (policy.get("status") or {}).get("conditions") or []:
        if cond.get("type") == CONDITION_REMEDIATION_PAUSED:
            return dict(cond)
    return None
