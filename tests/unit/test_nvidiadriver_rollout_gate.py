"""Canary and halt per NVIDIADriver: the ClusterPolicy's rollout gate, one per driver owner.

An NVIDIADriver's `upgradePolicy` takes the same `canary` and `haltAfterFailures` as the
ClusterPolicy's; the same pure planning (`statemachine.rollout_gate`) runs once per owner
over that owner's nodes, and the record, condition and Events go on the NVIDIADriver.
"""

from __future__ import annotations

import copy
from typing import Any

from prometheus_client import CollectorRegistry

from components.nvidiadriver import policy_for
from crd import NVD_KIND, OWNER_LABEL, ClusterPolicySpec, parse_nvidiadriver
from gpuop.operator.controller.base.keys import UPGRADES_KEY
from gpuop.operator.controller.views.routes import route_nvidiadriver
from gpuop.operator.controller.writers.rollout_gate import CONDITION_TYPE, RolloutGate, gate_policy
from gpuop.operator.metrics import OperatorMetrics
from statemachine.rollout_gate import (
    RECORD_ANNOTATION,
    RESUME_ANNOTATION,
    GateNode,
    GatePhase,
    GatePolicy,
    GateRecord,
    OwnerGate,
    plan_owner_gates,
)
from statemachine.upgrade_keys import (
    DRIVER_REVISION_LABEL,
    FAILED_REVISION_ANNOTATION,
    STATE_LABEL,
    UpgradeState,
)
from tests.unit.test_resume_value import _Server as _PatchingServer
from tests.unit.test_status_owners import _Cache

Obj = dict[str, Any]
OLD, NEW = "rev-old", "rev-new"
REQ, DONE, FAILED = (
    UpgradeState.UPGRADE_REQUIRED,
    UpgradeState.UPGRADE_DONE,
    UpgradeState.UPGRADE_FAILED,
)


def _node(name: str, state: UpgradeState = REQ, revision: str = OLD) -> GateNode:
    failed = NEW if state is FAILED else None
    return GateNode(name=name, state=state, revision=revision, failed_revision=failed)


GATED = GatePolicy(canary_nodes=1, soak_seconds=0, halt_after_failures=1)


def test_each_owner_starts_with_its_own_canary() -> None:
    decisions = plan_owner_gates(
        {
            None: OwnerGate(GatePolicy(), (_node("cp-0"), _node("cp-1")), NEW),
            "training": OwnerGate(GATED, (_node("t-0"), _node("t-1"), _node("t-2")), NEW),
            "inference": OwnerGate(GATED, (_node("i-0"), _node("i-1")), NEW),
        },
        now=1000.0,
    )
    assert decisions[None].phase is GatePhase.OFF
    assert not decisions[None].held
    training = decisions["training"]
    assert training.phase is GatePhase.CANARY
    assert training.record is not None
    assert training.record.canary == ("t-0",)
    assert set(training.held) == {"t-1", "t-2"}  # the canary alone may start
    inference = decisions["inference"]
    assert inference.record is not None
    assert inference.record.canary == ("i-0",)
    assert set(inference.held) == {"i-1"}


def test_a_failed_canary_halts_only_its_owners_wave() -> None:
    canary = GateRecord(revision=NEW, canary=("t-0",))
    decisions = plan_owner_gates(
        {
            "training": OwnerGate(
                GATED, (_node("t-0", FAILED), _node("t-1"), _node("t-2")), NEW, canary
            ),
            "inference": OwnerGate(
                GATED,
                (_node("i-0", DONE, NEW), _node("i-1")),
                NEW,
                GateRecord(revision=NEW, canary=("i-0",)),
            ),
        },
        now=1000.0,
    )
    training = decisions["training"]
    assert training.phase is GatePhase.HALTED
    assert set(training.held) == {"t-1", "t-2"}
    assert training.record is not None
    assert training.record.halted
    assert f"{RESUME_ANNOTATION}=true annotation on the NVIDIADriver training" in (training.message)
    inference = decisions["inference"]  # its canary passed: its wave proceeds
    assert inference.phase is GatePhase.PROCEEDING
    assert not inference.held


def test_the_clusterpolicy_halt_message_is_unchanged() -> None:
    decisions = plan_owner_gates(
        {None: OwnerGate(GatePolicy(halt_after_failures=1), (_node("a", FAILED),), NEW)},
        now=0.0,
    )
    assert "annotation on the ClusterPolicy or fix the driver" in decisions[None].message


def _nvd(upgrade_policy: Obj, annotations: Obj | None = None) -> Obj:
    return {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": NVD_KIND,
        "metadata": {
            "name": "training",
            "resourceVersion": "1",
            "generation": 1,
            "annotations": annotations or {},
        },
        "spec": {"driverType": "gpu", "upgradePolicy": upgrade_policy},
    }


def test_an_nvidiadriver_takes_the_clusterpolicys_canary_and_halt_fields() -> None:
    raw = _nvd(
        {"autoUpgrade": True, "canary": {"nodes": 2, "soakSeconds": 60}, "haltAfterFailures": 1}
    )
    model = parse_nvidiadriver(raw)
    spec = policy_for(model.spec, ClusterPolicySpec())
    assert gate_policy(spec) == GatePolicy(canary_nodes=2, soak_seconds=60, halt_after_failures=1)


