"""No pass acts on a node driven by an NVIDIADriver before the NVIDIADriver cache has
listed: until then a node's upgrade policy is unknown, and reading it as "auto-upgrade
off" uncordoned a node in the middle of its upgrade and dropped its state (issue 35).

The operator is the real one, over caches filled by hand and an API that records writes.
"""

from __future__ import annotations

from typing import Any

import crd
from components.keys import NFD_GPU_LABELS
from components.labels import apply_label_changes, node_label_changes
from gpuop.operator.controller.base.config import OperatorConfig
from gpuop.operator.controller.base.keys import NVD_KEY, UPGRADES_KEY, node_key
from gpuop.operator.controller.views.node_views import trim_node
from gpuop.operator.controller.wiring.operator import Operator
from gpuop.operator.metrics import OperatorMetrics
from statemachine.upgrade_keys import (
    INITIAL_UNSCHEDULABLE_ANNOTATION,
    REPLACE_POD_ANNOTATION,
    STATE_LABEL,
    STATE_SINCE_ANNOTATION,
)

Obj = dict[str, Any]


class _RecordingRest:
    """Reads find nothing; every write is recorded (and fails the test by being there)."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, Any]] = []

    def lister(self, *_: Any, **__: Any) -> Any:
        async def never(**_: Any) -> Any:
            raise AssertionError("no informer runs here")

        return never

    async def list(self, *_: Any, **__: Any) -> list[Obj]:
        return []

    async def get(self, *_: Any, **__: Any) -> Obj | None:
        return None

    async def merge_patch(self, kind: Any, name: str, patch: Obj, *_: Any, **__: Any) -> Obj:
        self.writes.append(("patch", (name, patch)))
        raise AssertionError(f"wrote {patch} to {name}")

    async def apply(self, obj: Any, *_: Any, **__: Any) -> Obj:
        self.writes.append(("apply", obj))
        raise AssertionError("applied")

    async def delete(self, *args: Any, **__: Any) -> None:
        self.writes.append(("delete", args))
        raise AssertionError("deleted")

    async def evict(self, *args: Any, **__: Any) -> None:
        self.writes.append(("evict", args))
        raise AssertionError("evicted")


def _policy() -> Obj:
    policy = crd.sample_policy()
    policy["spec"]["driver"]["useNvidiaDriverCRD"] = True
    policy["metadata"].update(
        uid="p", resourceVersion="1", creationTimestamp="2026-01-01T00:00:00Z", generation=1
    )
    return policy


def _deploy_labels() -> dict[str, str]:
    """A GPU node's labels once the node pass gave it its deploy labels."""
    gpu = {NFD_GPU_LABELS[0]: "true"}
    spec = crd.parse_policy(_policy())[0]
    assert spec is not None
    return apply_label_changes(gpu, node_label_changes(gpu, spec.spec))


def _upgrading_node() -> Obj:
    """A node of NVIDIADriver `default` halfway through its upgrade, cordoned by us."""
    return {
        "metadata": {
            "name": "gpu-0",
            "uid": "n",
            "resourceVersion": "7",
            "labels": {
                **_deploy_labels(),
                crd.OWNER_LABEL: "default",
                STATE_LABEL: "wait-for-jobs-required",
            },
            "annotations": {
                STATE_SINCE_ANNOTATION: "1700000000",
                REPLACE_POD_ANNOTATION: "old-pod",
                INITIAL_UNSCHEDULABLE_ANNOTATION: "false",
            },
        },
        "spec": {"unschedulable": True},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def _operator() -> tuple[Operator, _RecordingRest]:
    rest = _RecordingRest()
    op = Operator(rest, OperatorConfig(), OperatorMetrics())  # type: ignore[arg-type]
    op.policies.observe(_policy())
    op.nodes.observe(_upgrading_node())
    for informer in op.informers:
        informer.synced.set()  # every cache but the NVIDIADrivers' has listed
    return op, rest


async def test_node_and_fleet_passes_wait_for_the_nvidiadriver_cache() -> None:
    op, rest = _operator()
    assert not op.nvd.drivers.synced.is_set()

    await op.node_passes.reconcile_node("gpu-0")
    await op.node_passes.reconcile_upgrades()
    await op.nvd.reconcile()

    assert rest.writes == []
    assert op.nodes.get("gpu-0") == trim_node(_upgrading_node())


def test_the_listed_nvidiadriver_cache_wakes_the_passes_that_waited() -> None:
    op, _ = _operator()
    queued: list[str] = []
    op.queue.add = queued.append  # type: ignore[method-assign]

    op.nvd._on_listed()

    assert {NVD_KEY, UPGRADES_KEY, node_key("gpu-0")} <= set(queued)
