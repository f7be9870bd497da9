"""Sandbox workloads on the real control plane: a mixed fleet of container hosts and VM
hosts gets exactly the operands NVIDIA's operator gave it (recorded upstream data), one
node switched to a VM host and back changes only that node, and the GPUs change hands
only once the old workload let go of them; turning `sandboxWorkloads` off removes every
sandbox operand and label."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client

from components.keys import WORKLOAD_CONFIG_LABEL
from gpuop.kube.informer import Informer, Obj, ResourceSpec
from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Rest
from statemachine.upgrade_keys import STATE_LABEL
from tests.integration.harness import NAMESPACE, NODE, POLICY, Running, eventually

pytestmark = pytest.mark.integration

DS = by_kind("apps/v1", "DaemonSet")
POD = by_kind("v1", "Pod")
EVENT = by_kind("v1", "Event")
_UPSTREAM = Path(__file__).resolve().parents[1] / "conformance" / "upstream"
SCENARIO = next(
    p
    for p in (_UPSTREAM / "sandbox-mixed-kata", _UPSTREAM / "next" / "sandbox-mixed-kata")
    if p.is_dir()
)
DEPLOY_PREFIX = "nvidia.com/gpu.deploy."
SWITCHED = "gpu-node-0000"
"""A container node (an A100: MIG-capable) switched to vm-passthrough and back."""
PASSTHROUGH = "gpu-node-0001"
"""Upstream's vm-passthrough node: what a passthrough node gets."""
DRIVER_DS = "nvidia-driver-daemonset"
VFIO_DS = "nvidia-vfio-manager"
VFIO_LABEL = "nvidia.com/gpu.deploy.vfio-manager"
SANDBOX_DAEMONSETS = {
    "nvidia-vgpu-manager-daemonset",
    "nvidia-vgpu-device-manager",
    "nvidia-vfio-manager",
    "nvidia-sandbox-device-plugin-daemonset",
    "nvidia-kata-sandbox-device-plugin-daemonset",
    "nvidia-sandbox-validator",
    "nvidia-cc-manager",
}
SANDBOX_LABELS = {
    f"{DEPLOY_PREFIX}{name}"
    for name in (
        "vgpu-manager",
        "vgpu-device-manager",
        "vfio-manager",
        "sandbox-device-plugin",
        "kata-sandbox-device-plugin",
        "sandbox-validator",
        "cc-manager",
        "kata-manager",
    )
}
WAIT = 240.0
"""Generous: a rollout of 14 DaemonSets on a shared 2-core machine."""


def _recorded() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((SCENARIO / "rendered.yaml").read_text()) if d]


POLICY_DOC: dict[str, Any] = yaml.safe_load((SCENARIO / "policy.yaml").read_text())
WORKLOADS: dict[str, dict[str, str]] = yaml.safe_load((SCENARIO / "node-labels.yaml").read_text())
"""The node labels set before upstream's run: which node serves which workload."""
UPSTREAM_LABELS: dict[str, dict[str, str]] = next(
    d for d in _recorded() if d["kind"] == "NodeLabels"
)["nodes"]
"""Every GPU node's labels after upstream's rollout."""
UPSTREAM_SELECTORS: dict[str, dict[str, str]] = {
    d["metadata"]["name"]: d["spec"]["template"]["spec"].get("nodeSelector") or {}
    for d in _recorded()
    if d["kind"] == "DaemonSet"
}
"""Every upstream DaemonSet's node selector."""


def _deploy(labels: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in labels.items() if k.startswith(DEPLOY_PREFIX)}


def _expected_daemonsets(labels: dict[str, str]) -> set[str]:
    """The upstream DaemonSets whose node selector these labels match."""
    return {
        name
        for name, selector in UPSTREAM_SELECTORS.items()
        if all(labels.get(k) == v for k, v in selector.items())
    }


async def _node_labels(rest: Rest) -> dict[str, dict[str, str]]:
    return {
        n["metadata"]["name"]: n["metadata"].get("labels") or {}
        for n in await rest.list(NODE)
        if n["metadata"]["name"] in UPSTREAM_LABELS
    }


