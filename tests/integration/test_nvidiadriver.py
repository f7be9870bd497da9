"""NVIDIADriver resources against the real control plane: owner labels, one driver
DaemonSet per resource and pool on exactly its nodes, conflicts, CEL rules, and the
hand-over between the ClusterPolicy's driver and the resources, watched pod by pod."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

import crd
from gpuop.informer import Informer, Obj, ResourceSpec
from gpuop.rest import Rest, by_kind
from tests.conftest import TEST_GPU_NODES
from tests.integration.harness import NAMESPACE, NODE, POLICY, Running, eventually, policy_state_is

pytestmark = pytest.mark.integration

DS = by_kind("apps/v1", "DaemonSet")
POD = by_kind("v1", "Pod")
NVD = by_kind("nvidia.com/v1alpha1", "NVIDIADriver")
PRODUCT = "nvidia.com/gpu.product"
H100 = "NVIDIA-H100-80GB-HBM3"
POLICY_DS = "nvidia-driver-daemonset"


def _nvd(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "NVIDIADriver",
        "metadata": {"name": name},
        "spec": spec,
    }


class DriverPodWatch:
    """Every driver pod event, and the most driver pods one node ever had at once
    (terminating ones count: they still run on the node)."""

    def __init__(self, rest: Rest) -> None:
        self.on_node: dict[str, str] = {}
        self.most = 0
        self.crowded: list[dict[str, str]] = []
        self.apps_seen: set[str] = set()
        self.informer = Informer(
            ResourceSpec(
                "test-driver-pods",
                rest.lister(POD, NAMESPACE),
                label_selector="app.kubernetes.io/component=nvidia-driver",
            ),
            self._on_pod,
        )

    def _on_pod(self, event: str, old: Obj | None, new: Obj | None) -> None:
        pod = new or old
        assert pod is not None
        name = pod["metadata"]["name"]
        node = (pod.get("spec") or {}).get("nodeName")
        if event == "DELETED":
            self.on_node.pop(name, None)
        elif node:
            self.on_node[name] = node
            self.apps_seen.add(pod["metadata"]["labels"]["app"])
        counts = Counter(self.on_node.values())
        most = max(counts.values(), default=0)
        if most > 1:
            self.crowded.append(dict(self.on_node))
        self.most = max(self.most, most)


async def _labels(rest: Rest) -> dict[str, dict[str, str]]:
    return {n["metadata"]["name"]: n["metadata"].get("labels", {}) for n in await rest.list(NODE)}


async def _gpu_nodes(rest: Rest) -> dict[str, dict[str, str]]:
    return {
        name: labels
        for name, labels in (await _labels(rest)).items()
        if labels.get("nvidia.com/gpu.present") == "true"
    }


async def _driver_pods_by_ds(rest: Rest) -> dict[str, set[str]]:
    pods = await rest.list(
        POD, NAMESPACE, label_selector="app.kubernetes.io/component=nvidia-driver"
    )
    result: dict[str, set[str]] = {}
    for pod in pods:
        if pod["metadata"].get("deletionTimestamp") or not pod["spec"].get("nodeName"):
            continue
        owner = pod["metadata"]["ownerReferences"][0]["name"]
        result.setdefault(owner, set()).add(pod["spec"]["nodeName"])
    return result


async def _nvd_state(rest: Rest, name: str) -> tuple[str | None, str | None]:
    got = await rest.get(NVD, name) or {}
    status = got.get("status") or {}
    error = [c for c in status.get("conditions") or [] if c["type"] == "Error"]
    return status.get("state"), (
        error[0]["reason"] if error and error[0]["status"] == "True" else None
    )


async def _use_crd(rest: Rest, on: bool) -> None:
    await rest.merge_patch(
        POLICY, "cluster-policy", {"spec": {"driver": {"useNvidiaDriverCRD": on}}}
    )


async def _cleanup(rest: Rest) -> None:
    for existing in await rest.list(NVD):
        await rest.delete(NVD, existing["metadata"]["name"])
    for name, labels in (await _labels(rest)).items():
        if crd.OWNER_LABEL in labels:
            await rest.merge_patch(NODE, name, {"metadata": {"labels": {crd.OWNER_LABEL: None}}})


async def test_resources_own_their_nodes_and_hand_over_exclusively(
    rest: Rest, api_client: client.ApiClient
) -> None:
    await _cleanup(rest)
    await rest.apply(crd.sample_policy())
    watch = DriverPodWatch(rest)
    watcher = asyncio.create_task(watch.informer.run())
    try:
        async with Running(api_client):
            assert await eventually(lambda: policy_state_is(rest, "ready"), timeout=120)
            gpu = await _gpu_nodes(rest)
            assert len(gpu) == TEST_GPU_NODES
            h100 = {n for n, lab in gpu.items() if lab.get(PRODUCT) == H100}
            others = set(gpu) - h100
            assert h100
            assert others

            await rest.apply(_nvd("default", default=True, version="580.95.05"))
            await rest.apply(_nvd("h100", nodeSelector={PRODUCT: H100}, version="590.48.01"))

            async def disabled() -> bool:
                states = [await _nvd_state(rest, n) for n in ("default", "h100")]
                return all(s == "disabled" for s, _ in states)

            assert await eventually(disabled, timeout=60)
            assert not any(crd.OWNER_LABEL in lab for lab in (await _labels(rest)).values())

            # Switch on: the ClusterPolicy's driver leaves, the resources take over.
            await _use_crd(rest, True)

            async def resources_drive() -> dict[str, set[str]] | None:
                by_ds = await _driver_pods_by_ds(rest)
                ready = [await _nvd_state(rest, n) for n in ("default", "h100")]
                if POLICY_DS in by_ds or len(by_ds) != 2 or ready != [("ready", None)] * 2:
                    return None
                return by_ds

            by_ds = await eventually(resources_drive, timeout=120)
            daemonsets = {d["metadata"]["name"]: d for d in await rest.list(DS, NAMESPACE)}
            owner_of = {
                name: daemonsets[name]["metadata"]["ownerReferences"][0]["name"] for name in by_ds
            }
            nodes_of = {owner_of[name]: nodes for name, nodes in by_ds.items()}
            assert nodes_of == {"h100": h100, "default": others}
            for name in by_ds:
                ds = daemonsets[name]
                assert name.startswith("nvidia-gpu-driver-ubuntu22.04-")
                assert ds["spec"]["updateStrategy"]["type"] == "OnDelete"
                assert (
                    ds["spec"]["template"]["spec"]["nodeSelector"][crd.OWNER_LABEL]
                    == (owner_of[name])
                )
            labels = await _labels(rest)
            owners = {n: labels[n].get(crd.OWNER_LABEL) for n in gpu}
            assert owners == {n: ("h100" if n in h100 else "default") for n in gpu}
            assert all(crd.OWNER_LABEL not in lab for n, lab in labels.items() if n not in gpu)
            assert await eventually(lambda: policy_state_is(rest, "ready"), timeout=60)

            # A third resource overlapping the H100 one: nothing moves, both say why.
            await rest.apply(_nvd("overlap", nodeSelector={"nvidia.com/gpu.present": "true"}))

            async def conflicting() -> bool:
                states = [await _nvd_state(rest, n) for n in ("h100", "overlap")]
                return states == [("notReady", crd.REASON_CONFLICTING_NODE_SELECTOR)] * 2

            assert await eventually(conflicting, timeout=60)
            labels = await _labels(rest)
            assert {n: labels[n].get(crd.OWNER_LABEL) for n in gpu} == owners
            assert await _driver_pods_by_ds(rest) == by_ds
            await rest.delete(NVD, "overlap")

            async def h100_ready() -> bool:
                return await _nvd_state(rest, "h100") == ("ready", None)

            assert await eventually(h100_ready, timeout=60)

            # Switch off: the resources give their nodes back to the ClusterPolicy.
            await _use_crd(rest, False)

            async def policy_drives() -> bool:
                by_ds = await _driver_pods_by_ds(rest)
                states = [await _nvd_state(rest, n) for n in ("default", "h100")]
                return (
                    set(by_ds) == {POLICY_DS}
                    and by_ds[POLICY_DS] == set(gpu)
                    and all(s == "disabled" for s, _ in states)
                )

            assert await eventually(policy_drives, timeout=120)
            labels = await _labels(rest)
            assert not any(crd.OWNER_LABEL in lab for lab in labels.values())
            assert await eventually(lambda: policy_state_is(rest, "ready"), timeout=60)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        await _cleanup(rest)
    # Both drivers really ran, and never two on one node at any observed moment.
    assert POLICY_DS in watch.apps_seen
    assert len(watch.apps_seen) == 3
    assert watch.most == 1, watch.crowded[:3]


async def test_api_server_enforces_the_cel_rules(rest: Rest) -> None:
    await _cleanup(rest)
    try:
        with pytest.raises(ApiException) as err:
            await rest.apply(_nvd("bad-default", default=True, nodeSelector={PRODUCT: H100}))
        assert "default NVIDIADriver must not use nodeSelector" in str(err.value)
        with pytest.raises(ApiException) as err:
            await rest.apply(_nvd("bad-owner", nodeSelector={crd.OWNER_LABEL: "x"}))
        assert "reserved label" in str(err.value)
        await rest.apply(_nvd("typed", driverType="gpu", usePrecompiled=False))
        for field, value in (("driverType", "vgpu"), ("usePrecompiled", True)):
            with pytest.raises(ApiException) as err:
                await rest.merge_patch(NVD, "typed", {"spec": {field: value}})
            assert "immutable" in str(err.value)
    finally:
        await _cleanup(rest)