class _Server(_PatchingServer):
    """test_resume_value's server, also noting the kind of each object written."""

    def __init__(self, obj: Obj) -> None:
        super().__init__(obj)
        self.kinds: list[str] = []

    async def merge_patch(self, kind: Any, name: str, patch: Obj, **kw: Any) -> Obj:
        self.kinds.append(kind.kind)
        return await super().merge_patch(kind, name, patch, **kw)


class _Events:
    def __init__(self) -> None:
        self.recorded: list[tuple[str, str, str]] = []

    async def record(self, involved: Obj, reason: str, message: str, **_: Any) -> None:
        self.recorded.append((involved["kind"], reason, message))


def _gpu(name: str, state: UpgradeState, failed: str | None = None) -> Obj:
    annotations = {FAILED_REVISION_ANNOTATION: failed} if failed else {}
    return {
        "metadata": {
            "name": name,
            "labels": {
                "nvidia.com/gpu.present": "true",
                STATE_LABEL: state.value,
            },
            "annotations": annotations,
        },
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


async def test_a_halt_is_recorded_and_reported_on_the_nvidiadriver() -> None:
    raw = _nvd({"autoUpgrade": True, "haltAfterFailures": 1})
    server, policies, drivers, events = _Server(raw), _Cache(), _Cache(), _Events()
    gate = RolloutGate(
        server,  # type: ignore[arg-type]
        OperatorMetrics(CollectorRegistry()),
        events,  # type: ignore[arg-type]
        policies,
        drivers,  # type: ignore[arg-type]
    )
    spec = policy_for(parse_nvidiadriver(raw).spec, ClusterPolicySpec())
    nodes = [_gpu("t-0", FAILED, failed=NEW), _gpu("t-1", REQ)]
    decision = await gate.reconcile(
        copy.deepcopy(raw), spec, nodes, NEW, lambda _: OLD, owner="training"
    )
    assert decision.phase is GatePhase.HALTED
    assert set(decision.held) == {"t-1"}
    assert set(server.kinds) == {NVD_KIND}  # nothing written to a ClusterPolicy
    record = GateRecord.loads(server.obj["metadata"]["annotations"][RECORD_ANNOTATION])
    assert record is not None
    assert record.halted
    (cond,) = [c for c in server.obj["status"]["conditions"] if c["type"] == CONDITION_TYPE]
    assert (cond["status"], cond["reason"]) == ("True", "Halted")
    assert "NVIDIADriver training" in cond["message"]
    assert events.recorded[0][:2] == (NVD_KIND, "DriverUpgradeHalted")
    assert drivers.seen
    assert not policies.seen


def test_the_resume_annotation_on_an_nvidiadriver_wakes_the_fleet_pass() -> None:
    old = _nvd({"haltAfterFailures": 1})
    new = copy.deepcopy(old)
    new["metadata"]["annotations"][RESUME_ANNOTATION] = "true"
    assert UPGRADES_KEY in route_nvidiadriver("MODIFIED", old, new).keys


def test_upgrade_status_and_plan_show_an_nvidiadrivers_halt() -> None:
    from gpuop.upgrades_cli._render import nvd_gate_lines, render_status
    from gpuop.upgrades_cli._snapshot import Objects, snapshot
    from statemachine.fleet_report import Rules, status_report

    halted = GateRecord(revision=NEW, failed=("t-0",), halted=True)
    nvd = _nvd(
        {"autoUpgrade": True, "haltAfterFailures": 1},
        {RECORD_ANNOTATION: halted.dumps()},
    )
    ds = {
        "metadata": {
            "name": "nvidia-gpu-driver-training",
            "uid": "ds-uid",
            "ownerReferences": [{"kind": NVD_KIND, "name": "training", "controller": True}],
        },
        "spec": {"template": {"spec": {"nodeSelector": {}}}},
    }
    revision = {
        "metadata": {
            "ownerReferences": [{"uid": "ds-uid"}],
            "labels": {DRIVER_REVISION_LABEL: NEW},
        },
        "revision": 2,
    }
    nodes = [_gpu("t-0", FAILED, failed=NEW), _gpu("t-1", REQ), _gpu("cp-0", REQ)]
    for node in nodes[:2]:
        node["metadata"]["labels"][OWNER_LABEL] = "training"
    policy = {"metadata": {"name": "cluster-policy"}, "spec": {}}
    snap = snapshot(
        Objects(
            nodes=nodes,
            daemonsets=[ds],
            revisions=[revision],
            policies=[policy],
            drivers=[nvd],
        ),
        "gpu-operator",
        now=1000.0,
    )
    assert snap.nvd_gates["training"] == "halted"
    assert set(snap.held) == {"t-1"}  # the ClusterPolicy's own node is not held
    assert "NVIDIADriver training" in snap.held["t-1"]
    report = status_report(
        snap.nodes,
        snap.policy,
        Rules(gpu_pods=None, drain=None),
        (),
        snap.target,
        namespace="gpu-operator",
        now=1000.0,
        held=snap.held,
        nvd_gates=snap.nvd_gates,
    )
    assert "rollout gate (NVIDIADriver training): halted" in render_status(report)
    assert nvd_gate_lines(snap.nvd_gates) == ["rollout gate (NVIDIADriver training): halted"]
