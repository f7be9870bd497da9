"""Driver upgrades: the imperative side of the per-node upgrade rulebook.

The rulebook (``statemachine.upgrade``) decides; this module builds its inputs from
the caches (plus, for nodes being emptied, a LIST of the pods on that node) and
carries out its decisions: one merge patch for labels, annotations and cordon state,
then the side effect (delete GPU pods, evict, restart the driver pod).

Only the serial fleet key (``upgrades``) starts upgrades: it moves the nodes the
budget selects from ``upgrade-required`` to ``cordon-required`` (cordoned in the same
patch). A slot is that persisted state, never memory, so a restart or a node pass
racing the fleet pass cannot hand out more slots than the budget allows; node keys
carry a node on from ``cordon-required``.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from kubernetes_asyncio.client.exceptions import ApiException

from components.driver import DAEMONSET_NAME as DRIVER_DS
from components.driver import digest_in, rollout_key
from components.labels import is_gpu_node
from components.validator import DAEMONSET_NAME as VALIDATOR_DS
from crd import OWNER_LABEL
from gpuop.kube.informer import Informer, Obj
from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Rest
from gpuop.log import get_logger
from gpuop.operator.controller.views.node_views import is_ready, labels
from gpuop.operator.controller.views.pod_records import PodRecord, pods_on
from gpuop.operator.controller.views.resting import RestingMemo
from gpuop.operator.controller.views.upgrade_inputs import (
    driver_pod_view,
    newest_revision,
    pod_ready,
    selector,
)
from gpuop.operator.controller.views.upgrade_inputs import policy_view as policy_view
from gpuop.operator.controller.writers.eviction import Emptying
from gpuop.operator.events import EventRecorder
from gpuop.operator.metrics import OperatorMetrics
from statemachine import (
    Action,
    BudgetNode,
    Decision,
    DriverPodView,
    NodeUpgradeView,
    UpgradePolicyView,
    UpgradeState,
    next_step,
    select_nodes,
    start_step,
)
from statemachine.eviction import RemovalPlan
from statemachine.rollback import revisions_to_restore
from statemachine.upgrade_keys import DRIVER_REVISION_LABEL, STATE_LABEL, parse_state

log = get_logger(__name__)

POD = by_kind("v1", "Pod")
NODE = by_kind("v1", "Node")
#: While a node is being emptied, pods elsewhere in the cluster are not watched
#: (that would cache every pod of the fleet); the node is looked at again after this.
EMPTYING_POLL_SECONDS = 2.0
_EMPTYING = {
    UpgradeState.WAIT_FOR_JOBS_REQUIRED,
    UpgradeState.POD_DELETION_REQUIRED,
    UpgradeState.DRAIN_REQUIRED,
}


@dataclass
class UpgradeTally:
    """The upgrade gauges summed over every budget one fleet pass counted (the
    ClusterPolicy's nodes and each NVIDIADriver's), published once at its end.

    One gauge per operator, as upstream reports it: set per budget, the gauges showed
    only the last owner the pass handled, and a node failed under an earlier owner
    read ``gpu_operator_nodes_upgrades_failed 0``, so the failure alerts never fired
    (issue 43). ``available`` sums each budget's free slots (each owner has its own)."""

    in_progress: int = 0
    done: int = 0
    failed: int = 0
    pending: int = 0
    available: int = 0
    budgets: int = 0
    """How many budgets were counted: with none, the gauges are left as they are."""

    def count(self, fleet: Iterable[BudgetNode], available: int) -> None:
        """Add one budget's GPU nodes and its free slots."""
        states: Counter[UpgradeState] = Counter()
        for node in fleet:
            states[node.state] += 1
            self.in_progress += 1 if node.in_progress else 0
        self.done += states[UpgradeState.UPGRADE_DONE]
        self.failed += states[UpgradeState.UPGRADE_FAILED]
        self.pending += states[UpgradeState.UPGRADE_REQUIRED]
        self.available += available
        self.budgets += 1

    def publish(self, metrics: OperatorMetrics) -> None:
        """Set the gauges to the sums (nothing when no budget was counted)."""
        if not self.budgets:
            return
        metrics.upgrades_in_progress.set(self.in_progress)
        metrics.upgrades_done.set(self.done)
        metrics.upgrades_failed.set(self.failed)
        metrics.upgrades_pending.set(self.pending)
        metrics.upgrades_available.set(self.available)


