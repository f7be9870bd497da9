"""Driver upgrades: the imperative side of the per-node upgrade rulebook.

The rulebook (``statemachine.upgrade``) decides; this module reads its inputs from the
caches (the node pass's driver facts and resting answer, ``node_facts``; its read,
plan and write are ``_node_read``, ``statemachine.node_plan`` and ``_node_write``) and
grants the fleet's upgrade slots: one merge patch per start.

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
from dataclasses import dataclass
from typing import Any, Protocol

from kubernetes_asyncio.client.exceptions import ApiException

from components.driver import DAEMONSET_NAME as DRIVER_DS
from components.driver import digest_in, rollout_key
from components.labels import is_gpu_node
from components.validator import DAEMONSET_NAME as VALIDATOR_DS
from gpuop.kube.informer import Informer, Obj
from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Rest
from gpuop.log import get_logger
from gpuop.operator.controller.views.node_views import is_ready, labels
from gpuop.operator.controller.views.pod_records import (
    PodRecord,
    driver_pod_view,
    pod_ready,
    pods_on,
)
from gpuop.operator.controller.views.resting import RestingMemo
from gpuop.operator.controller.views.upgrade_inputs import (
    newest_revision,
    revision_lags,
    template_spec,
)
from gpuop.operator.controller.views.upgrade_inputs import policy_view as policy_view
from gpuop.operator.controller.writers.eviction import Emptying
from gpuop.operator.events import EventRecorder
from gpuop.operator.metrics import OperatorMetrics
from statemachine import (
    BudgetNode,
    Decision,
    DriverPodView,
    NodeUpgradeView,
    UpgradePolicyView,
    UpgradeState,
    select_nodes,
    start_step,
)
from statemachine.eviction import RemovalPlan
from statemachine.node_plan import EMPTYING_POLL_SECONDS as EMPTYING_POLL_SECONDS
from statemachine.node_plan import (
    DriverFacts,
    RestingAnswer,
    UpgradeWrite,
    node_patch,
    upgrade_says,
)
from statemachine.node_plan import requeue_after as requeue_after
from statemachine.rollback import revisions_to_restore
from statemachine.upgrade_keys import DRIVER_REVISION_LABEL

log = get_logger(__name__)

POD = by_kind("v1", "Pod")
NODE = by_kind("v1", "Node")


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
        return digest_in(template_spec(self._daemonsets.get(f"{self.namespace}/{app}")))

    def rollout(self, apps: Iterable[str]) -> tuple[str | None, str, bool]:
        """The rollout gate's target and key over the policy's driver DaemonSets ``apps``
        (one per kernel when precompiled): their newest revisions (joined when several;
        the gate compares each node with its own DaemonSet's), their rollout key, and
        whether the two agree (no DaemonSet's newest revision lags its template:
        ``revision_lags``)."""
        templates = []
        newest = []
        settled = True
        for app in sorted(apps):
            ds = self._daemonsets.get(f"{self.namespace}/{app}")
            if ds is None:
                continue
            template = template_spec(ds)
            templates.append((template.get("nodeSelector") or {}, template))
            revision = self.newest_driver_revision(app)
            if revision:
                newest.append(revision)
            settled = settled and not revision_lags(ds, self._revisions.values())
        return (",".join(newest) or None), rollout_key(templates), settled

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
    async def _report(self, node: Obj, decision: Decision) -> None:
        """Events and logs for what a decision did (as the node pass says them)."""
        ref = _node_ref(node)
        for say in upgrade_says(node["metadata"]["name"], decision):
            if say.log:
                (log.warning if say.log_warning else log.info)(say.log, **dict(say.fields))
            if say.reason:
                await self.events.record(ref, say.reason, say.message, warning=say.warning)

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
        return node_patch(node, decision)

    def forget_node(self, name: str) -> None:
        """The node is gone: drop what was kept for it."""
        self._resting.forget(name)

    # ------------------------------------------------------- the node pass
    def node_facts(
        self, name: str, app: str
    ) -> tuple[DriverFacts, RestingAnswer | None, dict[str, str]]:
        """What the node pass reads of the node's driver from the caches, its resting
        answer, and the evictions refused on it (``statemachine.node_plan``)."""
        pods = self._driver_pods_on(name, app)
        live = [p for p in pods if not p.deleting]
        record = max(live, key=lambda p: p.created) if live else None
        driver_pod = None if record is None else driver_pod_view(record)
        driver = DriverFacts(
            app=app,
            newest_revision=self.newest_driver_revision(app) if app else None,
            newest_config_digest=self.template_digest(app),
            driver_pod=driver_pod,
            validators_ready=self.validators_ready(name),
            driver_pods=tuple((p.name, p.namespace) for p in pods),
        )
        entry = self._resting.entry(name)
        resting = None
        if entry is not None:
            if entry.driver is record:
                kept = driver_pod
            else:
                kept = None if entry.driver is None else driver_pod_view(entry.driver)
            resting = RestingAnswer(entry.policy, entry.view, kept, entry.decision)
        return driver, resting, self.emptying.refusals(name)

    def remember(self, name: str, step: UpgradeWrite) -> None:
        """Keeps the resting memo as the node pass's plan says: an answer at rest is
        remembered (with the cache's current driver record), any other forgotten."""
        if step.resting == "forget":
            self._resting.forget(name)
            return
        record = self.driver_record(name, step.app)
        if step.resting == "put":
            self._resting.put(step.policy, step.view, record, step.decision)
        else:
            self._resting.hold(name, record)


def _node_ref(node: Obj) -> Obj:
    return {"apiVersion": "v1", "kind": "Node", "metadata": node["metadata"]}
