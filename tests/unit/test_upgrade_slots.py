"""The fleet budget holds a node's slot until its new state is in the cache.

A node's step and the fleet pass run on different workers. While the step's node
patch is in flight, the cache still shows ``upgrade-required``; if the grant were
already released, the pass would count the node as waiting and give its slot to
another node: three upgrades in progress under a limit of two (seen once in CI).
"""

from __future__ import annotations

import asyncio
from typing import Any

from prometheus_client import CollectorRegistry

from components.driver import DAEMONSET_NAME as DRIVER_DS
from gpuop.controller._nodes import trim_node
from gpuop.controller._pods import pod_index, trim_pod
from gpuop.controller._upgrade import Upgrades
from gpuop.informer import Informer, ResourceSpec, key_of
from gpuop.metrics import OperatorMetrics
from statemachine import UpgradePolicyView
from statemachine.upgrade_keys import STATE_LABEL

Obj = dict[str, Any]
NODES = ["n0", "n1", "n2"]


async def _never(**_: Any) -> None:
    raise AssertionError("not called")


class _SlowRest:
    """Node patches wait until released; everything else answers at once."""

    def __init__(self, nodes: dict[str, Obj]) -> None:
        self.nodes = nodes
        self.release = asyncio.Event()
        self.patching = asyncio.Event()

    async def merge_patch(self, kind: Any, name: str, patch: Obj, **_: Any) -> Obj:
        self.patching.set()
        await self.release.wait()
        node = self.nodes[name]
        meta = node["metadata"]
        labels = {**meta["labels"], **(patch.get("metadata", {}).get("labels") or {})}
        annotations = {
            **meta["annotations"],
            **(patch.get("metadata", {}).get("annotations") or {}),
        }
        spec = {**node["spec"], **(patch.get("spec") or {})}
        rv = str(int(meta["resourceVersion"]) + 1)
        updated = {
            "metadata": {
                **meta,
                "labels": labels,
                "annotations": annotations,
                "resourceVersion": rv,
            },
            "spec": {k: v for k, v in spec.items() if v is not None},
            "status": node["status"],
        }
        self.nodes[name] = updated
        return updated

    async def list(self, *_: Any, **__: Any) -> list[Obj]:
        return []

    async def create(self, *_: Any, **__: Any) -> Obj:
        return {}


def _node(name: str) -> Obj:
    return {
        "metadata": {
            "name": name,
            "resourceVersion": "1",
            "labels": {
                "nvidia.com/gpu.present": "true",
                "feature.node.kubernetes.io/pci-10de.present": "true",
                STATE_LABEL: "upgrade-required",
            },
            "annotations": {},
        },
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def _driver_pod(node: str) -> Obj:
    return {
        "metadata": {
            "name": f"driver-{node}",
            "namespace": "gpu-operator",
            "uid": f"uid-{node}",
            "resourceVersion": "1",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {"app": DRIVER_DS, "controller-revision-hash": "old"},
            "ownerReferences": [{"kind": "DaemonSet", "name": DRIVER_DS, "uid": "ds"}],
        },
        "spec": {"nodeName": node},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "driver", "restartCount": 0}],
        },
    }


async def test_a_slot_is_held_while_the_node_patch_is_in_flight() -> None:
    raw = {name: _node(name) for name in NODES}
    rest = _SlowRest(raw)
    nodes = Informer(ResourceSpec("nodes", _never, transform=trim_node), lambda *_: None)
    pods = Informer(
        ResourceSpec("pods", _never, transform=trim_pod, index=pod_index), lambda *_: None
    )
    for name in NODES:
        node = trim_node(raw[name])
        nodes._put(key_of(node), node)
        pod = trim_pod(_driver_pod(name))
        pods._put(key_of(pod), pod)
    empty = Informer(ResourceSpec("x", _never), lambda *_: None)
    upgrades = Upgrades(
        rest,  # type: ignore[arg-type]
        OperatorMetrics(CollectorRegistry()),
        "gpu-operator",
        pods=pods,
        revisions=empty,
        daemonsets=empty,
        nodes=nodes,
    )
    policy = UpgradePolicyView(auto_upgrade=True, max_parallel_upgrades=2, max_unavailable="100%")

    first = upgrades.select(nodes.values(), policy, "new")
    assert len(first) == 2
    stepping = next(iter(first))
    step = asyncio.create_task(upgrades.step(nodes.get(stepping) or {}, policy, "new"))
    await asyncio.wait_for(rest.patching.wait(), 5)
    # The fleet pass runs while the patch is in flight: no third slot.
    assert upgrades.select(nodes.values(), policy, "new") == []
    rest.release.set()
    decision = await asyncio.wait_for(step, 5)
    assert decision.target.value != "upgrade-required"
    assert nodes.get(stepping)["metadata"]["labels"][STATE_LABEL] == decision.target.value  # type: ignore[index]
    # Once the cache shows it in progress, the count still holds at two.
    assert upgrades.select(nodes.values(), policy, "new") == []