async def _pods(rest: Rest) -> dict[str, dict[str, str]]:
    """Per GPU node, its live operand pods: DaemonSet name to pod uid."""
    result: dict[str, dict[str, str]] = {n: {} for n in UPSTREAM_LABELS}
    for pod in await rest.list(POD, NAMESPACE):
        meta = pod["metadata"]
        node = pod["spec"].get("nodeName")
        owners = [o["name"] for o in meta.get("ownerReferences") or [] if o["kind"] == "DaemonSet"]
        if node in result and owners and not meta.get("deletionTimestamp"):
            result[node][owners[0]] = meta["uid"]
    return result


async def _matches(rest: Rest, want_labels: dict[str, dict[str, str]]) -> bool | str:
    """Each node carries exactly the deploy labels given and runs exactly the operands
    those labels select in upstream's DaemonSets."""
    labels = await _node_labels(rest)
    pods = await _pods(rest)
    for node, want in want_labels.items():
        if _deploy(labels[node]) != _deploy(want):
            return False
        if set(pods[node]) != _expected_daemonsets(want):
            return False
    return True


async def _set_workload(rest: Rest, node: str, workload: str | None) -> None:
    await rest.merge_patch(NODE, node, {"metadata": {"labels": {WORKLOAD_CONFIG_LABEL: workload}}})


class NodeTimeline:
    """Every operand pod and label change on one node, checked as it arrives: the GPU
    claimants (driver, VFIO manager) never run there together, and the VFIO manager's
    label never appears while a driver pod or a container's GPU pod is on the node."""

    def __init__(self, rest: Rest, node: str, gpu_pod: str) -> None:
        self.node = node
        self.gpu_pod = gpu_pod
        self.live: dict[str, str] = {}  # pod name -> DaemonSet
        self.gpu_pod_here = False
        self.vfio_label = False
        self.violations: list[str] = []
        selector = f"spec.nodeName={node}"
        self.pods = Informer(
            ResourceSpec("t-pods", rest.lister(POD), field_selector=selector), self._on_pod
        )
        self.nodes = Informer(
            ResourceSpec("t-node", rest.lister(NODE), field_selector=f"metadata.name={node}"),
            self._on_node,
        )

    def _on_pod(self, event: str, old: Obj | None, new: Obj | None) -> None:
        pod = new or old
        assert pod is not None
        meta = pod["metadata"]
        if meta["name"] == self.gpu_pod:
            self.gpu_pod_here = event != "DELETED"
        owners = [o["name"] for o in meta.get("ownerReferences") or [] if o["kind"] == "DaemonSet"]
        if not owners:
            return
        if event == "DELETED":
            self.live.pop(meta["name"], None)
        else:
            self.live[meta["name"]] = owners[0]
        self._check(f"pod {meta['name']} {event}")

    def _on_node(self, event: str, old: Obj | None, new: Obj | None) -> None:
        labels = ((new or old or {}).get("metadata") or {}).get("labels") or {}
        self.vfio_label = labels.get(VFIO_LABEL) == "true"
        self._check("node labels")

    def _check(self, what: str) -> None:
        running = set(self.live.values())
        if DRIVER_DS in running and VFIO_DS in running:
            self.violations.append(f"{what}: driver and vfio-manager pods together")
        if self.vfio_label and DRIVER_DS in running:
            self.violations.append(f"{what}: vfio-manager label while a driver pod runs")
        if self.vfio_label and self.gpu_pod_here:
            self.violations.append(f"{what}: vfio-manager label while {self.gpu_pod} runs")

    @contextlib.asynccontextmanager
    async def watching(self) -> AsyncIterator[NodeTimeline]:
        tasks = [asyncio.create_task(i.run()) for i in (self.pods, self.nodes)]
        try:
            await asyncio.gather(self.pods.synced.wait(), self.nodes.synced.wait())
            yield self
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def _handover_events(rest: Rest, node: str) -> list[dict[str, Any]]:
    return [
        e
        for e in await rest.list(EVENT, "default")
        if e["involvedObject"].get("name") == node
        and e["reason"] in ("GPUWorkloadHandover", "GPUWorkloadHandedOver")
    ]


