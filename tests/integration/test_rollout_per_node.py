"""One GPU node that never runs a pod holds back only itself: every operand reaches
every other GPU node, a later spec change too, and the status names the broken node."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

import crd
from gpuop.devcluster import NFD_GPU_LABEL, ClusterInfo
from gpuop.devcluster._nodes import KWOK_ANNOTATION, node_manifest
from gpuop.kube.client import api_client as make_api_client
from gpuop.kube.kinds import KINDS, by_kind
from gpuop.kube.rest import Rest
from gpuop.operator.controller import OperatorConfig
from gpuop.operator.install import ensure_namespace, install_crd
from statemachine.node_rollout import UNREACHABLE_TAINT
from statemachine.stale_pods import OUT_OF_SERVICE_TAINT
from tests.integration.harness import (
    NAMESPACE,
    NODE,
    POLICY,
    Running,
    eventually,
    own_cluster,
    policy_state_is,
)

pytestmark = pytest.mark.integration

DS = by_kind("apps/v1", "DaemonSet")
POD = by_kind("v1", "Pod")
EVENT = by_kind("v1", "Event")
GPU_NODES = 3
#: Created without kwok's annotation: no kubelet, so nothing ever starts there.
BROKEN = "gpu-node-0009"
DEVICE_PLUGIN = "nvidia-device-plugin-daemonset"


@pytest.fixture(scope="module")
def fleet() -> Iterator[ClusterInfo]:
    with own_cluster("-rollout", gpu_nodes=GPU_NODES) as info:
        yield info


@pytest.fixture(scope="module")
async def rest(fleet: ClusterInfo) -> AsyncIterator[Rest]:
    async with make_api_client(fleet.kubeconfig, user_agent="gpuop-tests") as api:
        rest = Rest(api, KINDS)
        await install_crd(rest)
        await ensure_namespace(rest, NAMESPACE)
        broken = node_manifest(9, True)
        del broken["metadata"]["annotations"][KWOK_ANNOTATION]
        await rest.create(NODE, broken)
        yield rest


async def _healthy_gpu_nodes(rest: Rest) -> list[dict[str, Any]]:
    return [
        n
        for n in await rest.list(NODE)
        if (n["metadata"].get("labels") or {}).get(NFD_GPU_LABEL) == "true"
        and n["metadata"]["name"] != BROKEN
    ]


def _selects(ds: dict[str, Any], node: dict[str, Any]) -> bool:
    selector = ds["spec"]["template"]["spec"].get("nodeSelector") or {}
    labels = node["metadata"].get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items())


def _ready(pod: dict[str, Any]) -> bool:
    return not pod["metadata"].get("deletionTimestamp") and any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in pod.get("status", {}).get("conditions") or []
    )


async def _missing_on_healthy(rest: Rest, image_part: str | None = None) -> list[str]:
    """(DaemonSet, node) pairs where a healthy GPU node lacks a Ready pod (whose
    device-plugin image contains ``image_part``, when given); empty when all run."""
    daemonsets = await rest.list(DS, NAMESPACE)
    pods = await rest.list(POD, NAMESPACE)
    missing: list[str] = []
    for node in await _healthy_gpu_nodes(rest):
        name = node["metadata"]["name"]
        for ds in daemonsets:
            if not _selects(ds, node):
                continue
            app = ds["spec"]["selector"]["matchLabels"]["app"]
            ok = [
                p
                for p in pods
                if p["spec"].get("nodeName") == name
                and p["metadata"]["labels"].get("app") == app
                and _ready(p)
                and (
                    image_part is None
                    or app != DEVICE_PLUGIN
                    or image_part in p["spec"]["containers"][0]["image"]
                )
            ]
            if not ok:
                missing.append(f"{ds['metadata']['name']}@{name}")
    return missing


async def _status(rest: Rest) -> dict[str, Any]:
    policy = await rest.get(POLICY, "cluster-policy")
    return ((policy or {}).get("status")) or {}


async def _names_broken(rest: Rest) -> dict[str, Any] | None:
    """The status once it names the broken node and counts every healthy node's device
    plugin Ready. Both are needed: the node is named stuck after 3 s, which may be in a
    pass before the last device-plugin pod turned Ready, and the pass that counts it
    follows on its paced clock (up to 5 s after the pod event)."""
    status = await _status(rest)
    ready = next((c for c in status.get("conditions") or [] if c["type"] == "Ready"), {})
    message = ready.get("message", "")
    plugin = next((c for c in status.get("components") or [] if c["name"] == "device-plugin"), {})
    if (
        status.get("state") == "notReady"
        and f"{BROKEN} (driver:" in message
        and plugin.get("nodesReady") == GPU_NODES
    ):
        return status
    return None


async def test_a_node_that_runs_no_pods_holds_back_only_itself(
    rest: Rest, fleet: ClusterInfo
) -> None:
    policy = copy.deepcopy(crd.sample_policy())
    await rest.apply(policy)
    config = OperatorConfig(namespace=NAMESPACE, workers=4, node_stuck_seconds=3)
    async with (
        make_api_client(fleet.kubeconfig, user_agent="gpuop-operator") as api,
        Running(api, config) as run,
    ):
        healthy = await _healthy_gpu_nodes(rest)
        assert len(healthy) == GPU_NODES

        # Every operand on every healthy GPU node, though the broken node has none.
        last: list[str] = []

        async def all_run() -> bool:
            daemonsets = {d["metadata"]["name"] for d in await rest.list(DS, NAMESPACE)}
            wanted = {DEVICE_PLUGIN, "nvidia-container-toolkit-daemonset", "nvidia-dcgm-exporter"}
            missing = sorted(wanted - daemonsets) + await _missing_on_healthy(rest)
            last[:] = missing
            return not missing

        try:
            await eventually(all_run, timeout=180, what="operands on healthy nodes")
        except AssertionError as err:
            raise AssertionError(f"{err}; missing: {last}") from None

        # The status names the broken node and where it is stuck; so do an Event
        # and the metric.
        status = await eventually(
            lambda: _names_broken(rest), timeout=60, what="status names the node"
        )
        counts = {c["name"]: c for c in status["components"]}
        assert counts["device-plugin"]["nodesReady"] == GPU_NODES
        assert counts["device-plugin"]["nodesNotReady"] == 1
        assert counts["driver"]["nodesAt"] == 1
        assert counts["device-plugin"]["state"] == "notReady"

        async def event() -> list[dict[str, Any]]:
            return [
                e
                for e in await rest.list(EVENT, "default")
                if e["reason"] == "NodesNotReady" and BROKEN in e["message"]
            ]

        assert await eventually(event, what="NodesNotReady Event")
        gauge = run.operator.metrics.nodes_not_ready.labels(state="driver")
        assert gauge._value.get() == 1

        # Once Kubernetes has marked the node unreachable, the operator leaves its
        # pods alone (no kubelet there may have stopped them). An administrator who
        # marks it out of service lets a device-plugin change reach every healthy node
        # (one dead node would otherwise use up the DaemonSet's maxUnavailable of 1),
        # and the broken node is left without a pod that stays terminating.
        async def unreachable() -> bool:
            node = await rest.get(NODE, BROKEN)
            taints = (node or {}).get("spec", {}).get("taints") or []
            return any(t["key"] == UNREACHABLE_TAINT for t in taints)

        assert await eventually(unreachable, timeout=180, what="node lifecycle taint")
        policy["spec"]["devicePlugin"]["version"] = "v0.99.1"
        await rest.apply(policy)
        out_of_service = {
            "key": OUT_OF_SERVICE_TAINT,
            "value": "nodeshutdown",
            "effect": "NoExecute",
        }
        node = await rest.get(NODE, BROKEN)
        taints = [*((node or {}).get("spec", {}).get("taints") or []), out_of_service]
        await rest.merge_patch(NODE, BROKEN, {"spec": {"taints": taints}})

        async def updated() -> bool:
            return not await _missing_on_healthy(rest, "v0.99.1")

        assert await eventually(updated, timeout=180, what="new device plugin everywhere")

        async def nothing_stuck_terminating() -> bool:
            pods = await rest.list(POD, NAMESPACE)
            return not any(
                p["spec"].get("nodeName") == BROKEN
                and p["metadata"].get("deletionTimestamp")
                and p["metadata"]["labels"].get("app") == DEVICE_PLUGIN
                for p in pods
            )

        assert await eventually(nothing_stuck_terminating, what="stale pod released")
        assert await eventually(lambda: _names_broken(rest), what="still names the node")

        # Without the broken node the policy is ready.
        await rest.delete(NODE, BROKEN)
        assert await eventually(lambda: policy_state_is(rest, "ready"), timeout=120, what="ready")
        status = await _status(rest)
        counts = {c["name"]: c for c in status["components"]}
        assert counts["device-plugin"]["nodesNotReady"] == 0
        assert gauge._value.get() == 0
