"""The rollout gate: canary first, halt after failures (gpuop's `upgradePolicy` extension).

The gate sits in front of the upgrade budget: it says which `upgrade-required` nodes
may not start now and why. Everything it remembers is one JSON record the controller
keeps in an annotation on the ClusterPolicy, or on the NVIDIADriver whose nodes it
gates (`GateRecord`; one gate per driver owner, `plan_owner_gates`), so a restarted operator
resumes the same canary and stays halted. A rollout is one driver install configuration
(the driver container's `DRIVER_CONFIG_DIGEST`): a new driver (a fixed version, say)
starts a new rollout with a clean record, while a template change that installs the
same driver (a label, a toleration) gives the DaemonSet a new revision but keeps the
record, so it never lets a halted rollout proceed. Without a digest (an old template)
the revision keys the record, as before.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum

from statemachine.upgrade_keys import IN_PROGRESS_STATES, UpgradeState

#: The gate's record on the ClusterPolicy (JSON, see `GateRecord`).
RECORD_ANNOTATION = "gpuop.io/driver-rollout"
#: Set to "true" by an administrator to lift a halt; the operator removes it once used.
RESUME_ANNOTATION = "gpuop.io/driver-upgrade-resume"


def resume_requested(annotations: Mapping[str, str]) -> bool:
    """Only the value "true" resumes (as upstream's upgrade-requested annotation): an
    administrator's `...-resume=false` must not lift a halt."""
    return annotations.get(RESUME_ANNOTATION) == "true"


class GatePhase(StrEnum):
    """Where the rollout stands; `OFF` when neither extension is configured."""

    OFF = "off"
    IDLE = "idle"
    CANARY = "canary"
    SOAKING = "soaking"
    PROCEEDING = "proceeding"
    HALTED = "halted"


@dataclass(frozen=True)
class GatePolicy:
    """`canary` and `haltAfterFailures` of `driver.upgradePolicy` (0 = not set)."""

    canary_nodes: int = 0
    soak_seconds: int = 0
    halt_after_failures: int = 0

    @property
    def enabled(self) -> bool:
        return self.canary_nodes > 0 or self.halt_after_failures > 0


@dataclass(frozen=True)
class GateNode:
    """One GPU node as the gate sees it (the fleet pass builds these from its cache)."""

    name: str
    state: UpgradeState
    revision: str | None = None
    """The controller-revision-hash of its driver pod; None without one."""
    target: str | None = None
    """The newest revision of its own driver DaemonSet, where the driver has several
    (precompiled: one per kernel); None: the rollout's target."""
    failed_revision: str | None = None
    """The target revision it failed at (our node annotation), when failed."""
    unschedulable: bool = False
    ready: bool = True
    skip: bool = False


@dataclass(frozen=True)
class GateRecord:
    """What the gate persists. `failed`: nodes that reached upgrade-failed at `revision`;
    `acknowledged`: those a resume already forgave (they no longer count)."""

    revision: str = ""
    canary: tuple[str, ...] = ()
    validated_at: float | None = None
    failed: tuple[str, ...] = ()
    acknowledged: tuple[str, ...] = ()
    halted: bool = False
    digest: str = ""
    """The driver config digest the rollout installs: the record's key when known."""

    def dumps(self) -> str:
        data: dict[str, object] = {"revision": self.revision}
        if self.digest:
            data["digest"] = self.digest
        if self.canary:
            data["canary"] = list(self.canary)
        if self.validated_at is not None:
            data["validatedAt"] = int(self.validated_at)
        if self.failed:
            data["failed"] = list(self.failed)
        if self.acknowledged:
            data["acknowledged"] = list(self.acknowledged)
        if self.halted:
            data["halted"] = True
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    @classmethod
    def loads(cls, raw: str | None) -> GateRecord | None:
        """None when absent or unreadable (a hand-edited record starts over)."""
        if not raw:
            return None
        try:
            data = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(data, dict) or not isinstance(data.get("revision"), str):
            return None

        def names(key: str) -> tuple[str, ...]:
            value = data.get(key) or []
            return tuple(str(v) for v in value) if isinstance(value, list) else ()

        at = data.get("validatedAt")
        digest = data.get("digest")
        return cls(
            digest=digest if isinstance(digest, str) else "",
            revision=data["revision"],
            canary=names("canary"),
            validated_at=float(at) if isinstance(at, int | float) else None,
            failed=names("failed"),
            acknowledged=names("acknowledged"),
            halted=data.get("halted") is True,
        )

    @property
    def counted_failures(self) -> tuple[str, ...]:
        return tuple(n for n in self.failed if n not in self.acknowledged)

    def same_rollout(self, target: str, digest: str) -> bool:
        """Whether this record is about the rollout of ``digest`` (or, for a record or
        template without a digest, of the revision ``target``)."""
        if digest and self.digest:
            return self.digest == digest
        return self.revision == target


@dataclass(frozen=True)
class GateDecision:
    """`held`: candidates that may not start now, with why. `record`: what to persist
    (None: leave the annotation as it is). `message`: the condition's text."""

    phase: GatePhase
    record: GateRecord | None = None
    held: Mapping[str, str] = field(default_factory=dict)
    message: str = ""
    requeue_after: float | None = None
    resumed: bool = False
    settling: bool = False
    """The inputs were of two rollouts (``plan_gate``'s ``settled``): the candidates are
    held, nothing is decided, and nothing is to be persisted or reported."""

    @property
    def holding(self) -> bool:
        return self.phase in (GatePhase.CANARY, GatePhase.SOAKING, GatePhase.HALTED)


def _target(node: GateNode, target: str) -> str:
    return node.target or target


def _upgraded(node: GateNode, target: str) -> bool:
    return node.state is UpgradeState.UPGRADE_DONE and node.revision == _target(node, target)


def _outdated(node: GateNode, target: str) -> bool:
    """Part of this rollout: still to upgrade, upgrading, or failed at it."""
    if node.state in IN_PROGRESS_STATES or node.state is UpgradeState.UPGRADE_REQUIRED:
        return True
    return node.revision is not None and node.revision != _target(node, target)


def _pick_canary(fleet: list[GateNode], target: str, count: int) -> tuple[str, ...]:
    """Nodes already on their way first, then in the budget's own order (cordoned
    first, then by name); never a skipped or NotReady node."""
    moving = sorted(n.name for n in fleet if n.state in IN_PROGRESS_STATES)
    queued = sorted(
        (
            n
            for n in fleet
            if n.state is UpgradeState.UPGRADE_REQUIRED
            and not n.skip
            and n.ready
            and n.name not in moving
        ),
        key=lambda n: (not n.unschedulable, n.name),
    )
    return tuple([*moving, *(n.name for n in queued)][:count])


def _listing(names: Iterable[str]) -> str:
    return ", ".join(names)


def plan_gate(
    policy: GatePolicy,
    nodes: Iterable[GateNode],
    target: str | None,
    previous: GateRecord | None,
    *,
    now: float,
    resume: bool = False,
    digest: str = "",
    resource: str = "ClusterPolicy",
    settled: bool = True,
) -> GateDecision:
    """Decide the gate for one fleet pass. Pure: same inputs, same answer.

    ``target`` is the newest driver revision (what nodes are compared with, unless a
    node names its own), ``digest`` the config digest of its template (what keys the
    record; "" when unknown), ``resource`` what carries the record and the resume
    annotation (named in the halt's message). ``settled``: whether ``target`` is a
    revision of the template ``digest`` was read from. The template and its revisions
    come on two watches, so for a moment after the template changes one may be news
    and the other not; deciding then would key a record by one rollout and count
    failures at the other's revision (a rollback's first pass started the old driver's
    record halted by the failure of the new one). Unsettled, the candidates wait, and
    nothing is recorded, until the late event wakes the fleet pass again.
    """
    if not policy.enabled:
        return GateDecision(GatePhase.OFF)
    if not target:
        return GateDecision(GatePhase.IDLE, message="no driver revision yet")
    fleet = sorted(nodes, key=lambda n: n.name)
    if not settled:
        why = "waiting for the driver DaemonSet's newest revision to match its template"
        waiting = [n.name for n in fleet if n.state is UpgradeState.UPGRADE_REQUIRED]
        return GateDecision(
            phase_of(previous, policy, now),
            held=dict.fromkeys(waiting, why),
            message=why,
            settling=True,
        )
    if previous is not None and previous.same_rollout(target, digest):
        record = replace(previous, revision=target, digest=digest or previous.digest)
    else:
        record = GateRecord(revision=target, digest=digest)

    failed_now = {
        n.name
        for n in fleet
        if n.state is UpgradeState.UPGRADE_FAILED and n.failed_revision == _target(n, target)
    }
    failed = tuple(sorted(set(record.failed) | failed_now))
    record = replace(record, failed=failed)
    resumed = False
    if resume:
        record = replace(record, halted=False, acknowledged=failed)
        resumed = True
    limit = policy.halt_after_failures
    if limit and len(record.counted_failures) >= limit:
        record = replace(record, halted=True)

    candidates = [n.name for n in fleet if n.state is UpgradeState.UPGRADE_REQUIRED]
    rollout = [n for n in fleet if _outdated(n, target) or n.name in record.canary]
    if record.halted:
        why = (
            f"halted after {len(record.counted_failures)} failed node(s) "
            f"(haltAfterFailures={limit}): {_listing(record.counted_failures)}; "
            f"set the {RESUME_ANNOTATION}=true annotation on the {resource} or fix the driver"
        )
        return _decided(GatePhase.HALTED, record, previous, candidates, why, resumed=resumed)

    if policy.canary_nodes > 0:
        if not record.canary and rollout:
            record = replace(record, canary=_pick_canary(fleet, target, policy.canary_nodes))
        by_name = {n.name: n for n in fleet}
        canary = [by_name[c] for c in record.canary if c in by_name]
        if record.validated_at is None and (canary or rollout):
            if canary and all(_upgraded(n, target) for n in canary):
                record = replace(record, validated_at=now)
            else:
                waiting = [
                    n.name + (" (failed)" if n.state is UpgradeState.UPGRADE_FAILED else "")
                    for n in canary
                    if not _upgraded(n, target)
                ]
                why = (
                    f"canary: waiting for {_listing(waiting)} to upgrade and validate"
                    if waiting
                    else "canary: waiting for nodes to need the upgrade"
                )
                held = [c for c in candidates if c not in record.canary]
                return _decided(GatePhase.CANARY, record, previous, held, why, resumed=resumed)
        if record.validated_at is not None:
            left = record.validated_at + policy.soak_seconds - now
            if left > 0:
                until = datetime.fromtimestamp(record.validated_at + policy.soak_seconds, UTC)
                why = (
                    f"canary {_listing(record.canary)} validated; soaking "
                    f"{policy.soak_seconds}s, until {until:%Y-%m-%dT%H:%M:%SZ}"
                )
                held = [c for c in candidates if c not in record.canary]
                decision = _decided(GatePhase.SOAKING, record, previous, held, why, resumed=resumed)
                return replace(decision, requeue_after=left)
    if not rollout and not record.canary:
        return _decided(GatePhase.IDLE, record, previous, [], "", resumed=resumed)
    why = "proceeding" + (f": canary {_listing(record.canary)} passed" if record.canary else "")
    return _decided(GatePhase.PROCEEDING, record, previous, [], why, resumed=resumed)


def gate_resource(owner: str | None) -> str:
    """What carries the gate of a driver owner: the ClusterPolicy (None) or its
    NVIDIADriver."""
    return "ClusterPolicy" if owner is None else f"NVIDIADriver {owner}"


@dataclass(frozen=True)
class OwnerGate:
    """One driver owner's gate inputs: its own policy, nodes, target and record."""

    policy: GatePolicy
    nodes: tuple[GateNode, ...]
    target: str | None
    previous: GateRecord | None = None
    resume: bool = False
    digest: str = ""


def plan_owner_gates(
    owners: Mapping[str | None, OwnerGate], *, now: float
) -> dict[str | None, GateDecision]:
    """The gate of each driver owner (None: the ClusterPolicy, else an NVIDIADriver's
    name), each over its own nodes and record only: one owner's canary or halt never
    holds another owner's nodes."""
    return {
        owner: plan_gate(
            gate.policy,
            gate.nodes,
            gate.target,
            gate.previous,
            now=now,
            resume=gate.resume,
            digest=gate.digest,
            resource=gate_resource(owner),
        )
        for owner, gate in owners.items()
    }


def _decided(
    phase: GatePhase,
    record: GateRecord,
    previous: GateRecord | None,
    held: Iterable[str],
    why: str,
    *,
    resumed: bool,
) -> GateDecision:
    return GateDecision(
        phase=phase,
        record=None if record == previous else record,
        held=dict.fromkeys(held, why),
        message=why,
        resumed=resumed,
    )


def phase_of(record: GateRecord | None, policy: GatePolicy, now: float) -> GatePhase:
    """The phase a persisted record shows, for reports that do not plan (the CLI)."""
    if not policy.enabled:
        return GatePhase.OFF
    if record is None:
        return GatePhase.IDLE
    if record.halted:
        return GatePhase.HALTED
    if policy.canary_nodes and record.canary and record.validated_at is None:
        return GatePhase.CANARY
    if record.validated_at is not None and record.validated_at + policy.soak_seconds > now:
        return GatePhase.SOAKING
    return GatePhase.PROCEEDING