@pytest.fixture(scope="module")
async def operator(api_client: client.ApiClient, rest: Rest) -> AsyncIterator[Running]:
    """The recorded fleet (upstream's node labels) under upstream's policy, rolled out."""
    for node, labels in WORKLOADS.items():
        await rest.merge_patch(NODE, node, {"metadata": {"labels": labels}})
    await rest.create(POLICY, POLICY_DOC)
    try:
        async with Running(api_client) as running:
            yield running
            await rest.delete(POLICY, "cluster-policy")

            async def clean() -> bool:
                labels = await _node_labels(rest)
                return not any(_deploy(v) for v in labels.values())

            await eventually(clean, timeout=WAIT, what="deploy labels removed")
    finally:
        for node in WORKLOADS:
            await _set_workload(rest, node, None)


async def test_a_mixed_fleet_gets_upstreams_operands_per_node(
    operator: Running, rest: Rest
) -> None:
    await eventually(
        lambda: _matches(rest, UPSTREAM_LABELS), timeout=WAIT, what="upstream's operands per node"
    )
    labels = await _node_labels(rest)
    for node, want in UPSTREAM_LABELS.items():
        assert labels[node].get("nvidia.com/mig.config") == want.get("nvidia.com/mig.config")
    await _full_pass_writes_nothing(operator)


async def _full_pass_writes_nothing(run: Running) -> None:
    """Converged: a pass over every key writes nothing."""
    await run.settle()
    before = run.rest.writes
    run.operator.queue.add("cluster")
    for name in UPSTREAM_LABELS:
        run.operator.queue.add(f"node/{name}")
    await run.settle()
    assert run.rest.writes == before, run.rest.write_counts()


async def test_switching_one_node_changes_only_that_node(
    operator: Running, rest: Rest, namespace: str
) -> None:
    await eventually(lambda: _matches(rest, UPSTREAM_LABELS), timeout=WAIT, what="rolled out")
    before_labels = await _node_labels(rest)
    before_pods = await _pods(rest)
    others = [n for n in UPSTREAM_LABELS if n != SWITCHED]
    # A container workload holding a GPU on the node: the switch must wait for it.
    gpu_pod = "cuda-job"
    await rest.create(
        POD,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": gpu_pod, "namespace": namespace},
            "spec": {
                "nodeName": SWITCHED,
                "containers": [
                    {
                        "name": "cuda",
                        "image": "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04",
                        "resources": {"limits": {"nvidia.com/gpu": "1"}},
                    }
                ],
            },
        },
        namespace,
    )
    timeline = NodeTimeline(rest, SWITCHED, gpu_pod)
    async with timeline.watching():
        await eventually(lambda: _running(timeline), what="GPU pod on the node")
        await _set_workload(rest, SWITCHED, "vm-passthrough")

        async def waits_for_gpu_pod() -> bool:
            return any(
                gpu_pod in e["message"] and e["type"] == "Warning"
                for e in await _handover_events(rest, SWITCHED)
            )

        await eventually(waits_for_gpu_pod, timeout=WAIT, what="hand-over waits for the GPU pod")
        labels = (await _node_labels(rest))[SWITCHED]
        assert VFIO_LABEL not in labels  # held while the GPU pod runs
        assert DRIVER_DS not in (await _pods(rest))[SWITCHED]  # the driver went first
        assert timeline.gpu_pod_here  # the operator removed no workload
        await rest.delete(POD, gpu_pod, namespace)  # the administrator empties the node

        kept = {k: v for k, v in before_labels[SWITCHED].items() if not k.startswith(DEPLOY_PREFIX)}
        passthrough = {**kept, **_deploy(UPSTREAM_LABELS[PASSTHROUGH])}
        await eventually(
            lambda: _matches(rest, {SWITCHED: passthrough}), timeout=WAIT, what="a VM host"
        )
        await _unchanged(rest, others, before_labels, before_pods)
        # No driver, no driver upgrade: the node leaves the upgrade machine.
        await eventually(
            lambda: _upgrade_state(rest, SWITCHED, None), what="upgrade state label removed"
        )

        await _set_workload(rest, SWITCHED, "container")
        await eventually(
            lambda: _matches(rest, {SWITCHED: before_labels[SWITCHED]}),
            timeout=WAIT,
            what="a container host again",
        )
        await _unchanged(rest, others, before_labels, before_pods)
        await eventually(
            lambda: _upgrade_state(rest, SWITCHED, before_labels[SWITCHED][STATE_LABEL]),
            what="enrolled in driver upgrades again",
        )
    assert timeline.violations == []
    await _full_pass_writes_nothing(operator)
    reasons = [e["reason"] for e in await _handover_events(rest, SWITCHED)]
    assert "GPUWorkloadHandedOver" in reasons


