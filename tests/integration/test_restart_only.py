"""A change that leaves the installed driver alone (a probe, the driver's resources)
restarts the driver pods without emptying the nodes: no cordon, no GPU pod evicted,
the same DRIVER_CONFIG_DIGEST before and after."""

from __future__ import annotations

import asyncio
import copy
import time
import uuid
from typing import Any

import pytest
from kubernetes_asyncio import client

import crd
from gpuop.devcluster import NFD_GPU_LABEL
from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Rest
from statemachine.upgrade_keys import STATE_LABEL, UpgradeState
from tests.integration.handover import Watcher
from tests.integration.harness import NAMESPACE, NODE, POLICY, Running, eventually, policy_state_is

pytestmark = pytest.mark.integration

POD = by_kind("v1", "Pod")
NS = by_kind("v1", "Namespace")
WORKLOADS = f"gpu-work-{uuid.uuid4().hex[:6]}"


def _policy(**driver: Any) -> dict[str, Any]:
    policy = copy.deepcopy(crd.sample_policy())
    section = policy["spec"].setdefault("driver", {})
    section.update(driver)
    section["upgradePolicy"] = {
        "autoUpgrade": True,
        "maxParallelUpgrades": 0,
        "maxUnavailable": "100%",
        "drain": {"enable": True, "force": True, "timeoutSeconds": 60},
        "podDeletion": {"force": True, "timeoutSeconds": 60},
    }
    return policy


async def _driver_pods(rest: Rest) -> dict[str, dict[str, Any]]:
    pods = await rest.list(POD, NAMESPACE, label_selector="app=nvidia-driver-daemonset")
    return {
        p["spec"]["nodeName"]: p
        for p in pods
        if not p["metadata"].get("deletionTimestamp") and p["spec"].get("nodeName")
    }


def _workload(node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"train-{node}", "labels": {"app": "train"}},
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": "c", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
            ],
        },
    }


async def test_a_probe_and_resources_change_restarts_driver_pods_without_drain(
    rest: Rest, api_client: client.ApiClient
) -> None:
    await rest.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": WORKLOADS}})
    await rest.apply(_policy())
    gpu = sorted(
        n["metadata"]["name"]
        for n in await rest.list(NODE)
        if (n["metadata"].get("labels") or {}).get(NFD_GPU_LABEL) == "true"
    )
    try:
        async with Running(api_client) as run:
            await eventually(lambda: policy_state_is(rest, "ready"), timeout=90)
            await run.settle()
            before = await _driver_pods(rest)
            assert set(before) == set(gpu)
            for node in gpu:
                await rest.create(POD, _workload(node), WORKLOADS)

            async with Watcher(api_client, workload_namespace=WORKLOADS) as watcher:
                await rest.apply(
                    _policy(
                        startupProbe={"initialDelaySeconds": 30, "periodSeconds": 5},
                        resources={"requests": {"cpu": "100m", "memory": "64Mi"}},
                    )
                )

                async def all_restarted() -> bool:
                    now = await _driver_pods(rest)
                    nodes = {n["metadata"]["name"]: n for n in await rest.list(NODE)}
                    return all(
                        n in now
                        and now[n]["metadata"]["uid"] != before[n]["metadata"]["uid"]
                        and nodes[n]["metadata"]["labels"].get(STATE_LABEL)
                        == UpgradeState.UPGRADE_DONE.value
                        for n in gpu
                    )

                deadline = time.monotonic() + 180
                while not await all_restarted():
                    assert time.monotonic() < deadline, watcher.seen
                    await asyncio.sleep(0.2)
            seen = watcher.seen

            after = await _driver_pods(rest)
            for node in gpu:
                assert after[node]["spec"]["containers"][0]["resources"]["requests"]["cpu"] in (
                    "100m",
                    "0.1",
                )
                # Each node went through the restart step, never through the emptying ones.
                assert UpgradeState.POD_RESTART_REQUIRED.value in seen.upgrade_states[node]
                assert UpgradeState.CORDON_REQUIRED.value not in seen.upgrade_states[node]
                assert UpgradeState.DRAIN_REQUIRED.value not in seen.upgrade_states[node]
                # The new pod's digest is the old one's: the installed driver stays.
                assert len(seen.driver_digests[node]) >= 2, seen.driver_digests
            assert seen.cordons == []
            assert seen.workload_pods_removed == []
            assert seen.digest_changes == {}
            for node in gpu:
                assert await rest.get(POD, f"train-{node}", WORKLOADS) is not None
    finally:
        await rest.delete(NS, WORKLOADS)
        await rest.apply(crd.sample_policy())
        await rest.delete(POLICY, "cluster-policy")
