"""GPU health remediation: the imperative side of :mod:`statemachine.remediation`.

One serial ``remediation`` key looks at the whole fleet (the circuit breaker is a
fleet-wide count), woken only by watch events that change what the planner reads
(a node's GPUHealthy condition, our taint and annotations, schedulability, upgrade
state; the policy's spec, resume annotation and RemediationPaused condition) and by
one delayed requeue when a settle time ends: a pass returns when it wants to run again,
as controller-runtime's reconcilers do, and the operator queues it (this unit never
touches the queue). A pass whose plan is empty writes nothing.

Everything the planner needs is in the cluster: quarantine is our annotations and taint
on the Node, the pause is the ClusterPolicy condition, a settle time starts when this
operator first saw the node healthy (recorded on the node, `HEALTHY_SEEN_ANNOTATION`:
the node's own clock, in the condition's lastTransitionTime, may be a year off), and a
drain is owed until the node records it done
(retried every few seconds while evictions are refused, less often while the drain
rules refuse a pod). Node writes carry the cached resourceVersion, so a
concurrent change (another controller's taint) fails with a conflict and the pass is
retried on fresh data instead of overwriting it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from components.labels import is_gpu_node
from crd import ClusterPolicySpec
from crd import format_time as format_condition_time
from gpuop.kube.informer import Obj
from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Rest
from gpuop.log import get_logger
from gpuop.operator.controller.views.active_policy import ActivePolicy
from gpuop.operator.controller.views.node_views import labels
from gpuop.operator.controller.views.remediation_views import (
    node_facts,
    node_view,
    paused_condition,
    policy_view,
    transition,
)
from gpuop.operator.controller.views.upgrade_inputs import policy_view as upgrade_policy_view
from gpuop.operator.controller.writers.eviction import EVICTION_RETRY_SECONDS
from gpuop.operator.controller.writers.remediation_dry_run import DryRunReports, node_ref
from gpuop.operator.controller.writers.remediation_pause import PauseCondition
from gpuop.operator.controller.writers.upgrade import Upgrades
from gpuop.operator.events import EventRecorder
from gpuop.operator.metrics import OperatorMetrics
from statemachine import cordon
from statemachine.remediation import (
    ACTION_ANNOTATION,
    DRAINED_ANNOTATION,
    HEALTHY_SEEN_ANNOTATION,
    MANAGED_ANNOTATIONS,
    QUARANTINED_ANNOTATION,
    QUARANTINED_AT_ANNOTATION,
    TAINT_EFFECT,
    TAINT_KEY,
    TAINT_VALUE,
    DrainOutcome,
    FleetHealthView,
    HealthNodeView,
    Quarantine,
    Release,
    RemediationPlan,
    RemediationPolicyView,
    plan_remediation,
    quarantined_taints,
    released_taints,
    resume_requested,
    seen_record,
)

log = get_logger(__name__)

NODE = by_kind("v1", "Node")
POLICY = by_kind("nvidia.com/v1", "ClusterPolicy")
#: Condition times have whole seconds; waking this much after a settle deadline makes
#: sure the pass then sees it as reached.
_SETTLE_SLACK_SECONDS = 1.0
#: A drain the rules refuse is looked at again this often (its pods may go meanwhile,
#: or the policy may allow them); one refused by the API, every EVICTION_RETRY_SECONDS.
DRAIN_RECHECK_SECONDS = 60.0

Drain = Callable[[str, ClusterPolicySpec], Awaitable[DrainOutcome]]


class Remediation:
    """Carries out remediation plans for the operator (which owns caches and queue; the
    caches are handed in, and `reconcile` says when it wants to run again)."""

    def __init__(
        self,
        rest: Rest,
        metrics: OperatorMetrics,
        events: EventRecorder,
        nodes: Any,
        policies: Any,
        active_policy: ActivePolicy,
        drain: Drain,
    ) -> None:
        self.rest = rest
        self.metrics = metrics
        self.events = events
        self._nodes = nodes
        self._policies = policies
        self._active_policy = active_policy
        self._drain = drain
        #: Dry run: each would-be action is told once.
        self._dry_run = DryRunReports(metrics, events, nodes)
        self._pause = PauseCondition(rest, events, policies)
        #: Per node, the drain setback last told (an Event per change, not per retry;
        #: memory only: a restarted operator tells it once more).
        self._drain_told: dict[str, tuple[str, tuple[str, ...]]] = {}
        #: Whether the last pass had remediation on. Off (the default), node events
        #: wake nothing unless a node still carries our quarantine: a fleet pass per
        #: node event would cost thousands of passes during a large upgrade.
        self._enabled = True
        #: Dry run writes nothing, so the first healthy sightings (settle starts) it
        #: would record live here, by node: (the condition's transition, when seen).
        #: Memory only: a restarted operator's dry run waits the settle time again.
        self._seen_dry: dict[str, tuple[float | None, float]] = {}

    def wants_node(self, old: Obj | None, new: Obj | None) -> bool:
        """Whether a node event changes anything the next pass would read."""
        if not self._enabled and not any(
            QUARANTINED_ANNOTATION in (n["metadata"].get("annotations") or {})
            for n in (old, new)
            if n is not None
        ):
            return False
        return bool(node_facts(old) != node_facts(new))

    async def reconcile(self) -> float | None:
        """One pass over the fleet; the seconds until it wants to run again (a settle
        time ending, a refused drain's retry), None: only when news wakes it."""
        raw, model, problems = self._active_policy()
        if raw is not None and (model is None or problems):
            return None  # an invalid policy changes nothing; its status says why
        spec = model.spec if model is not None else None
        policy = policy_view(spec)
        self._enabled = policy.enabled
        if raw is None:
            self._pause.written = False
        paused_cond = paused_condition(raw) if raw is not None else None
        now = datetime.now(UTC)
        fleet = self._fleet(raw, policy, paused_cond, now)
        plan = plan_remediation(fleet, policy)
        self.metrics.health_unhealthy.set(plan.unhealthy)
        if plan.dry_run:
            since = {v.name: v.since for v in fleet.nodes}
            for name in plan.observe:
                self._seen_dry[name] = (since[name], now.timestamp())
            await self._dry_run.report(plan, policy, raw)
            self.metrics.health_quarantined.set(sum(1 for v in fleet.nodes if v.quarantined))
            return None
        self.metrics.health_would_quarantine.set(0)
        self._dry_run.clear()
        delays = await self._carry_out(plan, policy, spec, now)
        if raw is not None and policy.enabled:
            await self._pause.state(raw, plan, policy, now)
        elif raw is not None and paused_cond is not None:
            await self._pause.write(raw, None, now)
        self.metrics.health_quarantined.set(plan.quarantined if policy.enabled else 0)
        self.metrics.health_paused.set(1 if plan.paused and policy.enabled else 0)
        if plan.requeue_after is not None:
            delays.append(settle_delay(plan.requeue_after))
        return min(delays) if delays else None

    def _fleet(
        self,
        raw: Obj | None,
        policy: RemediationPolicyView,
        paused_cond: Obj | None,
        now: datetime,
    ) -> FleetHealthView:
        """What the planner reads: every GPU (or still quarantined) node's health, the
        pause and the resume annotation."""
        views = tuple(
            node_view(n)
            for n in self._nodes.values()
            if is_gpu_node(labels(n))
            or QUARANTINED_ANNOTATION in (n["metadata"].get("annotations") or {})
        )
        paused = (paused_cond or {}).get("status") == "True" or (
            self._pause.written and paused_cond is None
        )
        resume = raw is not None and resume_requested(raw["metadata"].get("annotations") or {})
        if policy.dry_run:
            views = tuple(self._seen_in_dry_run(v) for v in views)
        else:
            self._seen_dry.clear()
        return FleetHealthView(views, now.timestamp(), paused=paused, resume_requested=resume)

    async def _carry_out(
        self,
        plan: RemediationPlan,
        policy: RemediationPolicyView,
        spec: ClusterPolicySpec | None,
        now: datetime,
    ) -> list[float]:
        """Record sightings, release, quarantine and drain as planned; the seconds until
        each refused drain is tried again."""
        by_name = {n["metadata"]["name"]: n for n in self._nodes.values()}
        for name in plan.observe:
            await self._record_seen(by_name[name], now)
        for release in plan.release:
            self._drain_told.pop(release.node, None)
            await self._release(by_name[release.node], release)
        delays: list[float] = []
        for quarantine in plan.quarantine:
            await self._quarantine(by_name[quarantine.node], quarantine, policy, spec)
        draining = [q.node for q in plan.quarantine if q.drain] + list(plan.drain)
        if spec is not None:
            for name in draining:
                delay = await self._drain_node(name, spec)
                if delay is not None:
                    delays.append(delay)
        return delays

    def _seen_in_dry_run(self, view: HealthNodeView) -> HealthNodeView:
        """``view`` with the settle start a dry run remembers, for the same transition."""
        remembered = self._seen_dry.get(view.name)
        if view.healthy_seen is not None or remembered is None or remembered[0] != view.since:
            return view
        return dataclasses.replace(view, healthy_seen=remembered[1])

    # ------------------------------------------------------------------ nodes
    async def _record_seen(self, node: Obj, now: datetime) -> None:
        """Record on the node when this operator first saw its GPUs healthy again: the
        settle time counts from here, by our clock, and a restarted operator reads it."""
        record = seen_record(format_condition_time(now), transition(node))
        await self._patch_node(
            node, {"metadata": {"annotations": {HEALTHY_SEEN_ANNOTATION: record}}}
        )
        log.info("gpu node seen healthy; settle time starts", node=node["metadata"]["name"])

    async def _patch_node(self, node: Obj, patch: dict[str, Any]) -> None:
        meta = node["metadata"]
        patch.setdefault("metadata", {})["resourceVersion"] = meta.get("resourceVersion")
        patched = await self.rest.merge_patch(NODE, meta["name"], patch)
        self._nodes.observe(patched)

    async def _quarantine(
        self,
        node: Obj,
        step: Quarantine,
        policy: RemediationPolicyView,
        spec: ClusterPolicySpec | None,
    ) -> None:
        annotations: dict[str, str | None] = {
            QUARANTINED_ANNOTATION: step.why[:1024],
            QUARANTINED_AT_ANNOTATION: format_condition_time(datetime.now(UTC)),
            ACTION_ANNOTATION: policy.action.value,
        }
        patch: dict[str, Any] = {
            "spec": {"taints": quarantined_taints(node["spec"].get("taints") or [])}
        }
        if step.cordon:
            # Whose cordon it is travels in the patch that cordons.
            annotations.update(cordon.record(cordon.CordonOwner.HEALTH_REMEDIATION, step.why))
            patch["spec"]["unschedulable"] = True
        patch["metadata"] = {"annotations": annotations}
        await self._patch_node(node, patch)
        self.metrics.health_quarantines.labels(policy.action.value).inc()
        # Only what this patch did: the drain tells its own outcome (drained, blocked
        # by a budget, refused by the drain rules) in its own Event.
        did = (
            "tainted"
            + (" and cordoned" if step.cordon else "")
            + ("; draining by driver.upgradePolicy.drain's rules" if step.drain else "")
        )
        log.warning(
            "gpu node quarantined", node=step.node, action=policy.action.value, why=step.why
        )
        await self.events.record(
            node_ref(node),
            "GPUUnhealthyQuarantined",
            f"{did} ({TAINT_KEY}={TAINT_VALUE}:{TAINT_EFFECT}): {step.why}",
            warning=True,
        )

    async def _drain_node(self, name: str, spec: ClusterPolicySpec) -> float | None:
        """One drain pass over a quarantined node; when to look again (None: drained,
        recorded on the node so no later pass or process drains it again)."""
        outcome = await self._drain(name, spec)
        node = self._nodes.get(name)
        if node is None:
            return None
        if outcome.drained:
            stamp = format_condition_time(datetime.now(UTC))
            await self._patch_node(node, {"metadata": {"annotations": {DRAINED_ANNOTATION: stamp}}})
            self._drain_told.pop(name, None)
            log.info("gpu node drained", node=name)
            await self.events.record(node_ref(node), "GPUUnhealthyDrained", outcome.message())
            return None
        if outcome.refused:
            told = ("GPUUnhealthyDrainRefused", outcome.refused)
        else:
            told = ("GPUUnhealthyDrainBlocked", tuple(sorted(outcome.blocked)))
        if told[1] and self._drain_told.get(name) != told:
            log.warning("gpu node drain setback", node=name, reason=outcome.message())
            await self.events.record(node_ref(node), told[0], outcome.message(), warning=True)
        self._drain_told[name] = told
        return DRAIN_RECHECK_SECONDS if outcome.refused else EVICTION_RETRY_SECONDS

    async def _release(self, node: Obj, step: Release) -> None:
        annotations: dict[str, str | None] = dict.fromkeys(MANAGED_ANNOTATIONS)
        patch: dict[str, Any] = {"metadata": {"annotations": annotations}}
        taints = node["spec"].get("taints") or []
        if any(t.get("key") == TAINT_KEY for t in taints):
            patch["spec"] = {"taints": released_taints(taints) or None}
        meta = node["metadata"]
        if step.hand_over:
            # The upgrade still needs the node out of service: the cordon becomes its.
            upgrade = cordon.CordonOwner.DRIVER_UPGRADE
            node_labels = meta.get("labels") or {}
            reason = cordon.reason_of(upgrade, node_labels, meta.get("annotations") or {})
            annotations.update(cordon.record(upgrade, reason))
        elif step.uncordon:
            annotations.update(cordon.CLEARED)
            if node["spec"].get("unschedulable"):
                patch.setdefault("spec", {})["unschedulable"] = None
        await self._patch_node(node, patch)
        self.metrics.health_releases.inc()
        log.info("gpu node quarantine lifted", node=step.node, why=step.why)
        if step.hand_over:
            cordoned = "; the node stays cordoned for its driver upgrade"
        else:
            cordoned = " and uncordoned" if step.uncordon else ""
        await self.events.record(
            node_ref(node),
            "GPUHealthyQuarantineLifted",
            f"taint {TAINT_KEY} removed{cordoned}: {step.why}",
        )

    # ----------------------------------------------------------------- policy


def settle_delay(seconds: float) -> float:
    """Rounded up to whole seconds plus slack (condition times have whole seconds)."""
    return math.ceil(seconds) + _SETTLE_SLACK_SECONDS


def upgrade_drain(upgrades: Upgrades) -> Drain:
    """Drain a quarantined node by the rules of ``driver.upgradePolicy.drain``, with the
    upgrade code's own drain (one implementation of kubectl-drain semantics). Remediation
    has no drain flags of its own, on purpose: a quarantine never removes a pod the
    administrator's drain settings keep (see ``statemachine.remediation``)."""

    async def drain(node: str, spec: ClusterPolicySpec) -> DrainOutcome:
        plan = await upgrades.drain(node, upgrade_policy_view(spec))
        return DrainOutcome(
            refused=plan.refusals,
            blocked=upgrades.emptying.blocked(node, plan.evict),
            left=plan.remaining,
        )

    return drain