async def _upgrade_state(rest: Rest, node: str, state: str | None) -> bool:
    return (await _node_labels(rest))[node].get(STATE_LABEL) == state


async def _running(timeline: NodeTimeline) -> bool:
    return timeline.gpu_pod_here


async def _unchanged(
    rest: Rest,
    nodes: list[str],
    labels: dict[str, dict[str, str]],
    pods: dict[str, dict[str, str]],
) -> None:
    """The other nodes keep their deploy labels and the very same operand pods."""
    now_labels = await _node_labels(rest)
    now_pods = await _pods(rest)
    for node in nodes:
        assert _deploy(now_labels[node]) == _deploy(labels[node]), node
        assert now_pods[node] == pods[node], node


async def test_an_invalid_workload_is_one_warning_and_changes_nothing(
    operator: Running, rest: Rest
) -> None:
    await eventually(lambda: _matches(rest, UPSTREAM_LABELS), timeout=WAIT, what="rolled out")
    node = "gpu-node-0003"  # a container node; the policy's default is container too
    await operator.settle()
    writes = operator.rest.writes
    await _set_workload(rest, node, "vm-passthru")

    async def warned() -> list[dict[str, Any]]:
        return [
            e
            for e in await rest.list(EVENT, "default")
            if e["involvedObject"].get("name") == node and e["reason"] == "GPUWorkloadConfigInvalid"
        ]

    events = await eventually(warned, what="a Warning naming the node")
    assert events[0]["type"] == "Warning"
    assert node in events[0]["message"]
    assert "'vm-passthru'" in events[0]["message"]
    await operator.settle()
    # More passes over the node say nothing more and write nothing: it serves containers.
    for _ in range(3):
        operator.operator.queue.add(f"node/{node}")
        await operator.settle(quiet=0.2)
    assert len(await warned()) == 1
    assert operator.rest.writes - writes == 1, operator.rest.write_counts()  # the Event
    assert await _matches(rest, UPSTREAM_LABELS)
    await _set_workload(rest, node, None)


async def test_disabling_sandbox_workloads_removes_every_sandbox_operand_and_label(
    operator: Running, rest: Rest
) -> None:
    await eventually(lambda: _matches(rest, UPSTREAM_LABELS), timeout=WAIT, what="rolled out")
    await rest.merge_patch(
        POLICY, "cluster-policy", {"spec": {"sandboxWorkloads": {"enabled": False}}}
    )
    # Every GPU node serves containers: upstream's container node's labels, MIG aside.
    container = _deploy(UPSTREAM_LABELS["gpu-node-0003"])

    async def all_containers() -> bool | str:
        daemonsets = {d["metadata"]["name"] for d in await rest.list(DS, NAMESPACE)}
        if daemonsets & SANDBOX_DAEMONSETS:
            return False
        labels = await _node_labels(rest)
        if any(set(v) & SANDBOX_LABELS for v in labels.values()):
            return False
        want = {node: {**container, **_mig(labels[node])} for node in UPSTREAM_LABELS}
        return await _matches(rest, want)

    await eventually(all_containers, timeout=WAIT, what="no sandbox operand or label left")
    labels = await _node_labels(rest)
    for node, workload in WORKLOADS.items():  # the administrator's labels stay
        assert labels[node][WORKLOAD_CONFIG_LABEL] == workload[WORKLOAD_CONFIG_LABEL]


def _mig(labels: dict[str, str]) -> dict[str, str]:
    key = f"{DEPLOY_PREFIX}mig-manager"
    return {key: "true"} if labels.get("nvidia.com/mig.capable") == "true" else {}
