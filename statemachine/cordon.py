"""Who holds a node's cordon: one owner, recorded on the node, honoured by all of gpuop.

Driver upgrades and health remediation both cordon nodes. Each used to keep its own
record and to guess about the other: an upgrade took a quarantine's cordon for "not
ours, leave it" and never lifted it, and remediation lifted its cordon on a node whose
new driver had just failed validation. Now the node carries one record, two
annotations written in the same patch as the cordon: `gpuop.io/cordoned-by`
(`driver-upgrade` or `health-remediation`) and `gpuop.io/cordon-reason`. The rules:

- Whoever cordons a schedulable node records itself. A node already unschedulable
  keeps its owner, or none: an administrator's cordon, which gpuop never lifts.
- Only the owner uncordons, and it drops the record in the same patch. When it is done
  with the node while the other still needs it cordoned (an upgrade in progress or
  failed; a quarantine whose action cordons), it hands the cordon over instead: the
  record names the other, and the node stays cordoned.

Records from before this one existed are read as what they meant: remediation's
`gpuop.io/gpu-health-cordoned=true`, and, as upstream reads it, a node in an upgrade
state without the initial-state annotation was cordoned by the upgrade.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from statemachine.remediation import (
    ACTION_ANNOTATION,
    CORDONED_ANNOTATION,
    QUARANTINED_ANNOTATION,
    RemediationAction,
)
from statemachine.upgrade_keys import (
    IN_PROGRESS_STATES,
    INITIAL_UNSCHEDULABLE_ANNOTATION,
    REASON_ANNOTATION,
    STATE_LABEL,
    UpgradeState,
    parse_state,
)

CORDONED_BY_ANNOTATION = "gpuop.io/cordoned-by"
CORDON_REASON_ANNOTATION = "gpuop.io/cordon-reason"
_REASON_LIMIT = 1024


class CordonOwner(StrEnum):
    DRIVER_UPGRADE = "driver-upgrade"
    HEALTH_REMEDIATION = "health-remediation"

    @property
    def other(self) -> CordonOwner:
        if self is CordonOwner.DRIVER_UPGRADE:
            return CordonOwner.HEALTH_REMEDIATION
        return CordonOwner.DRIVER_UPGRADE


#: Upgrade states in which the upgrade needs its node cordoned. `uncordon-required` is
#: the upgrade letting go; a failed node stays out of service until fixed or retried.
_UPGRADE_HOLDS = (IN_PROGRESS_STATES - {UpgradeState.UNCORDON_REQUIRED}) | {
    UpgradeState.UPGRADE_FAILED
}
_CORDONING_ACTIONS = (RemediationAction.CORDON.value, RemediationAction.DRAIN.value)


def recorded_owner(annotations: Mapping[str, str]) -> CordonOwner | None:
    """The owner the record names (None without one, or with a value we never write)."""
    raw = annotations.get(CORDONED_BY_ANNOTATION)
    try:
        return CordonOwner(raw) if raw is not None else None
    except ValueError:
        return None


def cordon_owner(labels: Mapping[str, str], annotations: Mapping[str, str]) -> CordonOwner | None:
    """Who holds the node's cordon, if it is ours at all (None: not gpuop's), reading
    records from before the owner record too.

    Only meaningful while the node is unschedulable; callers check that.
    """
    if CORDONED_BY_ANNOTATION in annotations:
        return recorded_owner(annotations)
    if annotations.get(CORDONED_ANNOTATION) == "true":
        return CordonOwner.HEALTH_REMEDIATION
    state = parse_state(labels.get(STATE_LABEL))
    started = state in IN_PROGRESS_STATES or state is UpgradeState.UPGRADE_FAILED
    if started and annotations.get(INITIAL_UNSCHEDULABLE_ANNOTATION) != "true":
        return CordonOwner.DRIVER_UPGRADE
    return None


def upgrade_needs_cordon(labels: Mapping[str, str]) -> bool:
    """The node's upgrade is under way or failed: it must stay out of service."""
    return parse_state(labels.get(STATE_LABEL)) in _UPGRADE_HOLDS


def remediation_needs_cordon(annotations: Mapping[str, str]) -> bool:
    """The node is quarantined with an action that cordons (cordon or drain)."""
    return (
        QUARANTINED_ANNOTATION in annotations
        and annotations.get(ACTION_ANNOTATION) in _CORDONING_ACTIONS
    )


def needs_cordon(
    owner: CordonOwner, labels: Mapping[str, str], annotations: Mapping[str, str]
) -> bool:
    if owner is CordonOwner.DRIVER_UPGRADE:
        return upgrade_needs_cordon(labels)
    return remediation_needs_cordon(annotations)


def reason_of(owner: CordonOwner, labels: Mapping[str, str], annotations: Mapping[str, str]) -> str:
    """The words recorded beside the owner, from the owner's own bookkeeping."""
    if owner is CordonOwner.HEALTH_REMEDIATION:
        return annotations.get(QUARANTINED_ANNOTATION) or "GPU health quarantine"
    state = parse_state(labels.get(STATE_LABEL))
    failure = annotations.get(REASON_ANNOTATION)
    if state is UpgradeState.UPGRADE_FAILED and failure:
        return f"driver upgrade failed: {failure}"
    return "driver upgrade"


def record(owner: CordonOwner, reason: str) -> dict[str, str | None]:
    """The annotations naming ``owner`` (written with the cordon, or on a hand-over)."""
    return {CORDONED_BY_ANNOTATION: owner.value, CORDON_REASON_ANNOTATION: reason[:_REASON_LIMIT]}


CLEARED: Mapping[str, str | None] = {CORDONED_BY_ANNOTATION: None, CORDON_REASON_ANNOTATION: None}


@dataclass(frozen=True)
class CordonRelease:
    """What one owner letting go of a node does: uncordon it (and drop the record),
    hand it to the other owner (rewrite the record), or nothing (not its cordon)."""

    uncordon: bool = False
    handed_to: CordonOwner | None = None
    annotations: Mapping[str, str | None] = field(default_factory=dict)


def release(
    releaser: CordonOwner,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    unschedulable: bool,
) -> CordonRelease:
    """``releaser`` is done with the node: what becomes of its cordon."""
    if cordon_owner(labels, annotations) is not releaser:
        return CordonRelease()
    other = releaser.other
    if unschedulable and needs_cordon(other, labels, annotations):
        return CordonRelease(
            handed_to=other, annotations=record(other, reason_of(other, labels, annotations))
        )
    stale = {k: None for k in CLEARED if k in annotations}
    return CordonRelease(uncordon=unschedulable, annotations=stale)
