"""Which driver runs on a node is one unit's answer (`DriverOwners`), handed to every
reader, and a node pass asks it once: the upgrade step is handed the answer instead of
asking again through a method patched onto it."""

from __future__ import annotations

from typing import Any

import crd
from components.keys import NFD_GPU_LABELS
from components.labels import apply_label_changes, node_label_changes
from gpuop.operator.controller.base.config import OperatorConfig
from gpuop.operator.controller.wiring.operator import Operator
from gpuop.operator.metrics import OperatorMetrics
from statemachine.driver_handoff import HANDOFF_ANNOTATION
from statemachine.upgrade_keys import STATE_LABEL, STATE_SINCE_ANNOTATION
from tests.unit.test_nvidiadriver_sync import _RecordingRest

Obj = dict[str, Any]


def _policy() -> Obj:
    policy = crd.sample_policy()
    policy["metadata"].update(
        uid="p", resourceVersion="1", creationTimestamp="2026-01-01T00:00:00Z", generation=1
    )
    return policy


def _node_at_rest() -> Obj:
    """A GPU node with its deploy labels, its upgrade done."""
    gpu = {NFD_GPU_LABELS[0]: "true"}
    spec = crd.parse_policy(_policy())[0]
    assert spec is not None
    node_labels = apply_label_changes(gpu, node_label_changes(gpu, spec.spec))
    return {
        "metadata": {
            "name": "gpu-0",
            "uid": "n",
            "resourceVersion": "7",
            "labels": {**node_labels, STATE_LABEL: "upgrade-done"},
            # At rest under the sample policy (auto-upgrade on): handed off to us.
            "annotations": {STATE_SINCE_ANNOTATION: "1700000000", HANDOFF_ANNOTATION: "true"},
        },
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def _operator() -> tuple[Operator, _RecordingRest]:
    rest = _RecordingRest()
    op = Operator(rest, OperatorConfig(), OperatorMetrics())  # type: ignore[arg-type]
    op.policies.observe(_policy())
    op.nodes.observe(_node_at_rest())
    for informer in (*op.informers, op.owners.drivers):
        informer.synced.set()
    return op, rest


def test_every_reader_is_handed_the_same_driver_owners() -> None:
    op, _ = _operator()
    assert op.node_passes.owners is op.owners
    assert op.nvd.owners is op.owners
    assert op.upgrades._owners is op.owners


async def test_a_node_pass_asks_which_driver_runs_on_its_node_once() -> None:
    op, rest = _operator()
    asked: list[str] = []
    answer = op.owners.driver_app

    def driver_app(node: str) -> str:
        asked.append(node)
        return answer(node)

    op.owners.driver_app = driver_app  # type: ignore[method-assign]

    await op.node_passes.reconcile_node("gpu-0")

    assert rest.writes == []  # at rest: the pass only read
    assert asked == ["gpu-0"]
