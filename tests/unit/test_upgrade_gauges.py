"""The upgrade gauges count the whole fleet, every driver owner's budget summed: with
several NVIDIADrivers they showed only the last owner the fleet pass handled, so a
node failed under an earlier one read ``gpu_operator_nodes_upgrades_failed 0`` and the
failure alerts never fired (issue 43). Upstream reports one gauge per operator.

The operator is the real one, over caches filled by hand and an API that records
writes (none happen: failed and done nodes start nothing).
"""

from __future__ import annotations

from typing import Any

import crd
from components.keys import NFD_GPU_LABELS
from gpuop.operator.controller.base.config import OperatorConfig
from gpuop.operator.controller.wiring.operator import Operator
from gpuop.operator.metrics import OperatorMetrics
from statemachine.upgrade_keys import STATE_LABEL
from tests.unit.test_nvidiadriver_sync import _RecordingRest

Obj = dict[str, Any]


def _policy() -> Obj:
    policy = crd.sample_policy()
    policy["spec"]["driver"]["useNvidiaDriverCRD"] = True
    policy["metadata"].update(
        uid="p", resourceVersion="1", creationTimestamp="2026-01-01T00:00:00Z", generation=1
    )
    return policy


def _nvidiadriver(name: str) -> Obj:
    return {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "NVIDIADriver",
        "metadata": {"name": name, "uid": f"nvd-{name}", "resourceVersion": "1"},
        "spec": {
            "driverType": "gpu",
            "image": "driver",
            "repository": "nvcr.io/nvidia",
            "version": "580.95.05",
            "nodeSelector": {"pool": name},
            "upgradePolicy": {"autoUpgrade": True, "maxParallelUpgrades": 1},
        },
    }


def _node(name: str, owner: str, state: str) -> Obj:
    return {
        "metadata": {
            "name": name,
            "uid": f"u-{name}",
            "resourceVersion": "1",
            "labels": {
                NFD_GPU_LABELS[0]: "true",
                "pool": owner,
                crd.OWNER_LABEL: owner,
                STATE_LABEL: state,
            },
        },
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def _operator(*nodes: Obj) -> tuple[Operator, _RecordingRest]:
    rest = _RecordingRest()
    op = Operator(rest, OperatorConfig(), OperatorMetrics())  # type: ignore[arg-type]
    op.policies.observe(_policy())
    for name in ("first", "second"):
        op.owners.drivers.observe(_nvidiadriver(name))
    for node in nodes:  # the fleet pass meets the owners in node order
        op.nodes.observe(node)
    for informer in (*op.informers, op.owners.drivers):
        informer.synced.set()
    return op, rest


def _gauge(op: Operator, name: str) -> float:
    value: float = getattr(op.metrics, name)._value.get()
    return value


async def test_a_failed_node_under_each_of_two_owners_counts_two() -> None:
    op, rest = _operator(
        _node("gpu-0", "first", "upgrade-failed"), _node("gpu-1", "second", "upgrade-failed")
    )

    await op.node_passes.reconcile_upgrades()

    assert rest.writes == []
    assert _gauge(op, "upgrades_failed") == 2


async def test_a_failed_node_under_the_first_owner_only_still_counts() -> None:
    op, rest = _operator(
        _node("gpu-0", "first", "upgrade-failed"), _node("gpu-1", "second", "upgrade-done")
    )

    await op.node_passes.reconcile_upgrades()

    assert rest.writes == []
    assert _gauge(op, "upgrades_failed") == 1
    assert _gauge(op, "upgrades_done") == 1
    assert _gauge(op, "upgrades_in_progress") == 1  # failed counts as in progress, as upstream
    assert _gauge(op, "upgrades_available") == 1  # the second owner's one free slot
