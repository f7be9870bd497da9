"""Driver upgrades: the imperative side of the per-node upgrade rulebook.

The rulebook (``statemachine.upgrade``) decides; this module builds its inputs
from the caches (plus, for nodes being emptied, a LIST of the pods on that node)
and carries out its decisions: one merge patch for labels, annotations and
cordon state, then the side effect (delete GPU pods, evict, restart the driver
pod). Which nodes may *start* is decided by one serial ``upgrades`` key over the
whole fleet, so the parallelism budget holds however many workers run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from components.driver import DAEMONSET_NAME as DRIVER_DS
from components.driver import digest_in
from components.labels import is_gpu_node
from components.validator import DAEMONSET_NAME as VALIDATOR_DS
from crd import ClusterPolicySpec
from gpuop.controller._nodes import is_ready, labels
from gpuop.events import EventRecorder
from gpuop.informer import Obj
from gpuop.log import get_logger
from gpuop.metrics import OperatorMetrics
from gpuop.rest import Rest, by_kind
from statemachine import (
    Action,
    BudgetNode,
    Decision,
    DrainView,
    DriverPodView,
    NodeUpgradeView,
    PodDeletionView,
    UpgradePolicyView,
    UpgradeState,
    WaitForCompletionView,
    next_step,
    select_nodes,
)
from statemachine.eviction import RemovalPlan, RemovalRules, gpu_workload, plan_removal
from statemachine.upgrade_keys import DRIVER_REVISION_LABEL, SKIP_LABEL, STATE_LABEL
from statemachine.upgrade_views import DRIVER_READY_TIMEOUT_SECONDS

log = get_logger(__name__)

POD = by_kind("v1", "Pod")
NODE = by_kind("v1", "Node")
#: While a node is being emptied, pods elsewhere in the cluster are not watched
#: (that would cache every pod of the fleet); the node is looked at again after this.
EMPTYING_POLL_SECONDS = 2.0
#: An eviction refused (by a PodDisruptionBudget, say) is retried after this, as
#: kubectl drain does, until the step's timeout fails the node.
EVICTION_RETRY_SECONDS = 5.0
_EMPTYING = {
    UpgradeState.WAIT_FOR_JOBS_REQUIRED,
    UpgradeState.POD_DELETION_REQUIRED,
    UpgradeState.DRAIN_REQUIRED,
}


def policy_view(spec: ClusterPolicySpec) -> UpgradePolicyView:
    """The rulebook's view of ``driver.upgradePolicy``."""
    up = spec.driver.upgrade_policy
    return UpgradePolicyView(
        auto_upgrade=bool(spec.driver.enabled and up.auto_upgrade),
        max_parallel_upgrades=up.max_parallel_upgrades,
        max_unavailable=up.max_unavailable,
        wait_for_completion=WaitForCompletionView(
            pod_selector=up.wait_for_completion.pod_selector or "",
            timeout_seconds=up.wait_for_completion.timeout_seconds,
        ),
        pod_deletion=PodDeletionView(
            force=up.pod_deletion.force,
            timeout_seconds=up.pod_deletion.timeout_seconds,
            delete_empty_dir=up.pod_deletion.delete_empty_dir,
        ),
        drain=DrainView(
            enable=up.drain.enable,
            force=up.drain.force,
            pod_selector=up.drain.pod_selector or "",
            timeout_seconds=up.drain.timeout_seconds,
            delete_empty_dir=up.drain.delete_empty_dir,
        ),
        validation_enabled=spec.validator.enabled if spec.validator.enabled is not None else True,
    )


#: Label values the rulebook knows; anything else reads as ``UNKNOWN``. Built once:
#: the fleet pass looks at every GPU node's state on every pod and node event.
_STATE_VALUES = frozenset(s.value for s in UpgradeState)


def _state_of(node_labels: Mapping[str, str]) -> UpgradeState:
    raw = node_labels.get(STATE_LABEL, "")
    return UpgradeState(raw) if raw in _STATE_VALUES else UpgradeState.UNKNOWN


