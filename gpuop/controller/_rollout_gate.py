"""The rollout gate's imperative side: read and persist its record, report it.

``statemachine.rollout_gate`` decides which nodes the canary or a halt holds back; this
module feeds it the fleet, keeps its record in an annotation on the ClusterPolicy,
consumes the resume annotation, and shows the phase as the ``DriverUpgradeGate``
condition, an Event per change and ``gpu_operator_driver_upgrade_*`` metrics. Nothing
is kept in memory, so a restarted operator finds the same canary and the same halt.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from components.labels import is_gpu_node
from crd import ClusterPolicySpec
from gpuop.controller._nodes import is_ready, labels
from gpuop.controller._status import condition_change, write_policy_conditions
from gpuop.events import EventRecorder
from gpuop.informer import Obj
from gpuop.kinds import by_kind
from gpuop.log import get_logger
from gpuop.metrics import OperatorMetrics
from gpuop.rest import Rest
from statemachine.rollout_gate import (
    RECORD_ANNOTATION,
    RESUME_ANNOTATION,
    GateDecision,
    GateNode,
    GatePhase,
    GatePolicy,
    GateRecord,
    plan_gate,
    resume_requested,
)
from statemachine.upgrade_keys import (
    FAILED_REVISION_ANNOTATION,
    STATE_LABEL,
    parse_state,
    skipped,
)

log = get_logger(__name__)

POLICY = by_kind("nvidia.com/v1", "ClusterPolicy")
CONDITION_TYPE = "DriverUpgradeGate"
_REASONS = {
    GatePhase.IDLE: "Idle",
    GatePhase.CANARY: "Canary",
    GatePhase.SOAKING: "CanarySoaking",
    GatePhase.PROCEEDING: "Proceeding",
    GatePhase.HALTED: "Halted",
}
_EVENTS = {
    GatePhase.CANARY: ("DriverUpgradeCanaryStarted", False),
    GatePhase.SOAKING: ("DriverUpgradeCanaryValidated", False),
    GatePhase.PROCEEDING: ("DriverUpgradeProceeding", False),
    GatePhase.HALTED: ("DriverUpgradeHalted", True),
}


def gate_policy(spec: ClusterPolicySpec) -> GatePolicy:
    up = spec.driver.upgrade_policy
    canary = up.canary
    return GatePolicy(
        canary_nodes=canary.nodes if canary is not None else 0,
        soak_seconds=canary.soak_seconds if canary is not None else 0,
        halt_after_failures=up.halt_after_failures or 0,
    )


def gate_facts(policy: Obj | None) -> Any:
    """What the gate reads of a policy besides its spec: a change wakes the fleet pass."""
    if policy is None:
        return None
    annotations = policy["metadata"].get("annotations") or {}
    return annotations.get(RESUME_ANNOTATION), annotations.get(RECORD_ANNOTATION)


def gate_nodes(
    nodes: list[Obj],
    revision_of: Callable[[str], str | None],
    target_of: Callable[[str], str | None] | None = None,
) -> list[GateNode]:
    result = []
    for node in nodes:
        node_labels = labels(node)
        if not is_gpu_node(node_labels):
            continue
        name = node["metadata"]["name"]
        annotations = node["metadata"].get("annotations") or {}
        result.append(
            GateNode(
                name=name,
                state=parse_state(node_labels.get(STATE_LABEL)),
                revision=revision_of(name),
                target=target_of(name) if target_of is not None else None,
                failed_revision=annotations.get(FAILED_REVISION_ANNOTATION),
                unschedulable=bool(node["spec"].get("unschedulable")),
                ready=is_ready(node),
                skip=skipped(node_labels),
            )
        )
    return result


def _condition_of(raw: Obj) -> dict[str, Any] | None:
    for cond in (raw.get("status") or {}).get("conditions") or []:
        if cond.get("type") == CONDITION_TYPE:
            return dict(cond)
    return None


def _policy_ref(raw: Obj) -> Obj:
    return {"apiVersion": POLICY.api_version, "kind": POLICY.kind, "metadata": raw["metadata"]}


class RolloutGate:
    """Runs inside the serial ``upgrades`` pass (so its record has one writer)."""

    def __init__(
        self,
        rest: Rest,
        metrics: OperatorMetrics,
        events: EventRecorder,
        policies: Any,
    ) -> None:
        self.rest = rest
        self.metrics = metrics
        self.events = events
        self._policies = policies

    async def reconcile(
        self,
        raw: Obj,
        spec: ClusterPolicySpec,
        nodes: list[Obj],
        target: str | None,
        revision_of: Callable[[str], str | None],
        digest: str = "",
        target_of: Callable[[str], str | None] | None = None,
    ) -> GateDecision:
        """One fleet pass of the gate; ``digest`` (the driver template's config digest)
        keys its record, so only a new driver, not a new revision, starts over.
        ``target_of``: a node's own DaemonSet's newest revision, where the driver has
        several DaemonSets (precompiled: one per kernel)."""
        policy = gate_policy(spec)
        annotations = raw["metadata"].get("annotations") or {}
        previous = GateRecord.loads(annotations.get(RECORD_ANNOTATION))
        resume = resume_requested(annotations)
        decision = plan_gate(
            policy,
            # Only a gate that is on reads the fleet: skipping it keeps a rollout's
            # fleet passes from scanning every node for nothing.
            gate_nodes(nodes, revision_of, target_of) if policy.enabled and target else [],
            target,
            previous,
            now=time.time(),
            resume=resume,
            digest=digest,
        )
        self._metrics(decision)
        if decision.phase is GatePhase.OFF:
            if resume:
                raw = await self._patch_annotations(raw, {RESUME_ANNOTATION: None})
            await self._write_condition(raw, None)
            return decision
        if decision.record is not None or resume:
            wanted: dict[str, str | None] = {}
            if decision.record is not None:
                wanted[RECORD_ANNOTATION] = decision.record.dumps()
            if resume:
                wanted[RESUME_ANNOTATION] = None
            raw = await self._patch_annotations(raw, wanted)
        if decision.resumed:
            log.info("driver rollout resumed by annotation", policy=raw["metadata"]["name"])
            await self.events.record(
                _policy_ref(raw), "DriverUpgradeResumed", "driver rollout resumed by annotation"
            )
        await self._report(raw, decision)
        return decision  # its requeue_after: when the fleet pass looks again

    def _metrics(self, decision: GateDecision) -> None:
        record = decision.record
        failures = len(record.counted_failures) if record is not None else None
        self.metrics.upgrade_halted.set(1 if decision.phase is GatePhase.HALTED else 0)
        self.metrics.upgrade_canary.set(
            1 if decision.phase in (GatePhase.CANARY, GatePhase.SOAKING) else 0
        )
        self.metrics.upgrade_held.set(len(decision.held))
        if failures is not None:
            self.metrics.upgrade_rollout_failures.set(failures)

    async def _report(self, raw: Obj, decision: GateDecision) -> None:
        """The condition, and an Event when the phase changes (the condition's reason is
        the phase persisted, so a restart does not repeat the Event)."""
        reason = _REASONS[decision.phase]
        old = _condition_of(raw)
        status = "True" if decision.holding else "False"
        message = decision.message or "no driver rollout in progress"
        if old is None or old.get("reason") != reason:
            event = _EVENTS.get(decision.phase)
            if event is not None:
                log.info("driver rollout gate", phase=decision.phase.value, why=message)
                await self.events.record(_policy_ref(raw), event[0], message, warning=event[1])
        await self._write_condition(raw, (status, reason, message))

    async def _patch_annotations(self, raw: Obj, wanted: dict[str, str | None]) -> Obj:
        """Our own keys only (a merge patch leaves the others): the record has a single
        writer, the serial fleet pass, so no resourceVersion guard is needed."""
        patched: Obj = await self.rest.merge_patch(
            POLICY, raw["metadata"]["name"], {"metadata": {"annotations": wanted}}
        )
        self._policies.observe(patched)
        return patched

    async def _write_condition(self, raw: Obj, condition: tuple[str, str, str] | None) -> None:
        """Set (or with None remove) the gate's condition, guarded by resourceVersion."""
        if condition is not None:
            condition = (condition[0], condition[1], condition[2][:32768])
        change = condition_change(raw, CONDITION_TYPE, condition, datetime.now(UTC))
        if change is None:
            log.warning("policy status unreadable; %s not written", CONDITION_TYPE)
            return
        if change.wanted == change.stored:
            return
        await write_policy_conditions(
            self.rest, self._policies, raw, change.wanted, owned=CONDITION_TYPE
        )
