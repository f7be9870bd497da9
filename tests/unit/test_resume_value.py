"""The resume annotations act on the value "true" only: `...-resume=false` resumes nothing.

Both are an administrator's switch on the ClusterPolicy (`gpuop.io/driver-upgrade-resume`
for a halted driver rollout, `gpuop.io/health-remediation-resume` for a paused GPU health
remediation); like upstream's `nvidia.com/gpu-driver-upgrade-requested`, only "true"
turns them on, and only a used "true" is removed.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from crd import ClusterPolicySpec
from gpuop.operator.controller.writers.rollout_gate import RolloutGate
from gpuop.operator.metrics import OperatorMetrics
from statemachine.remediation import RESUME_ANNOTATION as REMEDIATION_RESUME
from statemachine.remediation import resume_requested as remediation_resume_requested
from statemachine.rollout_gate import RECORD_ANNOTATION, GatePhase, GateRecord
from statemachine.rollout_gate import RESUME_ANNOTATION as GATE_RESUME

Obj = dict[str, Any]
NEW = "rev-new"


class _Server:
    def __init__(self, obj: Obj) -> None:
        self.obj = obj
        self.patches: list[Obj] = []

    async def merge_patch(self, kind: Any, name: str, patch: Obj, **kw: Any) -> Obj:
        self.patches.append(patch)
        if kw.get("subresource") == "status":
            self.obj["status"] = {**(self.obj.get("status") or {}), **patch["status"]}
        else:
            annotations = self.obj["metadata"].setdefault("annotations", {})
            for key, value in patch["metadata"]["annotations"].items():
                if value is None:
                    annotations.pop(key, None)
                else:
                    annotations[key] = value
        self.obj["metadata"]["resourceVersion"] = str(
            int(self.obj["metadata"]["resourceVersion"]) + 1
        )
        return copy.deepcopy(self.obj)

    async def get(self, kind: Any, name: str, namespace: str | None = None) -> Obj:
        return copy.deepcopy(self.obj)


class _Cache:
    def observe(self, raw: Obj) -> None:
        return None


class _Events:
    async def record(self, *_: Any, **__: Any) -> None:
        return None


def _halted_policy(resume: str) -> Obj:
    record = GateRecord(revision=NEW, failed=("gpu-0",), halted=True)
    return {
        "metadata": {
            "name": "cluster-policy",
            "resourceVersion": "1",
            "annotations": {RECORD_ANNOTATION: record.dumps(), GATE_RESUME: resume},
        },
        "spec": {},
    }


async def _reconcile(raw: Obj) -> tuple[GatePhase, _Server]:
    server = _Server(raw)
    gate = RolloutGate(
        server,  # type: ignore[arg-type]
        OperatorMetrics(CollectorRegistry()),
        _Events(),  # type: ignore[arg-type]
        _Cache(),
    )
    spec = ClusterPolicySpec.model_validate({"driver": {"upgradePolicy": {"haltAfterFailures": 1}}})
    decision = await gate.reconcile(copy.deepcopy(raw), spec, [], NEW, lambda _: None)
    return decision.phase, server


@pytest.mark.parametrize("value", ["false", "", "no", "TRUE "])
async def test_a_halted_rollout_stays_halted_unless_resume_is_true(value: str) -> None:
    phase, server = await _reconcile(_halted_policy(value))
    assert phase is GatePhase.HALTED
    assert server.obj["metadata"]["annotations"][GATE_RESUME] == value  # not consumed


async def test_resume_true_resumes_and_is_consumed() -> None:
    phase, server = await _reconcile(_halted_policy("true"))
    assert phase is not GatePhase.HALTED
    assert GATE_RESUME not in server.obj["metadata"]["annotations"]


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        ({REMEDIATION_RESUME: "true"}, True),
        ({REMEDIATION_RESUME: "false"}, False),
        ({REMEDIATION_RESUME: ""}, False),
        ({}, False),
    ],
)
def test_remediation_resumes_only_on_true(annotations: dict[str, str], expected: bool) -> None:
    assert remediation_resume_requested(annotations) is expected