def newest_revision(ds: Obj | None, revisions: Iterable[Obj]) -> str | None:
    """The hash of the DaemonSet's newest ControllerRevision: the target of upgrades."""
    if ds is None:
        return None
    uid = ds["metadata"].get("uid")
    newest: tuple[int, str] | None = None
    for rev in revisions:
        owners = rev["metadata"].get("ownerReferences") or []
        if not any(o.get("uid") == uid for o in owners):
            continue
        number = int(rev.get("revision", 0))
        hash_ = (rev["metadata"].get("labels") or {}).get(DRIVER_REVISION_LABEL, "")
        if newest is None or number > newest[0]:
            newest = (number, hash_)
    return newest[1] if newest else None


def pod_ready(pod: Obj) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def _restarts(pod: Obj) -> int:
    return sum(
        int(c.get("restartCount", 0))
        for c in (pod.get("status") or {}).get("containerStatuses") or []
    )


def _waiting_reason(pod: Obj) -> str:
    for c in (pod.get("status") or {}).get("containerStatuses") or []:
        if c.get("waiting"):
            return str(c["waiting"])
    return ""


def _selector(selector: Mapping[str, str] | str) -> str:
    if isinstance(selector, str):
        return selector.strip()
    return ",".join(f"{k}={v}" for k, v in selector.items())


def gpu_pod_rules(policy: UpgradePolicyView) -> RemovalRules:
    deletion = policy.pod_deletion
    return RemovalRules(
        force=bool(deletion and deletion.force),
        delete_empty_dir=bool(deletion and deletion.delete_empty_dir),
        honour_drain_skip=False,
    )


def drain_rules(policy: UpgradePolicyView) -> RemovalRules:
    return RemovalRules(force=policy.drain.force, delete_empty_dir=policy.drain.delete_empty_dir)


def eviction_error(err: ApiException) -> str:
    """The API's words for a refused eviction, causes included (they name the budget)."""
    try:
        body = json.loads(err.body or "")
    except (TypeError, ValueError):
        body = None
    if not isinstance(body, dict):
        return f"{err.status} {err.reason}"
    causes = [
        str(c.get("message"))
        for c in (body.get("details") or {}).get("causes") or []
        if c.get("message")
    ]
    message = str(body.get("message") or f"{err.status} {err.reason}").rstrip(".")
    return ": ".join([message, *causes])


