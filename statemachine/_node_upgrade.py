"""The node pass's upgrade half (:mod:`statemachine.node_plan`): the rulebook's view of
the node from its snapshot, one step of ``statemachine.upgrade.next_step``, and what
it writes, says and when it runs again."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from components.keys import CONTAINER_WORKLOAD, DEPLOY_DRIVER_LABEL, TRUE
from components.labels import (
    apply_label_changes,
    is_gpu_node,
)
from crd import OWNER_LABEL
from statemachine._node_snapshot import (
    EMPTYING_STATES,
    GPU_PODS_RECHECK_S,
    Node,
    NodeAgain,
    NodeSnapshot,
    Say,
    UpgradeWrite,
    at_rest,
    labels_of,
    node_patch,
    requeue_after,
    target_owner,
)
from statemachine.eviction import (
    RemovalPlan,
    drain_rules,
    gpu_pod_rules,
    gpu_workload,
    plan_removal,
)
from statemachine.upgrade import next_step
from statemachine.upgrade_keys import STATE_LABEL, UpgradeState, parse_state
from statemachine.upgrade_views import (
    Action,
    Decision,
    NodeUpgradeView,
    UpgradePolicyView,
)


def _cached_view(snap: NodeSnapshot, node: Node, node_labels: Mapping[str, str]) -> NodeUpgradeView:
    meta = node["metadata"]
    status = node.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or ()
    )
    driver = snap.driver
    return NodeUpgradeView(
        name=snap.name,
        now=snap.now,
        labels=node_labels,
        annotations=meta.get("annotations") or {},
        unschedulable=bool((node.get("spec") or {}).get("unschedulable")),
        node_ready=ready,
        driver_pod=driver.driver_pod,
        newest_revision=driver.newest_revision,
        validators_ready=driver.validators_ready,
        newest_config_digest=driver.newest_config_digest,
    )


def _enrolment(
    snap: NodeSnapshot, node: Node, changes: Mapping[str, str | None]
) -> Decision | None:
    """The upgrade state a new GPU node starts in, written with its deploy labels.

    Upstream writes ``upgrade-done`` once the driver pod runs, a second patch per node
    during a rollout; a node with no driver pod that is about to get the ClusterPolicy's
    driver has nothing to upgrade, so the rulebook's ``enrolled`` step says so in the
    same write. Anything else waits for the node pass.
    """
    spec = snap.spec
    if spec is None or not spec.driver.enabled or spec.driver.use_nvidia_driver_crd:
        return None
    after = apply_label_changes(labels_of(node), changes)
    if after.get(DEPLOY_DRIVER_LABEL) != TRUE or target_owner(after):
        return None
    policy = snap.spec_policy or UpgradePolicyView()
    if not (policy.auto_upgrade and is_gpu_node(after)) or STATE_LABEL in after:
        return None
    view = replace(_cached_view(snap, node, after), enrolling=True)
    decision = next_step(view, policy)
    if decision.target is not UpgradeState.UPGRADE_DONE or decision.action is not Action.NONE:
        return None
    return decision


def _nvd_unknown(snap: NodeSnapshot, owned: bool) -> bool:
    """Whether upgrade decisions would read NVIDIADrivers before their cache listed: a
    node's (or, ``owned``, this node's) driver and upgradePolicy may be a resource's,
    and reading "no resource" as "auto-upgrade off" uncordons nodes in the middle of
    their upgrade and forgets it."""
    if snap.owners_listed:
        return False
    return owned or (snap.spec is not None and snap.spec.driver.use_nvidia_driver_crd)


def _upgrade_policy(
    snap: NodeSnapshot, node_labels: Mapping[str, str], target: str
) -> UpgradePolicyView | None:
    """The policy the node's upgrade step runs under; None: no step this pass."""
    owner = target_owner(node_labels)
    if _nvd_unknown(snap, bool(owner)):
        return None  # which policy applies is not known yet: woken once listed
    policy = snap.spec_policy if snap.spec is not None else None
    policy = policy or UpgradePolicyView()
    if owner:
        # An NVIDIADriver drives this node (or is to): its own upgradePolicy applies.
        policy = (snap.owner_policies or {}).get(owner) or UpgradePolicyView(auto_upgrade=False)
    if not (policy.auto_upgrade and is_gpu_node(node_labels) and target == CONTAINER_WORKLOAD):
        if STATE_LABEL not in node_labels:
            return None
        # Upgrades off, no policy (uninstall), no longer a GPU node, or a VM host now
        # (its driver left with its deploy label: nothing to upgrade): the rulebook
        # uncordons what we cordoned and removes our label and annotations.
        policy = UpgradePolicyView(auto_upgrade=False)
    return _with_ready_timeout(snap, policy)


