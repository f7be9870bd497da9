"""Driver upgrade states and the node label/annotation keys that persist them.

Upstream names are compatibility facts (users' runbooks and dashboards use them).
Keys under `gpuop.io/` are our own bookkeeping, which upstream keeps in memory; we
store it on the node so a restarted operator resumes exactly where it stopped.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum


class UpgradeState(StrEnum):
    """Values of the `nvidia.com/gpu-driver-upgrade-state` label.

    `UNKNOWN` is the machine's name for "no (or an unrecognised) label"; it is never
    written: a node in it carries no state label.
    """

    UNKNOWN = "unknown"
    UPGRADE_REQUIRED = "upgrade-required"
    CORDON_REQUIRED = "cordon-required"
    WAIT_FOR_JOBS_REQUIRED = "wait-for-jobs-required"
    POD_DELETION_REQUIRED = "pod-deletion-required"
    DRAIN_REQUIRED = "drain-required"
    POD_RESTART_REQUIRED = "pod-restart-required"
    VALIDATION_REQUIRED = "validation-required"
    UNCORDON_REQUIRED = "uncordon-required"
    UPGRADE_DONE = "upgrade-done"
    UPGRADE_FAILED = "upgrade-failed"

    @property
    def label_value(self) -> str | None:
        return None if self is UpgradeState.UNKNOWN else self.value


IN_PROGRESS_STATES: frozenset[UpgradeState] = frozenset(
    {
        UpgradeState.CORDON_REQUIRED,
        UpgradeState.WAIT_FOR_JOBS_REQUIRED,
        UpgradeState.POD_DELETION_REQUIRED,
        UpgradeState.DRAIN_REQUIRED,
        UpgradeState.POD_RESTART_REQUIRED,
        UpgradeState.VALIDATION_REQUIRED,
        UpgradeState.UNCORDON_REQUIRED,
    }
)
"""States an upgrade is under way in. `upgrade-required` is a queue, not a slot: the
node is still schedulable and serving, so it does not count against the budget."""

SLOT_STATES: frozenset[UpgradeState] = IN_PROGRESS_STATES | {UpgradeState.UPGRADE_FAILED}
"""States that hold a `maxParallelUpgrades` slot. A failed node keeps its slot, as
upstream counts it: it leaves `upgrade-failed` for `uncordon-required` on its own when
its driver heals (no grant), so a freed slot would let that recovery overfill the
budget. A retry sends it back to the queue (`upgrade-required`), freeing the slot."""


_STATE_VALUES = frozenset(s.value for s in UpgradeState)
"""Label values the rulebook knows. A set lookup, not a caught ValueError: the fleet pass
reads every GPU node's state on every pod and node event."""


def parse_state(label: str | None) -> UpgradeState:
    """Map a label value to a state; missing, empty or unrecognised -> UNKNOWN."""
    return UpgradeState(label) if label in _STATE_VALUES else UpgradeState.UNKNOWN


def skipped(labels: Mapping[str, str]) -> bool:
    """Upstream's opt-out: a node labelled `nvidia.com/gpu-driver-upgrade.skip=true` is
    never upgraded (any other value does not count)."""
    return labels.get(SKIP_LABEL) == "true"


# Upstream names.
STATE_LABEL = "nvidia.com/gpu-driver-upgrade-state"
SKIP_LABEL = "nvidia.com/gpu-driver-upgrade.skip"
DRAIN_SKIP_POD_LABEL = "nvidia.com/gpu-driver-upgrade-drain.skip"
REQUESTED_ANNOTATION = "nvidia.com/gpu-driver-upgrade-requested"
INITIAL_UNSCHEDULABLE_ANNOTATION = "nvidia.com/gpu-driver-upgrade.node-initial-state.unschedulable"
WAIT_FOR_COMPLETION_START_ANNOTATION = (
    "nvidia.com/gpu-driver-upgrade-wait-for-pod-completion-start-time"
)
VALIDATION_START_ANNOTATION = "nvidia.com/gpu-driver-upgrade-validation-start-time"
DRIVER_REVISION_LABEL = "controller-revision-hash"

# Our own bookkeeping (epoch seconds for times).
STATE_SINCE_ANNOTATION = "gpuop.io/driver-upgrade-state-since"
POD_DELETION_START_ANNOTATION = "gpuop.io/driver-upgrade-pod-deletion-start-time"
DRAIN_START_ANNOTATION = "gpuop.io/driver-upgrade-drain-start-time"
POD_RESTART_START_ANNOTATION = "gpuop.io/driver-upgrade-pod-restart-start-time"
REPLACE_POD_ANNOTATION = "gpuop.io/driver-upgrade-replace-pod-uid"
FAILED_REVISION_ANNOTATION = "gpuop.io/driver-upgrade-failed-revision"
REASON_ANNOTATION = "gpuop.io/driver-upgrade-reason"

TIMER_ANNOTATIONS: dict[UpgradeState, str] = {
    UpgradeState.WAIT_FOR_JOBS_REQUIRED: WAIT_FOR_COMPLETION_START_ANNOTATION,
    UpgradeState.POD_DELETION_REQUIRED: POD_DELETION_START_ANNOTATION,
    UpgradeState.DRAIN_REQUIRED: DRAIN_START_ANNOTATION,
    UpgradeState.POD_RESTART_REQUIRED: POD_RESTART_START_ANNOTATION,
    UpgradeState.VALIDATION_REQUIRED: VALIDATION_START_ANNOTATION,
}
"""Per-state start times: present only while the node is in that state."""

MANAGED_ANNOTATIONS: tuple[str, ...] = (
    INITIAL_UNSCHEDULABLE_ANNOTATION,
    *TIMER_ANNOTATIONS.values(),
    STATE_SINCE_ANNOTATION,
    REPLACE_POD_ANNOTATION,
    FAILED_REVISION_ANNOTATION,
    REASON_ANNOTATION,
)
"""Annotations the operator owns and removes on cleanup. The requested annotation is
the user's input, consumed when an upgrade starts, never part of cleanup."""