class Upgrades:
    """Carries out upgrade decisions for the operator (which owns the caches)."""

    def __init__(
        self,
        rest: Rest,
        metrics: OperatorMetrics,
        namespace: str,
        pods: Any,
        revisions: Any,
        daemonsets: Any,
        nodes: Any,
    ) -> None:
        self.rest = rest
        self.metrics = metrics
        self.namespace = namespace
        self._pods = pods
        self._revisions = revisions
        self._daemonsets = daemonsets
        self._nodes = nodes
        self.events = EventRecorder(rest)
        #: Nodes the fleet budget allowed to start, not yet started. Memory only,
        #: and safe so: a lost grant just means the next ``upgrades`` pass grants again.
        self.granted: set[str] = set()
        self._blocked: dict[str, str] = {}
        #: Evictions refused per node: pod key -> (when, the API's words). Memory only:
        #: it words failure reasons and paces retries; a restart simply asks again.
        self._refused: dict[str, dict[str, tuple[float, str]]] = {}
        #: Bound of pod-restart-required (see ``UpgradePolicyView``); settable for tests.
        self.driver_ready_timeout_seconds = DRIVER_READY_TIMEOUT_SECONDS
        #: Hooks for NVIDIADrivers: which driver DaemonSet (its `app`) runs on a node,
        #: and the cache holding its pods, indexed by (node, app).
        self.driver_app: Callable[[str], str] = lambda node: DRIVER_DS
        self.driver_pods: Any = pods

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

    def _pods_on(self, node: str, app: str) -> list[Obj]:
        pods: list[Obj] = self._pods.indexed((node, app))
        return pods

    def _driver_pods_on(self, node: str) -> list[Obj]:
        pods: list[Obj] = self.driver_pods.indexed((node, self.driver_app(node)))
        return pods

    def _live_driver_pods(self, node: str) -> list[Obj]:
        return [p for p in self._driver_pods_on(node) if not p["metadata"].get("deletionTimestamp")]

    def driver_pod(self, node: str) -> DriverPodView | None:
        pods = self._live_driver_pods(node)
        if not pods:
            return None
        pod = max(pods, key=lambda p: p["metadata"].get("creationTimestamp", ""))
        return DriverPodView(
            uid=pod["metadata"]["uid"],
            revision_hash=(pod["metadata"].get("labels") or {}).get(DRIVER_REVISION_LABEL, ""),
            running=(pod.get("status") or {}).get("phase") == "Running",
            ready=pod_ready(pod),
            restart_count=_restarts(pod),
            waiting_reason=_waiting_reason(pod),
            config_digest=digest_in(pod.get("spec") or {}),
        )

    def has_driver_pod(self, node: str) -> bool:
        """``driver_pod(node) is not None`` without building the view (the fleet pass
        asks this for every GPU node)."""
        return bool(self._live_driver_pods(node))

    def _gpu_workloads(self, pods: Iterable[Obj]) -> list[Obj]:
        """Pods the pod-deletion step targets: GPU pods still running, never our operands
        (DaemonSet pods elsewhere are ignored by the rules themselves)."""
        return [
            p for p in pods if gpu_workload(p) and p["metadata"].get("namespace") != self.namespace
        ]

    def validators_ready(self, node: str) -> bool:
        pods = self._pods_on(node, VALIDATOR_DS)
        return bool(pods) and all(pod_ready(p) for p in pods)

    async def _node_pods(self, node: str, label_selector: str = "") -> list[Obj]:
        selectors = {"field_selector": f"spec.nodeName={node}"}
        if label_selector:
            selectors["label_selector"] = label_selector
        return await self.rest.list(POD, None, **selectors)

    async def gpu_plan(self, node: str, policy: UpgradePolicyView) -> RemovalPlan:
        pods = self._gpu_workloads(await self._node_pods(node))
        return plan_removal(pods, gpu_pod_rules(policy))

    async def drain_plan(self, node: str, policy: UpgradePolicyView) -> RemovalPlan:
        pods = await self._node_pods(node, _selector(policy.drain.pod_selector))
        return plan_removal(pods, drain_rules(policy))

    async def drain(self, node: str, policy: UpgradePolicyView) -> RemovalPlan:
        """One pass of the drain rules over `node`: evict what they allow (nothing when
        they refuse a pod). Health remediation drains through this too."""
        plan = await self.drain_plan(node, policy)
        await self._evict(node, plan)
        return plan

    def _left(self, node: str, keys: tuple[str, ...]) -> tuple[str, ...]:
        """The pods a step still waits for, each with why its eviction was refused."""
        refused = self._refused.get(node, {})
        return tuple(f"{k} ({refused[k][1]})" if k in refused else k for k in keys)

    async def view(
        self, node: Obj, policy: UpgradePolicyView, newest: str | None
    ) -> NodeUpgradeView:
        name = node["metadata"]["name"]
        node_labels = labels(node)
        wait = 0
        gpu = drain = RemovalPlan()
        state = _state_of(node_labels)
        # The rulebook may pass several states in one go, so count the node's pods
        # whenever emptying could be next: also right before and after cordoning.
        granted = name in self.granted and state is UpgradeState.UPGRADE_REQUIRED
        if state in _EMPTYING or state is UpgradeState.CORDON_REQUIRED or granted:
            if policy.pod_deletion is not None:
                gpu = await self.gpu_plan(name, policy)
            if policy.drain.enable:
                drain = await self.drain_plan(name, policy)
            selector = _selector(policy.wait_for_completion.pod_selector)
            if selector:
                # Upstream waits while any selected pod is Running or Pending.
                wait = sum(
                    1
                    for p in await self._node_pods(name, selector)
                    if (p.get("status") or {}).get("phase") in ("Running", "Pending")
                )
        left: tuple[str, ...] = ()
        if state is UpgradeState.POD_DELETION_REQUIRED:
            left = self._left(name, gpu.remaining)
        elif state is UpgradeState.DRAIN_REQUIRED:
            left = self._left(name, drain.remaining)
        return NodeUpgradeView(
            name=name,
            now=time.time(),
            labels=node_labels,
            annotations=node["metadata"].get("annotations") or {},
            unschedulable=bool(node["spec"].get("unschedulable")),
            node_ready=is_ready(node),
            driver_pod=self.driver_pod(name),
            newest_revision=newest,
            wait_pods_running=wait,
            gpu_pods=len(gpu.remaining),
            gpu_pods_refused=gpu.refusals,
            drain_pods=len(drain.remaining),
            drain_refused=drain.refusals,
            pods_left=left,
            validators_ready=self.validators_ready(name),
            newest_config_digest=self.template_digest(self.driver_app(name)),
        )

    # --------------------------------------------------------- fleet budget
    def select(
        self,
        nodes: list[Obj],
        policy: UpgradePolicyView,
        newest: str | None,
        held: Mapping[str, str] | None = None,
    ) -> list[str]:
        """Grant start slots; returns the nodes newly granted. Updates the metrics.
        ``held``: nodes the rollout gate keeps back; a grant they still hold is dropped."""
        fleet: list[BudgetNode] = []
        counts = {"in_progress": 0, "done": 0, "failed": 0, "pending": 0}
        for node in nodes:
            name = node["metadata"]["name"]
            node_labels = labels(node)
            if not is_gpu_node(node_labels):
                continue
            state = _state_of(node_labels)
            if held and name in held:
                self.granted.discard(name)
            if name in self.granted and state is UpgradeState.UPGRADE_REQUIRED:
                state = UpgradeState.CORDON_REQUIRED  # holds its slot until it moves
            elif name in self.granted:
                self.granted.discard(name)
            fleet.append(
                BudgetNode(
                    name=name,
                    state=state,
                    ready=is_ready(node),
                    unschedulable=bool(node["spec"].get("unschedulable")),
                    skip=node_labels.get(SKIP_LABEL) == "true",
                    driver_pod_present=self.has_driver_pod(name),
                )
            )
            if fleet[-1].in_progress:
                counts["in_progress"] += 1
            elif state is UpgradeState.UPGRADE_DONE:
                counts["done"] += 1
            elif state is UpgradeState.UPGRADE_FAILED:
                counts["failed"] += 1
            elif state is UpgradeState.UPGRADE_REQUIRED:
                counts["pending"] += 1
        selection = select_nodes(
            fleet,
            max_parallel_upgrades=policy.max_parallel_upgrades,
            max_unavailable=policy.max_unavailable,
            held=held,
        )
        self.metrics.upgrades_in_progress.set(counts["in_progress"])
        self.metrics.upgrades_done.set(counts["done"])
        self.metrics.upgrades_failed.set(counts["failed"])
        self.metrics.upgrades_pending.set(counts["pending"])
        self.metrics.upgrades_available.set(len(selection.start))
        for name, why in selection.blocked.items():
            if self._blocked.get(name) != why:
                log.warning("upgrade blocked, others proceed", node=name, reason=why)
        self._blocked = dict(selection.blocked)
        new = [n for n in selection.start if n not in self.granted]
        self.granted.update(selection.start)
        return new

    # ------------------------------------------------------------ decisions
    async def step(self, node: Obj, policy: UpgradePolicyView, newest: str | None) -> Decision:
        if policy.auto_upgrade:
            policy = replace(policy, driver_ready_timeout_seconds=self.driver_ready_timeout_seconds)
        view = await self.view(node, policy, newest)
        name = view.name
        decision = next_step(view, policy, may_start=name in self.granted)
        await self._persist(node, decision)
        # Only now, with the new state in the cache, may the slot be released: a
        # fleet pass running while the patch is in flight still sees the old
        # state, and without the grant it would count this node as waiting and
        # hand its slot to another (three in progress under a limit of two).
        if decision.target is not UpgradeState.UPGRADE_REQUIRED:
            self.granted.discard(name)
        if decision.target not in _EMPTYING or decision.target is not decision.current:
            self._refused.pop(name, None)  # a new step: its own refusals only
        await self._act(view, decision, policy)
        if decision.notice:
            log.warning("driver upgrade setback", node=name, reason=decision.notice)
            await self.events.record(
                _node_ref(node), "DriverUpgradePodDeletionFailed", decision.notice, warning=True
            )
        if decision.entered_failed:
            log.warning("driver upgrade failed", node=name, reason=decision.failure)
            await self.events.record(
                _node_ref(node), "DriverUpgradeFailed", decision.failure, warning=True
            )
        elif (
            decision.changed_state
            and decision.target is UpgradeState.UPGRADE_DONE
            and (decision.current is not UpgradeState.UNKNOWN)
        ):
            await self.events.record(
                _node_ref(node), "DriverUpgradeDone", f"driver upgraded on {name}"
            )
        elif decision.action is Action.CORDON:
            await self.events.record(
                _node_ref(node), "DriverUpgradeStarted", f"driver upgrade started on {name}"
            )
        if decision.changed_state:
            log.info(
                "driver upgrade",
                node=name,
                from_state=decision.current.value,
                to_state=decision.target.value,
                reason=decision.reason,
            )
        return decision

    async def _persist(self, node: Obj, decision: Decision) -> None:
        patch: dict[str, Any] = dict(decision.merge_patch())
        cordon = _wanted_unschedulable(decision)
        if cordon is not None and bool(node["spec"].get("unschedulable")) != cordon:
            patch["spec"] = {"unschedulable": cordon if cordon else None}
        if patch:
            patched = await self.rest.merge_patch(NODE, node["metadata"]["name"], patch)
            self._nodes.observe(patched)

    async def _act(
        self, view: NodeUpgradeView, decision: Decision, policy: UpgradePolicyView
    ) -> None:
        action = decision.action
        if action is Action.DELETE_GPU_PODS:
            await self._evict(view.name, await self.gpu_plan(view.name, policy))
        elif action is Action.DRAIN:
            await self.drain(view.name, policy)
        elif action is Action.RESTART_DRIVER_POD:
            # Our own DaemonSet's pod: deleted, as upstream does; it comes straight back.
            for pod in self._driver_pods_on(view.name):
                meta = pod["metadata"]
                await self.rest.delete(POD, meta["name"], meta["namespace"])

    async def _evict(self, node: str, plan: RemovalPlan) -> None:
        """Evict what the rules allow, never DELETE: PodDisruptionBudgets always apply.

        A refusal is remembered (for the failure reason) and retried no sooner than
        kubectl would; it never stops the other pods or other nodes.
        """
        if plan.refused:
            return  # the rulebook fails the step; kubectl evicts nothing then either
        refused = self._refused.setdefault(node, {})
        now = time.monotonic()
        for key in plan.evict:
            last = refused.get(key)
            if last is not None and now - last[0] < EVICTION_RETRY_SECONDS:
                continue
            namespace, name = key.split("/", 1)
            try:
                await self.rest.evict(name, namespace)
            except ApiException as err:
                if err.status == 404:
                    refused.pop(key, None)
                    continue
                why = eviction_error(err)
                if last is None or last[1] != why:
                    log.info("eviction refused, retrying", node=node, pod=key, reason=why)
                refused[key] = (now, why)
            else:
                refused.pop(key, None)


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
