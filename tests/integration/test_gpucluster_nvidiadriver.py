"""Drivers under a GPUCluster, as upstream runs them: with no ClusterPolicy, NVIDIADriver
resources install the drivers the DRA stack's kubelet plugin waits for, upgrade them node
by node under their own upgradePolicy (validated by the DRA validator's pods), and a
GPU claim is allocated once the upgrade is done."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client

import crd
from gpuop.devcluster._cluster import publish_dra
from gpuop.kube.informer import Informer, Obj, ResourceSpec
from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Rest
from statemachine.upgrade_keys import IN_PROGRESS_STATES, STATE_LABEL, UpgradeState
from tests.integration.harness import NAMESPACE, NODE, POLICY, Running, eventually
from tests.integration.test_dra_local import CLAIM, _claim_spec, _pod
from tests.integration.test_gpucluster import SAMPLE

pytestmark = pytest.mark.integration

GC = by_kind(crd.GC_API_VERSION, crd.GC_KIND)
NVD = by_kind("nvidia.com/v1alpha1", "NVIDIADriver")
POD = by_kind("v1", "Pod")
SA = by_kind("v1", "ServiceAccount")
DRIVER_PODS = "app.kubernetes.io/component=nvidia-driver"
VALIDATOR_PODS = "app.kubernetes.io/name=nvidia-dra-validator"
OLD, NEW = "580.95.05", "580.105.08"


class UpgradeWatch:
    """Every state each node passed through, the most nodes in an upgrade slot at once,
    and any node seen cordoned while not in an upgrade (nobody else cordons here)."""

    def __init__(self, rest: Rest) -> None:
        self.labels: dict[str, dict[str, str]] = {}
        self.states: dict[str, list[str]] = {}
        self.peak = 0
        self.stray_cordons: list[str] = []
        self.informer = Informer(ResourceSpec("test-gc-nodes", rest.lister(NODE)), self._on_node)

    def _on_node(self, event: str, old: Obj | None, new: Obj | None) -> None:
        node = new or old
        assert node is not None
        name = node["metadata"]["name"]
        labels = node["metadata"].get("labels") or {}
        self.labels[name] = labels
        state = labels.get(STATE_LABEL, "")
        seen = self.states.setdefault(name, [])
        if not seen or seen[-1] != state:
            seen.append(state)
        busy = Counter(
            UpgradeState(lab.get(STATE_LABEL) or "unknown") in IN_PROGRESS_STATES
            for lab in self.labels.values()
        )
        self.peak = max(self.peak, busy[True])
        upgrading = UpgradeState(state or "unknown") in IN_PROGRESS_STATES
        if (node.get("spec") or {}).get("unschedulable") and not upgrading:
            self.stray_cordons.append(f"{name}:{state}")


def _nvd(version: str) -> dict[str, Any]:
    return {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "NVIDIADriver",
        "metadata": {"name": "default"},
        "spec": {
            "default": True,
            "version": version,
            "upgradePolicy": {
                "autoUpgrade": True,
                "maxParallelUpgrades": 1,
                "maxUnavailable": "100%",
            },
        },
    }


async def _driver_pods(rest: Rest) -> dict[str, tuple[str, str]]:
    """node -> (pod uid, driver image) of the live driver pods."""
    pods = await rest.list(POD, NAMESPACE, label_selector=DRIVER_PODS)
    return {
        p["spec"]["nodeName"]: (p["metadata"]["uid"], p["spec"]["containers"][0]["image"])
        for p in pods
        if not p["metadata"].get("deletionTimestamp") and p["spec"].get("nodeName")
    }


async def _gpu_nodes(rest: Rest) -> set[str]:
    return {
        n["metadata"]["name"]
        for n in await rest.list(NODE)
        if (n["metadata"].get("labels") or {}).get("nvidia.com/gpu.present") == "true"
    }


async def _validators_ready(rest: Rest) -> set[str]:
    pods = await rest.list(POD, NAMESPACE, label_selector=VALIDATOR_PODS)
    return {
        p["spec"]["nodeName"]
        for p in pods
        if p["spec"].get("nodeName")
        and any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in (p.get("status") or {}).get("conditions") or []
        )
    }


async def _validator_label(rest: Rest, node: str, value: str) -> None:
    patch = {"metadata": {"labels": {"nvidia.com/gpu.deploy.dra-validator": value}}}
    await rest.merge_patch(NODE, node, patch)


async def _nvd_state(rest: Rest) -> str | None:
    got = await rest.get(NVD, "default") or {}
    return (got.get("status") or {}).get("state")


async def _cleanup(rest: Rest, api_client: client.ApiClient) -> None:
    with contextlib.suppress(Exception):
        await rest.delete(NVD, "default")
    with contextlib.suppress(Exception):
        await rest.delete(GC, crd.GC_NAME)

    async def gone() -> bool:
        return await rest.get(GC, crd.GC_NAME) is None and await rest.get(NVD, "default") is None

    await eventually(gone, timeout=120, what="the GPUCluster and NVIDIADriver gone")
    for node in await rest.list(NODE):
        labels = node["metadata"].get("labels") or {}
        held = labels.get("nvidia.com/gpu.deploy.dra-validator") == "false"
        if crd.OWNER_LABEL in labels or STATE_LABEL in labels or held:
            patch = {crd.OWNER_LABEL: None, STATE_LABEL: None}
            if held:
                patch["nvidia.com/gpu.deploy.dra-validator"] = None
            await rest.merge_patch(NODE, node["metadata"]["name"], {"metadata": {"labels": patch}})
    await publish_dra(api_client)  # the simulator's DeviceClass went with ours


async def test_nvidiadriver_beside_a_gpucluster_installs_upgrades_and_serves_claims(
    rest: Rest, api_client: client.ApiClient, namespace: str
) -> None:
    for existing in await rest.list(POLICY):
        await rest.delete(POLICY, existing["metadata"]["name"])
    assert await eventually(lambda: _no_policy(rest), timeout=60, what="no ClusterPolicy")
    watch = UpgradeWatch(rest)
    watcher = asyncio.create_task(watch.informer.run())
    try:
        await rest.apply(yaml.safe_load(SAMPLE.read_text()))
        await rest.apply(_nvd(OLD))
        async with Running(api_client):
            try:
                before, after, gpu = await _scenario(rest, namespace, watch)
            finally:
                await _stop(watcher)  # what the scenario saw, not the clean-up
                # with the operator still running: the GPUCluster's finalizer is ours
                await _cleanup(rest, api_client)
    finally:
        await _stop(watcher)

    assert watch.peak == 1, watch.states
    for name in gpu:
        assert after[name][0] != before[name][0], name
        states = watch.states[name]
        for step in ("cordon-required", "pod-restart-required"):
            assert step in states, (name, states)
        assert states[-1] == "upgrade-done", (name, states)
    held = sorted(gpu)[0]
    # the held node's validation waited for its DRA validator pod, then passed
    assert "validation-required" in watch.states[held], watch.states[held]
    assert not watch.stray_cordons, watch.stray_cordons


Pods = dict[str, tuple[str, str]]


async def _scenario(rest: Rest, namespace: str, watch: UpgradeWatch) -> tuple[Pods, Pods, set[str]]:

    # 1. Drivers: one NVIDIADriver pod per GPU node, run as the driver account
    #    applied beside the GPUCluster, and the DRA validator Ready on each.
    async def installed() -> dict[str, tuple[str, str]] | None:
        nodes = await _gpu_nodes(rest)
        pods = await _driver_pods(rest)
        ok = (
            nodes
            and set(pods) == nodes
            and all(image.endswith(f":{OLD}-ubuntu22.04") for _, image in pods.values())
            and await _nvd_state(rest) == "ready"
            and await _validators_ready(rest) >= nodes
        )
        return pods if ok else None

    before = await eventually(installed, timeout=180, what="drivers installed")
    gpu = set(before)
    account = await rest.get(SA, "nvidia-driver", NAMESPACE)
    assert account is not None
    (ref,) = account["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["name"]) == (crd.GC_KIND, crd.GC_NAME)
    for name in gpu:
        node = await rest.get(NODE, name)
        assert node is not None
        annotations = node["metadata"].get("annotations") or {}
        # the driver manager leaves cordon and drain to our upgrade machine
        assert annotations.get("nvidia.com/gpu-driver-upgrade-enabled") == "true"

    # 2. A new version: node by node (maxParallelUpgrades 1), each validated by the DRA
    #    validator's pods. On one node the administrator holds the validator off
    #    (`false` is never overwritten): that node's upgrade waits in validation.
    held = sorted(gpu)[0]
    await _validator_label(rest, held, "false")

    async def validator_gone() -> bool:
        return held not in await _validators_ready(rest)

    assert await eventually(validator_gone, timeout=60, what=f"no validator on {held}")
    await rest.merge_patch(NVD, "default", {"spec": {"version": NEW}})

    async def waits_for_validation() -> bool:
        return watch.labels.get(held, {}).get(STATE_LABEL) == "validation-required"

    assert await eventually(waits_for_validation, timeout=240, what=f"{held} in validation")
    await _validator_label(rest, held, "true")

    async def upgraded() -> dict[str, tuple[str, str]] | None:
        pods = await _driver_pods(rest)
        done = all(
            n in pods
            and pods[n][1].endswith(f":{NEW}-ubuntu22.04")
            and watch.labels.get(n, {}).get(STATE_LABEL) == "upgrade-done"
            for n in gpu
        )
        return pods if done else None

    after = await eventually(upgraded, timeout=300, what="every node upgraded")
    for name in gpu:
        node = await rest.get(NODE, name)
        assert node is not None
        assert not node["spec"].get("unschedulable"), name

    # 3. After the upgrade a GPU claim is allocated and its pod runs.
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-gpu"},
        "spec": {"spec": _claim_spec("true")},
    }
    await rest.create(by_kind("resource.k8s.io/v1", "ResourceClaimTemplate"), template, namespace)
    await rest.create(POD, _pod("trainer", {"resourceClaimTemplateName": "one-gpu"}), namespace)

    async def running() -> dict[str, Any] | None:
        pod = await rest.get(POD, "trainer", namespace)
        ok = pod and pod["spec"].get("nodeName") and pod["status"].get("phase") == "Running"
        return pod if ok else None

    pod = await eventually(running, timeout=90, what="the claiming pod runs")
    (status,) = pod["status"]["resourceClaimStatuses"]
    claim = await rest.get(CLAIM, status["resourceClaimName"], namespace)
    assert claim is not None
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["pool"] == pod["spec"]["nodeName"]
    return before, after, gpu


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _no_policy(rest: Rest) -> bool:
    return not await rest.list(POLICY)