class DriverApps(Protocol):
    """Which driver DaemonSet (its `app`) runs on a node (``DriverOwners``)."""

    def driver_app(self, node: str) -> str: ...


class PolicyDriverOnly:
    """No NVIDIADrivers: every node runs the ClusterPolicy's driver DaemonSet."""

    def driver_app(self, node: str) -> str:
        return DRIVER_DS


class Upgrades:
    """Carries out upgrade decisions for the operator (which owns the caches)."""

    def __init__(
        self,
        rest: Rest,
        metrics: OperatorMetrics,
        events: EventRecorder,
        namespace: str,
        pods: Informer[PodRecord],
        revisions: Any,
        daemonsets: Any,
        nodes: Any,
        owners: DriverApps | None = None,
        dra_validators: Informer[PodRecord] | None = None,
    ) -> None:
        self.rest = rest
        self.metrics = metrics
        self.namespace = namespace
        self._pods = pods
        #: The DRA validator's pods (beside a GPUCluster): upstream's validation gate
        #: selects `app=nvidia-operator-validator`, which they carry as ours do.
        self._dra_validators = dra_validators
        self._revisions = revisions
        self._daemonsets = daemonsets
        self._nodes = nodes
        self.events = events
        self.emptying = Emptying(rest, namespace)
        self._blocked: dict[str, str] = {}
        #: Per node, the last decision that did nothing and started no clock
        #: (:mod:`gpuop.operator.controller.views.resting`).
        self._resting = RestingMemo()
        #: Overrides the bound of pod-restart-required the policy's startup probe gives
        #: (see ``UpgradePolicyView``); for tests only.
        self.driver_ready_timeout_seconds: int | None = None
        #: Which driver DaemonSet (its `app`) runs on a node; its pods are in the
        #: operand pods cache like every other driver's.
        self._owners = owners if owners is not None else PolicyDriverOnly()

    # ------------------------------------------------------------- inputs
    def newest_driver_revision(self, app: str = DRIVER_DS) -> str | None:
        return newest_revision(
            self._daemonsets.get(f"{self.namespace}/{app}"), self._revisions.values()
        )

    def template_digest(self, app: str) -> str:
        """The driver config digest of the DaemonSet's current pod template."""
        ds = self._daemonsets.get(f"{self.namespace}/{app}")
        template = ((ds or {}).get("spec") or {}).get("template") or {}
        return digest_in(template.get("spec") or {})

    def rollout(self, apps: Iterable[str]) -> tuple[str | None, str]:
        """The rollout gate's target and key over the policy's driver DaemonSets ``apps``
        (one per kernel when precompiled): their newest revisions (joined when several;
        the gate compares each node with its own DaemonSet's) and their rollout key."""
        templates = []
        newest = []
        for app in sorted(apps):
            ds = self._daemonsets.get(f"{self.namespace}/{app}")
            if ds is None:
                continue
            template = ((ds.get("spec") or {}).get("template") or {}).get("spec") or {}
            templates.append((template.get("nodeSelector") or {}, template))
            revision = self.newest_driver_revision(app)
            if revision:
                newest.append(revision)
        return (",".join(newest) or None), rollout_key(templates)

    def restore_revisions(self, apps: Iterable[str]) -> dict[str, str]:
        """Per driver DaemonSet of ``apps``, the revision a rollback returns it to: the
        one most of its live pods still run that is not its newest."""
        wanted = set(apps)
        pods: dict[str, list[str | None]] = {app: [] for app in wanted}
        for pod in self._pods.values():
            if pod.app in wanted and not pod.deleting:
                pods[pod.app].append(pod.labels.get(DRIVER_REVISION_LABEL))
        newest = {app: self.newest_driver_revision(app) for app in wanted}
        return revisions_to_restore(pods, newest)

    def _driver_pods_on(self, node: str, app: str | None = None) -> list[PodRecord]:
        """The pods of ``app`` (asked of the owners when not given) on ``node``."""
        app = self._owners.driver_app(node) if app is None else app
        return pods_on(self._pods, node, app)

    def _live_driver_pods(self, node: str, app: str | None = None) -> list[PodRecord]:
        return [p for p in self._driver_pods_on(node, app) if not p.deleting]

    def driver_record(self, node: str, app: str | None = None) -> PodRecord | None:
        """The node's newest live driver pod, as the cache keeps it."""
        pods = self._live_driver_pods(node, app)
        return max(pods, key=lambda p: p.created) if pods else None

    def driver_pod(self, node: str, app: str | None = None) -> DriverPodView | None:
        record = self.driver_record(node, app)
        return None if record is None else driver_pod_view(record)

    def has_driver_pod(self, node: str) -> bool:
        """``driver_pod(node) is not None`` without building the view (the fleet pass
        asks this for every GPU node)."""
        return bool(self._live_driver_pods(node))

    def validators_ready(self, node: str) -> bool:
        pods = pods_on(self._pods, node, VALIDATOR_DS)
        if self._dra_validators is not None:
            pods += pods_on(self._dra_validators, node, VALIDATOR_DS)
        return bool(pods) and all(pod_ready(p) for p in pods)

    async def drain(self, node: str, policy: UpgradePolicyView) -> RemovalPlan:
        """One pass of the drain rules over `node` (health remediation drains so too)."""
        return await self.emptying.drain(node, policy)

    async def view(
        self, node: Obj, policy: UpgradePolicyView, newest: str | None, app: str | None = None
    ) -> NodeUpgradeView:
        """The rulebook's inputs for ``node``; ``app``: its driver DaemonSet, as the node
        pass already asked (asked of the owners when not given)."""
        name = node["metadata"]["name"]
        app = self._owners.driver_app(name) if app is None else app
        node_labels = labels(node)
        wait = 0
        gpu = drain = RemovalPlan()
        state = parse_state(node_labels.get(STATE_LABEL))
        # The rulebook may pass several states in one go, so count the node's pods
        # whenever emptying could be next: also right after the grant (cordon-required).
        if state in _EMPTYING or state is UpgradeState.CORDON_REQUIRED:
            if policy.pod_deletion is not None:
                gpu = await self.emptying.gpu_plan(name, policy)
            if policy.drain.enable:
                drain = await self.emptying.drain_plan(name, policy)
            wait_selector = selector(policy.wait_for_completion.pod_selector)
            if wait_selector:
                # Upstream waits while any selected pod is Running or Pending.
                wait = sum(
                    1
                    for p in await self.emptying.node_pods(name, wait_selector)
                    if (p.get("status") or {}).get("phase") in ("Running", "Pending")
                )
        left: tuple[str, ...] = ()
        if state is UpgradeState.POD_DELETION_REQUIRED:
            left = self.emptying.left(name, gpu.remaining)
        elif state is UpgradeState.DRAIN_REQUIRED:
            left = self.emptying.left(name, drain.remaining)
        return replace(
            self._cached_view(node, newest, app),
            wait_pods_running=wait,
            gpu_pods=len(gpu.remaining),
            gpu_pods_refused=gpu.refusals,
            drain_pods=len(drain.remaining),
            drain_refused=drain.refusals,
            pods_left=left,
        )

    def _cached_view(self, node: Obj, newest: str | None, app: str) -> NodeUpgradeView:
        """The node as the caches show it, with no pod counts (the grant needs none)."""
        name = node["metadata"]["name"]
        return NodeUpgradeView(
            name=name,
            now=time.time(),
            labels=labels(node),
            annotations=node["metadata"].get("annotations") or {},
            unschedulable=bool(node["spec"].get("unschedulable")),
            node_ready=is_ready(node),
            driver_pod=self.driver_pod(name, app),
            newest_revision=newest,
            validators_ready=self.validators_ready(name),
            newest_config_digest=self.template_digest(app),
        )

    # --------------------------------------------------------- fleet budget
    async def grant(
        self,
        nodes: list[Obj],
        policy: UpgradePolicyView,
        held: Mapping[str, str] | None = None,
        tally: UpgradeTally | None = None,
    ) -> tuple[list[str], bool]:
        """Start the nodes the budget selects; returns them, and whether a grant met a
        newer node than the cache's (409: try again once the watch catches up).

        The budget counts persisted in-progress states only. Each start is one merge
        patch (state label, start bookkeeping, cordon) guarded by the node's
        resourceVersion. ``held``: nodes the rollout gate keeps back. The budget's
        counts go to ``tally`` (the fleet pass sums every owner's, then publishes);
        without one, this budget alone is the fleet and the metrics are set here.
        """
        by_name = {n["metadata"]["name"]: n for n in nodes}
        fleet = self._budget_nodes(nodes)
        selection = select_nodes(
            fleet,
            max_parallel_upgrades=policy.max_parallel_upgrades,
            max_unavailable=policy.max_unavailable,
            held=held,
        )
        if tally is None:
            alone = UpgradeTally()
            alone.count(fleet, selection.available)
            alone.publish(self.metrics)
        else:
            tally.count(fleet, selection.available)
        for name, why in selection.blocked.items():
            if self._blocked.get(name) != why:
                log.warning("upgrade blocked, others proceed", node=name, reason=why)
        self._blocked = dict(selection.blocked)
        started: list[str] = []
        conflict = False
        for name in selection.start:
            node = by_name[name]
            app = self._owners.driver_app(name)
            newest = self.newest_driver_revision(app)
            decision = start_step(self._cached_view(node, newest, app), policy)
            if decision is None:
                continue
            try:
                await self._persist(node, decision)
            except ApiException as err:
                if err.status != 409:
                    raise
                conflict = True
                continue
            started.append(name)
            await self._report(node, decision)
        return started, conflict

    def _budget_nodes(self, nodes: list[Obj]) -> list[BudgetNode]:
        """The GPU nodes as the budget sees them."""
        return [
            BudgetNode.from_node(n, self.has_driver_pod) for n in nodes if is_gpu_node(labels(n))
        ]

    # ------------------------------------------------------------ decisions
    async def step(
        self, node: Obj, policy: UpgradePolicyView, newest: str | None, app: str | None = None
    ) -> Decision:
        """One node's next step from ``cordon-required`` on (never a start); ``app``: its
        driver DaemonSet, as the node pass asked once (asked here when not given)."""
        if policy.auto_upgrade and self.driver_ready_timeout_seconds is not None:
            policy = replace(policy, driver_ready_timeout_seconds=self.driver_ready_timeout_seconds)
        app = self._owners.driver_app(node["metadata"]["name"]) if app is None else app
        view = await self.view(node, policy, newest, app)
        driver = self.driver_record(view.name, app)
        rested = self._resting.get(policy, view, driver)
        if rested is not None:
            return rested
        decision = next_step(view, policy)
        if _at_rest(decision) and not self._node_patch(node, decision):
            self._resting.put(policy, view, driver, decision)
        else:
            self._resting.forget(view.name)
        try:
            await self._persist(node, decision)
        except ApiException as err:
            if err.status != 409:
                raise
            # The fleet pass started the node meanwhile: its watch event brings us back.
            return Decision(view.name, decision.current, decision.current, Action.NONE, "")
        if decision.target not in _EMPTYING or decision.target is not decision.current:
            self.emptying.forget(view.name)  # a new step: its own refusals only
        await self._act(view, decision, policy, app)
        await self._report(node, decision)
        return decision

    async def _report(self, node: Obj, decision: Decision) -> None:
        """Events and logs for what a decision did."""
        name, ref = node["metadata"]["name"], _node_ref(node)
        if decision.notice:
            log.warning("driver upgrade setback", node=name, reason=decision.notice)
            await self.events.record(
                ref, "DriverUpgradePodDeletionFailed", decision.notice, warning=True
            )
        for reason, message in decision.alerts:
            log.warning("driver upgrade bookkeeping repaired", node=name, reason=message)
            await self.events.record(ref, reason, message, warning=True)
        if decision.entered_failed:
            log.warning("driver upgrade failed", node=name, reason=decision.failure)
            await self.events.record(ref, "DriverUpgradeFailed", decision.failure, warning=True)
        elif (
            decision.changed_state
            and decision.target is UpgradeState.UPGRADE_DONE
            and (decision.current is not UpgradeState.UNKNOWN)
        ):
            await self.events.record(ref, "DriverUpgradeDone", f"driver upgraded on {name}")
        elif "start" in decision.triggers:
            await self.events.record(
                ref, "DriverUpgradeStarted", f"driver upgrade started on {name}"
            )
        if decision.changed_state:
            log.info(
                "driver upgrade",
                node=name,
                from_state=decision.current.value,
                to_state=decision.target.value,
                reason=decision.reason,
            )

    async def _persist(self, node: Obj, decision: Decision) -> None:
        """One merge patch. Leaving ``upgrade-required`` is guarded by the node's
        resourceVersion: the fleet pass (start) and a node pass (cancel, cleanup) may
        both decide it, and only the first to land on the version they read wins."""
        patch = self._node_patch(node, decision)
        if not patch:
            return
        rv = node["metadata"].get("resourceVersion")
        if decision.current is UpgradeState.UPGRADE_REQUIRED and rv:
            patch["metadata"] = {**patch.get("metadata", {}), "resourceVersion": rv}
        patched = await self.rest.merge_patch(NODE, node["metadata"]["name"], patch)
        self._nodes.observe(patched)

    @staticmethod
    def _node_patch(node: Obj, decision: Decision) -> dict[str, Any]:
        """What the decision changes on the node: labels, annotations, the cordon."""
        patch: dict[str, Any] = dict(decision.merge_patch())
        cordon = _wanted_unschedulable(decision)
        if cordon is not None and bool(node["spec"].get("unschedulable")) != cordon:
            patch["spec"] = {"unschedulable": cordon if cordon else None}
        return patch

    def forget_node(self, name: str) -> None:
        """The node is gone: drop what was kept for it."""
        self._resting.forget(name)

    async def _act(
        self, view: NodeUpgradeView, decision: Decision, policy: UpgradePolicyView, app: str
    ) -> None:
        action = decision.action
        if action is Action.DELETE_GPU_PODS:
            plan = await self.emptying.gpu_plan(view.name, policy)
            await self.emptying.evict(view.name, plan)
        elif action is Action.DRAIN:
            await self.emptying.drain(view.name, policy)
        elif action is Action.RESTART_DRIVER_POD:
            # Our own DaemonSet's pod: deleted, as upstream does; it comes straight back,
            # unless the node moves to another NVIDIADriver: then the owner label goes
            # first, so the old DaemonSet lets go of the node, and the new owner gets it
            # once the pod has left (NVIDIADrivers.reconcile).
            pods = self._driver_pods_on(view.name, app)
            if view.moving and OWNER_LABEL in view.labels:
                patch = {"metadata": {"labels": {OWNER_LABEL: None}}}
                self._nodes.observe(await self.rest.merge_patch(NODE, view.name, patch))
                log.info("driver owner", node=view.name, owner=None, reason="moving")
            for pod in pods:
                await self.rest.delete(POD, pod.name, pod.namespace)


def _node_ref(node: Obj) -> Obj:
    return {"apiVersion": "v1", "kind": "Node", "metadata": node["metadata"]}


def _wanted_unschedulable(decision: Decision) -> bool | None:
    if decision.action is Action.CORDON:
        return True
    if decision.action is Action.UNCORDON:
        return False
    return None


def requeue_after(decision: Decision) -> float | None:
    """When to look at the node again without a watch event (timeouts, emptying)."""
    delays = [d for d in (decision.requeue_after,) if d is not None]
    if decision.target in _EMPTYING:
        delays.append(EMPTYING_POLL_SECONDS)
    return min(delays) if delays else None


def _at_rest(decision: Decision) -> bool:
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
