"""One node pass, decided in one place (issue 45): the shell reads a `NodeSnapshot`
(the caches, plus the API reads `plan_reads` asks for), `plan_node` decides, and the
shell writes the `NodePlan` and queues what its `NodeAgain` says.

What a node pass decides, in order:

1. the Warning for an invalid ``nvidia.com/gpu.workload.config`` (once per value);
2. the deploy labels (`components.labels`, or a GPUCluster's), with a GPU claimant's
   label held back while another claimant, or for a VM host a container's GPU pod, is
   still on the node (`statemachine.workload_handover`), and its Events;
3. the driver manager's hand-off annotation (`statemachine.driver_handoff`), written in
   the same patch as the labels, with a new node's first upgrade state (``enrolled``);
4. with no label to write, the node's upgrade step (`statemachine.upgrade.next_step`):
   the merge patch (labels, annotations, cordon), the removal of pods it asks for, the
   driver pod's restart, and its Events;
5. when to run again, and what else the pass wakes (the fleet pass).

Nothing here reads a clock, a cache or the API: the snapshot carries the time, and the
memos that keep Events from repeating (their new values are part of the plan).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from components.dra import gpucluster_label_changes
from components.keys import DEPLOY_LABEL_PREFIX, TRUE
from components.labels import (
    LabelChanges,
    apply_label_changes,
    node_label_changes,
    node_workload,
)
from crd import OWNER_LABEL
from statemachine._node_snapshot import (
    EMPTYING_POLL_SECONDS,
    GPU_PODS_RECHECK_S,
    DriverFacts,
    LiveReads,
    Node,
    NodeAgain,
    NodePlan,
    NodeSnapshot,
    Reads,
    RestingAnswer,
    Say,
    UpgradeWrite,
    _labelled,
    _moves_cluster_facts,
    _pod_key,
    cluster_label_facts,
    labels_of,
    node_patch,
    requeue_after,
    target_owner,
)
from statemachine._node_upgrade import (
    _again,
    _emptying_next,
    _enrolment,
    _upgrade,
    _upgrade_policy,
    _with_ready_timeout,
    upgrade_says,
)
from statemachine.driver_handoff import handoff_patch, handoff_wanted
from statemachine.eviction import gpu_workload, selector
from statemachine.upgrade_views import (
    Decision,
    UpgradePolicyView,
)
from statemachine.workload_handover import (
    CLAIM_SETTLING,
    DRIVER,
    GPU_CLAIMS,
    GPU_PODS_LEAVING,
    HandoverStep,
    HandoverView,
    handover_step,
    held,
    pending_claim,
)

# ---------------------------------------------------------------- the snapshot


# -------------------------------------------------------------------- the plan


# ------------------------------------------------------------------ helpers


# ---------------------------------------------------------------- the labels


def _label_changes(snap: NodeSnapshot, node_labels: Mapping[str, str]) -> LabelChanges:
    """The ClusterPolicy's labels; with none, a GPUCluster's (DRA deploy labels) or,
    with neither, none of ours. Nothing changes before the GPUCluster cache has
    listed: whether one exists is not known yet."""
    if snap.spec is not None or snap.gpucluster is None:
        return node_label_changes(node_labels, snap.spec)
    known, active = snap.gpucluster
    if not known:
        return {}
    return gpucluster_label_changes(node_labels, active=active)


def nothing_holds_claim(snap: NodeSnapshot, node_labels: Mapping[str, str], claim: str) -> bool:
    """No claimant holds the GPUs per the caches: the API is asked before granting
    (unless it is a `first_claim`)."""
    present = snap.claimant_pods | _labelled(node_labels, claim)
    others = present - {claim}
    return not (others if claim == DRIVER else others & {DRIVER})


def first_claim(node_labels: Mapping[str, str], changes: LabelChanges, claim: str) -> bool:
    """The driver's claim in the first labels a node gets from us (no deploy label on
    it yet, the patch only adds): granted on the caches' word, without asking the API.

    The API read closes a race of switches: a claimant's pod the pods cache has not
    shown yet, made from a deploy label the node had a moment ago. A node that never
    carried a deploy label has no claimant's DaemonSet selecting it, so no such pod
    can be on its way, and a fresh rollout does not pay two LISTs per node (one of
    every unbound pod of ours) before its labels. A VM claim still asks: the container
    GPU pods it waits for are in no cache of ours."""
    return (
        claim == DRIVER
        and all(value is not None for value in changes.values())
        and not any(key.startswith(DEPLOY_LABEL_PREFIX) for key in node_labels)
    )


def handover(snap: NodeSnapshot, node_labels: Mapping[str, str], claim: str) -> HandoverStep:
    present = snap.claimant_pods | _labelled(node_labels, claim)
    gpu_pods: tuple[str, ...] = ()
    if nothing_holds_claim(snap, node_labels, claim):
        present |= snap.live.claimants
        if claim != DRIVER:
            gpu_pods = tuple(
                sorted(
                    _pod_key(p)
                    for p in snap.live.node_pods or ()
                    if gpu_workload(p) and p["metadata"].get("namespace") != snap.namespace
                )
            )
    return handover_step(HandoverView(claim, present, gpu_pods))


def handover_say(
    snap: NodeSnapshot, target: str, claim: str, step: HandoverStep
) -> tuple[str | None, Say | None]:
    """The hand-over memo's new value, and an Event when the hand-over starts waiting for
    something new, or when it ends."""
    name, said = snap.name, snap.said_step
    if not step.hold:
        if said is None:
            return None, None
        return None, Say(
            "GPUWorkloadHandedOver",
            f"node {name} ({target}): GPUs handed to the {claim}",
            log="GPU workload handed over",
            fields=(("node", name), ("workload", target), ("claimant", claim)),
        )
    waiting = ", ".join(step.waiting_for)
    key = f"{step.state}: {waiting}"
    if said == key:
        return said, None
    words = f"node {name} switches to {target}: the {claim} waits ({step.state}) for {waiting}"
    pods = step.state == GPU_PODS_LEAVING
    if pods:
        words += "; the operator removes no workload: drain the node to go on"
    return key, Say(
        "GPUWorkloadHandover",
        words,
        warning=pods,
        log="GPU workload hand-over waits",
        fields=(("node", name), ("state", step.state), ("waiting", waiting)),
    )


def workload_say(
    snap: NodeSnapshot, node_labels: Mapping[str, str]
) -> tuple[str | None, Say | None]:
    """A Warning naming a node whose workload label is invalid, once per value."""
    workload = node_workload(node_labels, snap.spec)
    problem = workload.problem
    if problem is None or workload.invalid_value is None:
        return None, None
    if snap.said_invalid == workload.invalid_value:
        return snap.said_invalid, None
    name = snap.name
    return workload.invalid_value, Say(
        "GPUWorkloadConfigInvalid",
        f"node {name}: {problem}",
        warning=True,
        log="invalid GPU workload",
        log_warning=True,
        fields=(("node", name), ("problem", problem)),
    )


def _handoff(snap: NodeSnapshot, node: Node, after: Mapping[str, str]) -> dict[str, str | None]:
    """The driver manager's hand-off annotation, in the same patch as the node's labels:
    a driver pod can only start once its deploy label is written, so it always reads the
    value meant for it."""
    policies = snap.owner_policies
    auto = {k: v.auto_upgrade for k, v in policies.items()} if policies is not None else None
    # Beside a GPUCluster the NVIDIADrivers' policy applies (upstream's labelling
    # controller counts a GPUCluster as using NVIDIADrivers).
    base = snap.spec if snap.spec is not None else snap.base_spec
    annotations = node["metadata"].get("annotations") or {}
    return handoff_patch(annotations, handoff_wanted(after, base, auto))


# --------------------------------------------------------------- the upgrade


# ------------------------------------------------------------------- the pass


@dataclass(frozen=True)
class _Labels:
    """The label half of a pass: what it says, and the patch it would write."""

    said: tuple[str | None, str | None]
    says: tuple[Say, ...]
    changes: dict[str, str | None]
    target: str
    recheck: bool


def _labels(snap: NodeSnapshot, node: Node) -> _Labels:
    node_labels = labels_of(node)
    said_invalid, invalid = workload_say(snap, node_labels)
    target = node_workload(node_labels, snap.spec).name
    changes = dict(_label_changes(snap, node_labels))
    claim = pending_claim(changes)
    says = [s for s in (invalid,) if s is not None]
    if claim is None:
        return _Labels((said_invalid, None), tuple(says), changes, target, False)
    step = handover(snap, node_labels, claim)
    if not step.hold and snap.claim_settle_s > 0:
        # Free, but a claimant's label left the node a moment ago: its DaemonSet may
        # still make a pod there. Looked at again once the settle is over.
        step = HandoverStep(CLAIM_SETTLING, ("the last claimant's DaemonSet to settle",))
        return _Labels(
            (said_invalid, snap.said_step), tuple(says), held(changes, step), target, True
        )
    said_step, waits = handover_say(snap, target, claim, step)
    if waits is not None:
        says.append(waits)
    return _Labels(
        (said_invalid, said_step),
        tuple(says),
        held(changes, step),
        target,
        step.state == GPU_PODS_LEAVING,
    )


def plan_reads(snap: NodeSnapshot) -> Reads:
    """What the read phase asks the API besides the caches: the node's pods while a
    claim may be granted (nothing in the caches holds it, and it is not settling after
    another claimant's label left: `_labels` holds it whatever the API says) or while
    the node may be emptied, and the pods the policy's selectors name. Asked before
    `plan_node`, over the same snapshot; a read that the plan may turn out not to need
    is still made (a hand-over held back may leave no label to write, and the upgrade
    step run)."""
    node = snap.node
    if node is None or snap.policy_invalid:
        return Reads()
    node_labels = labels_of(node)
    changes = _label_changes(snap, node_labels)
    claim = pending_claim(changes)
    ask = (
        claim is not None
        and snap.claim_settle_s <= 0
        and nothing_holds_claim(snap, node_labels, claim)
        and not first_claim(node_labels, changes, claim)
    )
    unheld = {k: v for k, v in changes.items() if not (v == TRUE and k in GPU_CLAIMS)}
    if claim is None:
        labelled = bool(changes) or bool(
            _handoff(snap, node, apply_label_changes(node_labels, changes))
        )
    else:
        labelled = bool(unheld)
    target = node_workload(node_labels, snap.spec).name
    policy = None if labelled else _upgrade_policy(snap, node_labels, target)
    emptying = Reads() if policy is None else upgrade_reads(snap, policy)
    return replace(emptying, node_pods=ask or emptying.node_pods, unbound=ask)


def upgrade_reads(snap: NodeSnapshot, policy: UpgradePolicyView) -> Reads:
    """The pods the upgrade step under ``policy`` counts: only while emptying may be
    next (the GPU pods, the drain selector's, the wait selector's)."""
    node = snap.node
    if node is None or not _emptying_next(labels_of(node)):
        return Reads()
    wait = selector(policy.wait_for_completion.pod_selector)
    return Reads(
        node_pods=policy.pod_deletion is not None,
        drain_selector=selector(policy.drain.pod_selector) if policy.drain.enable else None,
        wait_selector=wait or None,
    )


def plan_upgrade(snap: NodeSnapshot, policy: UpgradePolicyView) -> UpgradeWrite:
    """The node's upgrade step under ``policy`` (the part of `plan_node` that runs once
    no label is to be written), from ``cordon-required`` on: never a start."""
    node = snap.node
    assert node is not None
    return _upgrade(snap, node, labels_of(node), _with_ready_timeout(snap, policy), False)


def _settled_by(snap: NodeSnapshot, after: Mapping[str, str], first: Decision | None) -> bool:
    """Whether a label patch that enrols the node leaves its pass nothing to do: the
    enrolment already ran the upgrade step on the labels written (``upgrade-done``, no
    action), and those labels plan no further change. Any other label patch runs the
    pass again at once, for the step the new labels may make due. A fresh rollout
    enrols every node in its first patch: that second pass decided nothing 1,000 times
    at 1,000 nodes."""
    if first is None:
        return False
    return not _label_changes(snap, apply_label_changes(after, first.labels))


def plan_node(snap: NodeSnapshot) -> NodePlan:
    """One node pass: what it writes, in order, and when it runs again."""
    node = snap.node
    if node is None:
        return NodePlan(snap.name, None, gone=True, again=NodeAgain(forget=True))
    if snap.policy_invalid:
        return NodePlan(snap.name, node)  # an invalid policy changes nothing; its status says why
    part = _labels(snap, node)
    recheck = NodeAgain(requeue_after=GPU_PODS_RECHECK_S) if part.recheck else NodeAgain()
    after = apply_label_changes(labels_of(node), part.changes)
    handoff = _handoff(snap, node, after)
    if part.changes or handoff:
        meta: dict[str, Any] = {}
        if part.changes:
            meta["labels"] = dict(part.changes)
        if handoff:
            meta["annotations"] = dict(handoff)
        first = _enrolment(snap, node, part.changes) if part.changes else None
        if first is not None:
            meta["labels"].update(first.labels)
            if first.annotations:
                meta.setdefault("annotations", {}).update(first.annotations)
        say = Say(
            log="node labels",
            fields=(
                ("node", snap.name),
                ("changes", meta.get("labels")),
                ("annotations", handoff or None),
            ),
        )
        return NodePlan(
            snap.name,
            node,
            said=part.said,
            says=part.says,
            label_patch={"metadata": meta},
            label_say=say,
            again=replace(
                recheck,
                now=not _settled_by(snap, after, first),
                fleet=first is not None,
                progress=_moves_cluster_facts(labels_of(node), {"metadata": meta}),
            ),
        )
    node_labels = labels_of(node)
    policy = _upgrade_policy(snap, node_labels, part.target)
    if policy is None:
        return NodePlan(snap.name, node, said=part.said, says=part.says, again=recheck)
    upgrade = _upgrade(snap, node, node_labels, policy, part.recheck)
    again = _again(upgrade.decision, part.recheck)
    if upgrade.resting != "keep":
        unown = {"metadata": {"labels": {OWNER_LABEL: None}}} if upgrade.unown else {}
        again = replace(again, progress=_moves_cluster_facts(node_labels, upgrade.patch, unown))
    return NodePlan(snap.name, node, said=part.said, says=part.says, upgrade=upgrade, again=again)


__all__ = [
    "EMPTYING_POLL_SECONDS",
    "GPU_PODS_RECHECK_S",
    "DriverFacts",
    "LiveReads",
    "NodeAgain",
    "NodePlan",
    "NodeSnapshot",
    "Reads",
    "RestingAnswer",
    "Say",
    "UpgradeWrite",
    "cluster_label_facts",
    "handover",
    "handover_say",
    "labels_of",
    "node_patch",
    "nothing_holds_claim",
    "plan_node",
    "plan_reads",
    "plan_upgrade",
    "requeue_after",
    "target_owner",
    "upgrade_reads",
    "upgrade_says",
    "workload_say",
]
