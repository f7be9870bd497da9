"""What one node pass reads and plans (:mod:`statemachine.node_plan`): the snapshot, the
plan and the helpers both halves of the pass share."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from components.keys import MIG_CAPABLE_LABEL, TRUE
from components.labels import (
    apply_label_changes,
    is_gpu_node,
)
from crd import OWNER_LABEL, ClusterPolicySpec
from statemachine.driver_owner import NEXT_OWNER_LABEL
from statemachine.eviction import RemovalPlan
from statemachine.upgrade_keys import STATE_LABEL, UpgradeState, skipped
from statemachine.upgrade_views import (
    Action,
    Decision,
    DriverPodView,
    NodeUpgradeView,
    UpgradePolicyView,
)
from statemachine.workload_handover import (
    GPU_CLAIMS,
)

Node = Mapping[str, Any]


EMPTYING_STATES = frozenset(
    {
        UpgradeState.WAIT_FOR_JOBS_REQUIRED,
        UpgradeState.POD_DELETION_REQUIRED,
        UpgradeState.DRAIN_REQUIRED,
    }
)


EMPTYING_POLL_SECONDS = 2.0
"""While a node is being emptied, pods elsewhere in the cluster are not watched (that
would cache every pod of the fleet); the node is looked at again after this."""


GPU_PODS_RECHECK_S = 5.0
"""How often a node held for container GPU pods is looked at again (they are not
watched: only the operator's own pods are)."""


@dataclass(frozen=True)
class DriverFacts:
    """What the caches show of the node's driver, as the upgrade rulebook reads it."""

    app: str
    """The driver DaemonSet (its `app`) on the node ("" when none yet)."""
    newest_revision: str | None = None
    newest_config_digest: str = ""
    driver_pod: DriverPodView | None = None
    validators_ready: bool = False
    driver_pods: tuple[tuple[str, str], ...] = ()
    """Every pod of ``app`` on the node (terminating ones too), as (name, namespace):
    what a driver restart deletes."""


@dataclass(frozen=True)
class RestingAnswer:
    """The node's last decision at rest (``gpuop.operator.controller.views.resting``):
    asked again with the same view and policy, the rulebook answers the same."""

    policy: UpgradePolicyView
    view: NodeUpgradeView
    """Clock zeroed, no driver pod."""
    driver_pod: DriverPodView | None
    decision: Decision
    """Shared between nodes: its ``node`` is empty."""


@dataclass(frozen=True)
class LiveReads:
    """What the API server said during the read phase (only what `plan_reads` asked)."""

    node_pods: tuple[Node, ...] | None = None
    """Every pod on the node (None: not listed)."""
    claimants: frozenset[str] = frozenset()
    """The GPU claimants with a pod of ours on the node or bound for it, per the API."""
    drain_pods: tuple[Node, ...] | None = None
    """The pods the drain selector matches (None: not listed)."""
    wait_pods: tuple[Node, ...] | None = None
    """The pods the wait-for-completion selector matches (None: not listed)."""


@dataclass(frozen=True)
class NodeSnapshot:
    """One node and what its pass reads besides, from the caches and memos."""

    name: str
    node: Node | None
    """The node as the cache holds it; None: it is gone."""
    now: float = 0.0
    policy_invalid: bool = False
    """A ClusterPolicy exists but does not parse or validate: nothing changes on nodes."""
    spec: ClusterPolicySpec | None = None
    spec_policy: UpgradePolicyView | None = None
    """The ClusterPolicy's ``driver.upgradePolicy`` as the rulebook reads it."""
    gpucluster: tuple[bool, bool] | None = None
    """Beside no ClusterPolicy: (whether a GPUCluster is known to exist or not yet,
    whether one is active); None: no GPUCluster unit runs."""
    owner_policies: Mapping[str, UpgradePolicyView] | None = None
    """Each NVIDIADriver's upgradePolicy; None when NVIDIADrivers do not apply (or
    their cache has not listed)."""
    owners_listed: bool = True
    base_spec: ClusterPolicySpec | None = None
    """The policy NVIDIADrivers are read under, without a ClusterPolicy."""
    namespace: str = ""
    """The operator's namespace: its own pods are no workload."""
    claimant_pods: frozenset[str] = frozenset()
    """The GPU claimants with a pod on the node, per the operand pods cache."""
    driver: DriverFacts = field(default_factory=lambda: DriverFacts(""))
    said_invalid: str | None = None
    said_step: str | None = None
    claim_settle_s: float = 0.0
    """Seconds before another claimant's label may be granted on this node: our patch
    took a claimant's label off it that recently (`workload_handover.CLAIM_SETTLE_S`)."""
    refused: Mapping[str, str] = field(default_factory=dict)
    """Evictions the API refused on this node (pod key -> its words)."""
    resting: RestingAnswer | None = None
    ready_timeout: int | None = None
    """Overrides the driver-ready bound (tests only)."""
    live: LiveReads = field(default_factory=LiveReads)


@dataclass(frozen=True)
class Say:
    """An Event on the node (``reason`` set) and its log line (``log`` set)."""

    reason: str = ""
    message: str = ""
    warning: bool = False
    log: str = ""
    log_warning: bool = False
    fields: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class NodeAgain:
    """What the pass asks of the work queue for its own key, and what it wakes."""

    requeue_after: float | None = None
    forget: bool = False
    """Drop the key's timer (no clock runs for the node now; or it is gone)."""
    now: bool = False
    """Run again at once, on the labels just written."""
    fleet: bool = False
    """The fleet pass (coalesced): a state or an enrolment it counts changed."""
    progress: bool = False
    """The cluster pass (paced): the pass's own writes moved what it reads of the node
    (`cluster_label_facts`); our writes wake no watch event, so the pass says so."""


@dataclass(frozen=True)
class UpgradeWrite:
    """What the node's upgrade step writes and does, in this order."""

    decision: Decision
    policy: UpgradePolicyView
    view: NodeUpgradeView
    resting: str
    """``keep`` (answered from the memo), ``put`` (remember it) or ``forget``."""
    app: str = ""
    """The node's driver DaemonSet (the memo holds its current pod's record)."""
    patch: Mapping[str, Any] = field(default_factory=dict)
    """One merge patch (labels, annotations, cordon); empty: nothing to write."""
    forget_refusals: bool = False
    evict: RemovalPlan | None = None
    unown: bool = False
    """Remove the owner label first (the node moves to another NVIDIADriver)."""
    delete_pods: tuple[tuple[str, str], ...] = ()
    says: tuple[Say, ...] = ()
    on_conflict: NodeAgain = NodeAgain()
    """The queue's answer when the patch meets a newer node (409)."""


@dataclass(frozen=True)
class NodePlan:
    """Everything one node pass writes, in order, and what it asks of the queue."""

    name: str
    node: Node | None
    gone: bool = False
    said: tuple[str | None, str | None] | None = None
    """The workload memos' new values (invalid value, hand-over step); None: as they are."""
    says: tuple[Say, ...] = ()
    """Events before any write (the workload's)."""
    label_patch: Mapping[str, Any] = field(default_factory=dict)
    label_say: Say | None = None
    upgrade: UpgradeWrite | None = None
    again: NodeAgain = NodeAgain()


@dataclass(frozen=True)
class Reads:
    """What the read phase fetches from the API besides the caches."""

    node_pods: bool = False
    """The node's pods (the hand-over's container GPU pods, the GPU pod removal plan)."""
    unbound: bool = False
    """Our unbound pods (a claimant's pod bound for the node)."""
    drain_selector: str | None = None
    wait_selector: str | None = None


def labels_of(node: Node) -> Mapping[str, str]:
    return node["metadata"].get("labels") or {}


def target_owner(node_labels: Mapping[str, str]) -> str | None:
    """The NVIDIADriver whose upgradePolicy and budget a node is under: the one it moves
    to while a move is recorded, else its owner (None: the ClusterPolicy's)."""
    return node_labels.get(NEXT_OWNER_LABEL) or node_labels.get(OWNER_LABEL)


def requeue_after(decision: Decision) -> float | None:
    """When to look at the node again without a watch event (timeouts, emptying)."""
    delays = [d for d in (decision.requeue_after,) if d is not None]
    if decision.target in EMPTYING_STATES:
        delays.append(EMPTYING_POLL_SECONDS)
    return min(delays) if delays else None


def at_rest(decision: Decision) -> bool:
    """Nothing to do, write or report, and no clock running: the same view asks nothing new."""
    return (
        decision.action is Action.NONE
        and not decision.changed_state
        and not decision.hops
        and not decision.has_patch
        and decision.requeue_after is None
        and not decision.failure
        and not decision.notice
        and not decision.alerts
    )


def wanted_unschedulable(decision: Decision) -> bool | None:
    if decision.action is Action.CORDON:
        return True
    if decision.action is Action.UNCORDON:
        return False
    return None


def node_patch(node: Node, decision: Decision) -> dict[str, Any]:
    """What the decision changes on the node: labels, annotations, the cordon."""
    patch: dict[str, Any] = dict(decision.merge_patch())
    cordon = wanted_unschedulable(decision)
    if cordon is not None and bool((node.get("spec") or {}).get("unschedulable")) != cordon:
        patch["spec"] = {"unschedulable": cordon if cordon else None}
    return patch


def cluster_label_facts(node_labels: Mapping[str, str]) -> tuple[Any, ...]:
    """What the cluster pass reads of a node's labels (``_routes.gpu_facts`` adds the
    node's out-of-service condition, which no node pass writes)."""
    owner = node_labels.get(OWNER_LABEL)
    next_owner = node_labels.get(NEXT_OWNER_LABEL)
    return (
        is_gpu_node(node_labels),
        node_labels.get(MIG_CAPABLE_LABEL),
        owner,  # holds the ClusterPolicy's driver back
        next_owner,
        # NVIDIADriver upgrades pending, running or failed: the policy is not ready
        # (``NVIDIADrivers.upgrade_incomplete`` reads these, on owned and moving nodes).
        (node_labels.get(STATE_LABEL), skipped(node_labels)) if owner or next_owner else None,
    )


def _moves_cluster_facts(node_labels: Mapping[str, str], *patches: Mapping[str, Any]) -> bool:
    """Whether writing ``patches`` moves what the cluster pass reads of the node."""
    after: Mapping[str, str] = node_labels
    for patch in patches:
        after = apply_label_changes(after, (patch.get("metadata") or {}).get("labels") or {})
    return cluster_label_facts(after) != cluster_label_facts(node_labels)


def _labelled(node_labels: Mapping[str, str], claim: str) -> frozenset[str]:
    """The other claimants whose deploy label is on the node (``true``)."""
    return frozenset(
        c for key, c in GPU_CLAIMS.items() if c != claim and node_labels.get(key) == TRUE
    )


def _pod_key(pod: Node) -> str:
    return f"{pod['metadata'].get('namespace')}/{pod['metadata'].get('name')}"
