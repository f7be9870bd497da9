"""The rollout gate's imperative side: read and persist its record, report it.

``statemachine.rollout_gate`` decides which nodes the canary or a halt holds back; this
module feeds it the fleet, keeps its record in an annotation on the ClusterPolicy (or,
for an NVIDIADriver's nodes, on that NVIDIADriver: one gate per driver owner),
consumes the resume annotation, and shows the phase as the ``DriverUpgradeGate``
condition, an Event per change and ``gpu_operator_driver_upgrade_*`` metrics (the
ClusterPolicy's rollout only). Nothing is kept in memory, so a restarted operator finds
the same canary and the same halt.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from components.labels import is_gpu_node
from crd import NVD_API_VERSION, NVD_KIND, ClusterPolicySpec, NVIDIADriverStatus
from gpuop.controller._nodes import is_ready, labels
from gpuop.controller._status import (
    StatusWrite,
    condition_change,
    parse_status,
    write_policy_conditions,
    write_status,
)
from gpuop.events import EventRecorder
from gpuop.informer import Informer, Obj
from gpuop.kinds import by_kind
from gpuop.log import get_logger
from gpuop.metrics import OperatorMetrics
from gpuop.rest import Kind, Rest
from statemachine.rollout_gate import (
    RECORD_ANNOTATION,
    RESUME_ANNOTATION,
    GateDecision,
    GateNode,
    GatePhase,
    GatePolicy,
    GateRecord,
    gate_resource,
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
NVD = by_kind(NVD_API_VERSION, NVD_KIND)
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


def _nvd_status(raw: Obj) -> NVIDIADriverStatus | None:
    data = raw.get("status")
    if not data:
        return None
    try:
        return NVIDIADriverStatus.model_validate(data)
    except ValueError:
        return None


class RolloutGate:
    """Runs inside the serial ``upgrades`` pass (so its record has one writer)."""

    def __init__(
        self,
        rest: Rest,
        metrics: OperatorMetrics,
        events: EventRecorder,
        policies: Any,
        drivers: Informer | None = None,
    ) -> None:
        self.rest = rest
        self.metrics = metrics
        self.events = events
        self._policies = policies
        self._drivers = drivers

    def _kind(self, owner: str | None) -> tuple[Kind, Any]:
        """What carries the gate of ``owner`` (None: the ClusterPolicy), and its cache."""
        if owner is None:
            return POLICY, self._policies
        return NVD, self._drivers

    async def reconcile(
        self,
        raw: Obj,
        spec: ClusterPolicySpec,
        nodes: list[Obj],
        target: str | None,
        revision_of: Callable[[str], str | None],
        digest: str = "",
        target_of: Callable[[str], str | None] | None = None,
        owner: str | None = None,
    ) -> GateDecision:
        """One fleet pass of the gate; ``digest`` (the driver template's config digest)
        keys its record, so only a new driver, not a new revision, starts over.
        ``target_of``: a node's own DaemonSet's newest revision, where the driver has
        several DaemonSets (precompiled: one per kernel). ``owner``: the NVIDIADriver
        whose nodes these are (``raw`` is that resource, ``spec`` the ClusterPolicy its
        driver section makes); None: the ClusterPolicy's own rollout."""
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
            resource=gate_resource(owner),
        )
        if owner is None:  # the gauges are the ClusterPolicy's rollout's
            self._metrics(decision)
        if decision.phase is GatePhase.OFF:
            if resume:
                raw = await self._patch_annotations(raw, {RESUME_ANNOTATION: None}, owner)
            await self._write_condition(raw, None, owner)
            return decision
        if decision.record is not None or resume:
            wanted: dict[str, str | None] = {}
            if decision.record is not None:
                wanted[RECORD_ANNOTATION] = decision.record.dumps()
            if resume:
                wanted[RESUME_ANNOTATION] = None
            raw = await self._patch_annotations(raw, wanted, owner)
        if decision.resumed:
            log.info(
                "driver rollout resumed by annotation",
                resource=gate_resource(owner),
                name=raw["metadata"]["name"],
            )
            await self.events.record(
                self._ref(raw, owner),
                "DriverUpgradeResumed",
                "driver rollout resumed by annotation",
            )
        await self._report(raw, decision, owner)
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

    def _ref(self, raw: Obj, owner: str | None) -> Obj:
        kind, _ = self._kind(owner)
        return {"apiVersion": kind.api_version, "kind": kind.kind, "metadata": raw["metadata"]}

    async def _report(self, raw: Obj, decision: GateDecision, owner: str | None = None) -> None:
        """The condition, and an Event when the phase changes (the condition's reason is
        the phase persisted, so a restart does not repeat the Event)."""
        reason = _REASONS[decision.phase]
        old = _condition_of(raw)
        status = "True" if decision.holding else "False"
        message = decision.message or "no driver rollout in progress"
        if old is None or old.get("reason") != reason:
            event = _EVENTS.get(decision.phase)
            if event is not None:
                log.info(
                    "driver rollout gate",
                    resource=gate_resource(owner),
                    phase=decision.phase.value,
                    why=message,
                )
                await self.events.record(self._ref(raw, owner), event[0], message, warning=event[1])
        await self._write_condition(raw, (status, reason, message), owner)

    async def _patch_annotations(
        self, raw: Obj, wanted: dict[str, str | None], owner: str | None = None
    ) -> Obj:
        """Our own keys only (a merge patch leaves the others): the record has a single
        writer, the serial fleet pass, so no resourceVersion guard is needed."""
        kind, cache = self._kind(owner)
        patched: Obj = await self.rest.merge_patch(
            kind, raw["metadata"]["name"], {"metadata": {"annotations": wanted}}
        )
        cache.observe(patched)
        return patched

    async def _write_condition(
        self, raw: Obj, condition: tuple[str, str, str] | None, owner: str | None = None
    ) -> None:
        """Set (or with None remove) the gate's condition, guarded by resourceVersion."""
        if condition is None and _condition_of(raw) is None:
            return  # nothing to remove (a gate that is off, every pass)
        if condition is not None:
            condition = (condition[0], condition[1], condition[2][:32768])
        parse = parse_status if owner is None else _nvd_status
        change = condition_change(raw, CONDITION_TYPE, condition, datetime.now(UTC), parse=parse)
        if change is None:
            log.warning(
                "%s status unreadable; %s not written", gate_resource(owner), CONDITION_TYPE
            )
            return
        if change.wanted == change.stored:
            return
        if owner is None:
            await write_policy_conditions(
                self.rest, self._policies, raw, change.wanted, owned=CONDITION_TYPE
            )
            return
        kind, cache = self._kind(owner)
        mine = [
            c.model_dump(by_alias=True, exclude_none=True, mode="json")
            for c in change.wanted
            if c.type == CONDITION_TYPE
        ]
        await write_status(
            self.rest, kind, cache, raw, StatusWrite(frozenset({CONDITION_TYPE}), mine)
        )
