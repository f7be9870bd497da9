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
from typing import Any

from components.labels import is_gpu_node
from crd import ClusterPolicySpec
from gpuop.kube.informer import Informer, Obj
from gpuop.kube.rest import Kind, Rest
from gpuop.log import get_logger
from gpuop.operator.controller.views.node_views import is_ready, labels
from gpuop.operator.controller.writers.owner_condition import (
    condition_of,
    owner_kind,
    owner_ref,
    write_owner_condition,
)
from gpuop.operator.events import EventRecorder
from gpuop.operator.metrics import OperatorMetrics
from statemachine.rollback import ROLLBACK_ANNOTATION, RollbackRecord
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
        #: Set by the operator: a rollback started or ended (the cluster pass writes it).
        self.on_rollback: Callable[[], None] = lambda: None

    def _kind(self, owner: str | None) -> tuple[Kind, Any]:
        """What carries the gate of ``owner`` (None: the ClusterPolicy), and its cache."""
        return owner_kind(owner), self._policies if owner is None else self._drivers

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
        restore: Callable[[], dict[str, str]] | None = None,
        settled: bool = True,
    ) -> GateDecision:
        """One fleet pass of the gate; ``digest`` (the driver template's config digest)
        keys its record, so only a new driver, not a new revision, starts over.
        ``target_of``: a node's own DaemonSet's newest revision, where the driver has
        several DaemonSets (precompiled: one per kernel). ``owner``: the NVIDIADriver
        whose nodes these are (``raw`` is that resource, ``spec`` the ClusterPolicy its
        driver section makes); None: the ClusterPolicy's own rollout. ``restore``: per
        driver DaemonSet, the revision a rollback after a halt returns it to.
        ``settled``: ``target`` is a revision of the template ``digest`` is read from;
        while not, the candidates are held and nothing is written or reported."""
        policy = gate_policy(spec)
        annotations = raw["metadata"].get("annotations") or {}
        resume = resume_requested(annotations)
        rollback = RollbackRecord.loads(annotations.get(ROLLBACK_ANNOTATION))
        decision = plan_gate(
            policy,
            # Only a gate that is on reads the fleet: skipping it keeps a rollout's
            # fleet passes from scanning every node for nothing.
            gate_nodes(nodes, revision_of, target_of) if policy.enabled and target else [],
            target,
            GateRecord.loads(annotations.get(RECORD_ANNOTATION)),
            now=time.time(),
            resume=resume,
            digest=digest,
            resource=gate_resource(owner),
            settled=settled,
        )
        if decision.settling:  # the late watch event wakes the fleet pass again
            return decision
        if owner is None:  # the gauges are the ClusterPolicy's rollout's
            self._metrics(decision)
        if decision.phase is GatePhase.OFF:
            if resume:
                raw = await self._patch_annotations(raw, {RESUME_ANNOTATION: None}, owner)
            await self._write_condition(raw, None, owner)
            return decision
        started = None
        if (
            restore is not None
            and rollback is None
            and decision.phase is GatePhase.HALTED
            and spec.driver.upgrade_policy.rollback_on_halt
        ):
            started = RollbackRecord(key=digest, revisions=restore())
        raw = await self._record(raw, decision, resume, rollback, started, owner)
        if not await self._rolled_back(raw, decision, started, owner):
            await self._report(raw, decision, owner)
        return decision  # its requeue_after: when the fleet pass looks again

    async def _record(
        self,
        raw: Obj,
        decision: GateDecision,
        resume: bool,
        rollback: RollbackRecord | None,
        started: RollbackRecord | None,
        owner: str | None,
    ) -> Obj:
        """Write the gate's record (and a rollback started, or ended by a resume) on its
        resource; say a resume and a rollback once. Returns the resource as written."""
        if decision.record is not None or resume or started is not None:
            wanted: dict[str, str | None] = {}
            if decision.record is not None:
                wanted[RECORD_ANNOTATION] = decision.record.dumps()
            if resume:
                wanted[RESUME_ANNOTATION] = None
                if rollback is not None:  # the administrator retries the new driver
                    wanted[ROLLBACK_ANNOTATION] = None
            if started is not None:  # with no revision too: said once, not every pass
                wanted[ROLLBACK_ANNOTATION] = started.dumps()
            raw = await self._patch_annotations(raw, wanted, owner)
            if ROLLBACK_ANNOTATION in wanted:
                self.on_rollback()  # the passes that write the driver's templates
        if started is not None:
            await self._report_rollback(raw, started, owner)
        if decision.resumed:
            log.info(
                "driver rollout resumed by annotation",
                resource=gate_resource(owner),
                name=raw["metadata"]["name"],
            )
            await self.events.record(
                owner_ref(raw, owner),
                "DriverUpgradeResumed",
                "driver rollout resumed by annotation",
            )
        return raw

    async def _rolled_back(
        self, raw: Obj, decision: GateDecision, started: RollbackRecord | None, owner: str | None
    ) -> bool:
        """While a rollback stands, the gate runs the way back (a rollout of its own) and
        the condition says why the policy's driver is not what runs: True then."""
        standing = RollbackRecord.loads(
            (raw["metadata"].get("annotations") or {}).get(ROLLBACK_ANNOTATION)
        )
        if standing is not None and not standing.revisions:
            standing = None  # nothing to go back to: the halt holds as it is
        if owner is None:
            self.metrics.upgrade_rolled_back.set(1 if standing is not None else 0)
        if standing is None:
            return False
        if started is not None:
            await self._report(raw, decision, owner)  # the halt's own Event, once
            _, cache = self._kind(owner)
            raw = cache.get(raw["metadata"]["name"]) or raw
        why = (
            f"rolled back after a halt: {standing.describe()}; change the driver, or set"
            f" {RESUME_ANNOTATION}=true to retry it"
        )
        if decision.message:
            why += f" ({decision.message})"
        await self._write_condition(raw, ("True", "RolledBack", why), owner)
        return True

    async def _report_rollback(self, raw: Obj, started: RollbackRecord, owner: str | None) -> None:
        if started.revisions:
            message = f"driver rollout halted: rolling back {started.describe()}"
            log.warning("driver rollback", reverted=started.describe())
            await self.events.record(
                owner_ref(raw, owner), "DriverUpgradeRolledBack", message, warning=True
            )
        else:
            message = "driver rollout halted: no earlier revision runs anywhere to return to"
            await self.events.record(
                owner_ref(raw, owner), "DriverUpgradeRollbackImpossible", message, warning=True
            )

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

    async def _report(self, raw: Obj, decision: GateDecision, owner: str | None = None) -> None:
        """The condition, and an Event when the phase changes (the condition's reason is
        the phase persisted, so a restart does not repeat the Event)."""
        reason = _REASONS[decision.phase]
        old = condition_of(raw, CONDITION_TYPE)
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
                await self.events.record(owner_ref(raw, owner), event[0], message, warning=event[1])
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
        _, cache = self._kind(owner)
        await write_owner_condition(self.rest, cache, raw, owner, CONDITION_TYPE, condition)