def _with_ready_timeout(snap: NodeSnapshot, policy: UpgradePolicyView) -> UpgradePolicyView:
    if policy.auto_upgrade and snap.ready_timeout is not None:
        return replace(policy, driver_ready_timeout_seconds=snap.ready_timeout)
    return policy


def _emptying_next(node_labels: Mapping[str, str]) -> bool:
    """The rulebook may pass several states in one go, so the node's pods are counted
    whenever emptying could be next: also right after the grant (cordon-required)."""
    state = parse_state(node_labels.get(STATE_LABEL))
    return state in EMPTYING_STATES or state is UpgradeState.CORDON_REQUIRED


def _left(snap: NodeSnapshot, keys: tuple[str, ...]) -> tuple[str, ...]:
    """The pods a step still waits for, each with why its eviction was refused."""
    refused = snap.refused
    return tuple(f"{k} ({refused[k]})" if k in refused else k for k in keys)


def _upgrade_view(
    snap: NodeSnapshot, node: Node, node_labels: Mapping[str, str], policy: UpgradePolicyView
) -> tuple[NodeUpgradeView, RemovalPlan, RemovalPlan]:
    """The rulebook's inputs, and the removal plans the pods read make."""
    wait = 0
    gpu = drain = RemovalPlan()
    live = snap.live
    if _emptying_next(node_labels):
        if policy.pod_deletion is not None:
            pods = [
                p
                for p in live.node_pods or ()
                if gpu_workload(p) and p["metadata"].get("namespace") != snap.namespace
            ]
            gpu = plan_removal(pods, gpu_pod_rules(policy))
        if policy.drain.enable:
            drain = plan_removal(live.drain_pods or (), drain_rules(policy))
        if live.wait_pods is not None:
            # Upstream waits while any selected pod is Running or Pending.
            wait = sum(
                1
                for p in live.wait_pods
                if (p.get("status") or {}).get("phase") in ("Running", "Pending")
            )
    state = parse_state(node_labels.get(STATE_LABEL))
    left: tuple[str, ...] = ()
    if state is UpgradeState.POD_DELETION_REQUIRED:
        left = _left(snap, gpu.remaining)
    elif state is UpgradeState.DRAIN_REQUIRED:
        left = _left(snap, drain.remaining)
    view = replace(
        _cached_view(snap, node, node_labels),
        wait_pods_running=wait,
        gpu_pods=len(gpu.remaining),
        gpu_pods_refused=gpu.refusals,
        drain_pods=len(drain.remaining),
        drain_refused=drain.refusals,
        pods_left=left,
    )
    return view, gpu, drain


def _rested(
    snap: NodeSnapshot, policy: UpgradePolicyView, view: NodeUpgradeView
) -> Decision | None:
    kept = snap.resting
    if kept is None or kept.policy != policy:
        return None
    if kept.view != replace(view, now=0.0, driver_pod=None) or kept.driver_pod != view.driver_pod:
        return None
    return replace(kept.decision, node=view.name)


