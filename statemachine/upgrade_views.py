"""Typed inputs and outputs of the driver upgrade rulebook.

The controller builds a `NodeUpgradeView` from its caches (node metadata as-is plus a
few counts it computed) and an `UpgradePolicyView` from the ClusterPolicy; the
rulebook answers with a `Decision`. Everything is frozen: guards cannot mutate input.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from statemachine.driver_owner import NEXT_OWNER_LABEL, OWNER_LABEL
from statemachine.upgrade_keys import (
    INITIAL_UNSCHEDULABLE_ANNOTATION,
    REPLACE_POD_ANNOTATION,
    REQUESTED_ANNOTATION,
    STATE_LABEL,
    UpgradeState,
    parse_state,
    skipped,
)


def parse_time(raw: str | None) -> float | None:
    """Epoch seconds from an annotation value; None when absent, garbage or not finite."""
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


@dataclass(frozen=True, slots=True)
class DriverPodView:
    """The node's driver pod (the DaemonSet keeps at most one per node)."""

    uid: str
    revision_hash: str
    running: bool = False
    ready: bool = False
    restart_count: int = 0
    waiting_reason: str = ""
    """Why a container is not running yet (``ImagePullBackOff``...), for failure reasons."""
    config_digest: str = ""
    """The driver configuration digest the pod was made with ("" when unknown)."""


@dataclass(frozen=True, slots=True)
class NodeUpgradeView:
    """One node as the rulebook sees it. `labels`/`annotations` are the node's own.

    Counts are computed by the controller with kubectl drain's rules
    (`statemachine.eviction`): `wait_pods_running` are running pods that match
    waitForCompletion's selector, `gpu_pods` GPU pods the pod-deletion step still has
    to remove, `drain_pods` pods a drain still has to remove; `*_refused` name the pods
    the flags do not allow removing (``namespace/name (why)``), which fail the step.
    `pods_left` describes the pods the current step still waits for (with why an
    eviction was refused, when known), for the failure reason on a timeout.
    """

    name: str
    now: float
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    unschedulable: bool = False
    node_ready: bool = True
    driver_pod: DriverPodView | None = None
    newest_revision: str | None = None
    wait_pods_running: int = 0
    gpu_pods: int = 0
    gpu_pods_refused: tuple[str, ...] = ()
    drain_pods: int = 0
    drain_refused: tuple[str, ...] = ()
    pods_left: tuple[str, ...] = ()
    validators_ready: bool = False
    newest_config_digest: str = ""
    """The digest in the DaemonSet's current template ("" when unknown): equal to the
    pod's, the driver itself is unchanged and only the pod needs a restart."""
    enrolling: bool = False
    """The node gets its deploy labels in the same write: with no driver pod yet, the
    DaemonSet will create one at its newest revision, so nothing is to upgrade."""

    @property
    def moving(self) -> bool:
        """The node is to change NVIDIADriver (``statemachine.driver_owner``): an upgrade
        the whole way, whatever the revisions say, handed over at the driver restart."""
        pending = self.labels.get(NEXT_OWNER_LABEL)
        return pending is not None and pending != self.labels.get(OWNER_LABEL)

    @property
    def state_label(self) -> str | None:
        return self.labels.get(STATE_LABEL)

    @property
    def state(self) -> UpgradeState:
        return parse_state(self.state_label)

    @property
    def skip(self) -> bool:
        return skipped(self.labels)

    @property
    def upgrade_requested(self) -> bool:
        return self.annotations.get(REQUESTED_ANNOTATION) == "true"

    @property
    def initial_unschedulable(self) -> bool:
        return self.annotations.get(INITIAL_UNSCHEDULABLE_ANNOTATION) == "true"

    @property
    def replace_pod_uid(self) -> str | None:
        return self.annotations.get(REPLACE_POD_ANNOTATION) or None

    def annotation_time(self, key: str) -> float | None:
        """An epoch-seconds annotation, or None when absent or unparsable."""
        return parse_time(self.annotations.get(key))


@dataclass(frozen=True, slots=True)
class WaitForCompletionView:
    """`pod_selector` empty means "do not wait"; timeout 0 means "wait forever"."""

    pod_selector: Mapping[str, str] | str = ""
    timeout_seconds: int = 0


@dataclass(frozen=True, slots=True)
class PodDeletionView:
    """`force`/`delete_empty_dir` are kubectl drain's flags (`statemachine.eviction`):
    they widen which pods may go, never how (always the Eviction API)."""

    force: bool = False
    timeout_seconds: int = 300
    delete_empty_dir: bool = False