def upgrade_says(name: str, decision: Decision) -> tuple[Say, ...]:
    """Events and logs for what a decision did."""
    says: list[Say] = []
    if decision.notice:
        says.append(
            Say(
                "DriverUpgradePodDeletionFailed",
                decision.notice,
                warning=True,
                log="driver upgrade setback",
                log_warning=True,
                fields=(("node", name), ("reason", decision.notice)),
            )
        )
    for reason, message in decision.alerts:
        says.append(
            Say(
                reason,
                message,
                warning=True,
                log="driver upgrade bookkeeping repaired",
                log_warning=True,
                fields=(("node", name), ("reason", message)),
            )
        )
    if decision.entered_failed:
        says.append(
            Say(
                "DriverUpgradeFailed",
                decision.failure,
                warning=True,
                log="driver upgrade failed",
                log_warning=True,
                fields=(("node", name), ("reason", decision.failure)),
            )
        )
    elif (
        decision.changed_state
        and decision.target is UpgradeState.UPGRADE_DONE
        and (decision.current is not UpgradeState.UNKNOWN)
    ):
        says.append(Say("DriverUpgradeDone", f"driver upgraded on {name}"))
    elif "start" in decision.triggers:
        says.append(Say("DriverUpgradeStarted", f"driver upgrade started on {name}"))
    if decision.changed_state:
        says.append(
            Say(
                log="driver upgrade",
                fields=(
                    ("node", name),
                    ("from_state", decision.current.value),
                    ("to_state", decision.target.value),
                    ("reason", decision.reason),
                ),
            )
        )
    return tuple(says)


def _again(decision: Decision, recheck: bool) -> NodeAgain:
    delay = requeue_after(decision)
    if recheck:
        delay = GPU_PODS_RECHECK_S if delay is None else min(delay, GPU_PODS_RECHECK_S)
    return NodeAgain(
        requeue_after=delay,
        # No clock runs for the node now: drop a timer left from an earlier state
        # (pod-restart's 600 s, say), or it fires for nothing and the queue never idles.
        forget=requeue_after(decision) is None,
        # The next step may already be due.
        now=decision.has_patch or decision.action in (Action.CORDON, Action.UNCORDON),
        fleet=decision.changed_state,
    )


def _upgrade(
    snap: NodeSnapshot,
    node: Node,
    node_labels: Mapping[str, str],
    policy: UpgradePolicyView,
    recheck: bool,
) -> UpgradeWrite:
    view, gpu, drain = _upgrade_view(snap, node, node_labels, policy)
    rested = _rested(snap, policy, view)
    if rested is not None:
        return UpgradeWrite(
            rested, policy, view, "keep", snap.driver.app, on_conflict=_again(rested, recheck)
        )
    decision = next_step(view, policy)
    patch = node_patch(node, decision)
    remember = "put" if at_rest(decision) and not patch else "forget"
    rv = node["metadata"].get("resourceVersion")
    if patch and decision.current is UpgradeState.UPGRADE_REQUIRED and rv:
        # Leaving upgrade-required is guarded by the node's resourceVersion: the fleet
        # pass (start) and a node pass (cancel, cleanup) may both decide it, and only
        # the first to land on the version they read wins.
        patch["metadata"] = {**patch.get("metadata", {}), "resourceVersion": rv}
    action = decision.action
    evict: RemovalPlan | None = None
    if action is Action.DELETE_GPU_PODS:
        evict = gpu
    elif action is Action.DRAIN:
        evict = drain
    restart = action is Action.RESTART_DRIVER_POD
    noop = Decision(view.name, decision.current, decision.current, Action.NONE, "")
    return UpgradeWrite(
        decision,
        policy,
        view,
        remember,
        snap.driver.app,
        patch=patch,
        forget_refusals=(
            decision.target not in EMPTYING_STATES or decision.target is not decision.current
        ),
        evict=evict,
        # Our own DaemonSet's pod: deleted, as upstream does; it comes straight back,
        # unless the node moves to another NVIDIADriver: then the owner label goes
        # first, so the old DaemonSet lets go of the node, and the new owner gets it
        # once the pod has left (NVIDIADrivers.reconcile).
        unown=restart and view.moving and OWNER_LABEL in view.labels,
        delete_pods=snap.driver.driver_pods if restart else (),
        says=upgrade_says(view.name, decision),
        # The fleet pass started the node meanwhile: its watch event brings us back.
        on_conflict=_again(noop, recheck),
    )