@dataclass(frozen=True, slots=True)
class DrainView:
    """As `PodDeletionView`, for every pod on the node that `pod_selector` selects."""

    enable: bool = False
    force: bool = False
    pod_selector: Mapping[str, str] | str = ""
    timeout_seconds: int = 300
    delete_empty_dir: bool = False


#: Bound of pod-restart-required under the driver's default startup probe (see
#: `UpgradePolicyView`; `components.driver.startup_budget_seconds`): 60 + 10 x 120 s.
DRIVER_READY_TIMEOUT_SECONDS = 1260


@dataclass(frozen=True, slots=True)
class UpgradePolicyView:
    """`driver.upgradePolicy` plus the knobs upstream hard-codes.

    `pod_deletion=None` skips the pod-deletion step. Timeouts of 0 mean no limit (as in
    the policy, where upstream reads 0 as "wait forever").
    `validation_timeout_seconds` is upstream's fixed 600 s. `driver_ready_timeout_seconds`
    has no upstream counterpart: upstream waits forever for a new driver pod that never
    turns Ready (an image that cannot be pulled), keeping the node cordoned and its slot
    taken; we fail the node, with the pod's waiting reason, once the driver's own startup
    probe would have given up (its initial delay plus period times failure threshold),
    never sooner: a slow but healthy driver build must not fail its node.
    """

    auto_upgrade: bool = False
    max_parallel_upgrades: int = 1
    max_unavailable: int | str = "25%"
    wait_for_completion: WaitForCompletionView = WaitForCompletionView()
    pod_deletion: PodDeletionView | None = PodDeletionView()
    drain: DrainView = DrainView()
    validation_enabled: bool = True
    validation_timeout_seconds: int = 600
    driver_restart_limit: int = 10
    driver_ready_timeout_seconds: int = DRIVER_READY_TIMEOUT_SECONDS


class Action(StrEnum):
    """The side effect the controller performs after persisting a decision's patch."""

    NONE = "none"
    CORDON = "cordon"
    WAIT_JOBS = "wait-jobs"
    DELETE_GPU_PODS = "delete-gpu-pods"
    DRAIN = "drain"
    RESTART_DRIVER_POD = "restart-driver-pod"
    WAIT_DRIVER_POD = "wait-driver-pod"
    WAIT_VALIDATION = "wait-validation"
    UNCORDON = "uncordon"


@dataclass(frozen=True, slots=True)
class Decision:
    """What to persist and what to do for one node on this pass.

    `labels`/`annotations` hold only changes (None = remove). Persist them first (one
    merge patch), then perform `action`; its effect shows up in the caches, and the
    next pass's guards see it. `requeue_after` is the seconds until a timeout fires:
    the only reason to look at the node again without a watch event. `hops` lists
    every transition taken, for per-transition metrics and Events.
    """

    node: str
    current: UpgradeState
    target: UpgradeState
    action: Action
    reason: str
    hops: tuple[tuple[str, UpgradeState, UpgradeState], ...] = ()
    labels: Mapping[str, str | None] = field(default_factory=dict)
    annotations: Mapping[str, str | None] = field(default_factory=dict)
    requeue_after: float | None = None
    failure: str = ""
    notice: str = ""
    """A setback that is not a failure (pod deletion failed, a drain takes over): the
    controller emits it as a Warning Event."""
    alerts: tuple[tuple[str, str], ...] = ()
    """Damaged bookkeeping found and repaired (a state label that is no state, a lost
    one on a node we cordoned, a clock in the future), as (Event reason, message): the
    controller emits each as a Warning Event naming the node."""

    @property
    def changed_state(self) -> bool:
        return self.current is not self.target

    @property
    def entered_failed(self) -> bool:
        """The node failed during this pass (even if a later hop already left the state):
        the controller emits the Event and counts it; `failure` says why."""
        return any(dest is UpgradeState.UPGRADE_FAILED for _, _, dest in self.hops)

    @property
    def triggers(self) -> tuple[str, ...]:
        return tuple(trigger for trigger, _, _ in self.hops)

    @property
    def has_patch(self) -> bool:
        return bool(self.labels or self.annotations)

    def merge_patch(self) -> dict[str, Any]:
        """The node merge patch (`application/merge-patch+json`); empty when none."""
        metadata: dict[str, Any] = {}
        if self.labels:
            metadata["labels"] = dict(self.labels)
        if self.annotations:
            metadata["annotations"] = dict(self.annotations)
        return {"metadata": metadata} if metadata else {}
