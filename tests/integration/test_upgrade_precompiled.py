"""Precompiled drivers upgrade on the real control plane: one driver DaemonSet per
kernel, each node upgraded onto its own kernel's DaemonSet's new revision, the fleet
within one budget and behind one canary, and `gpuop upgrade plan|status` showing every
pool."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import pytest
from kubernetes_asyncio import client, watch

from components.context import KERNEL_LABEL
from gpuop.devcluster import NFD_GPU_LABEL, ClusterInfo
from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Rest
from statemachine.rollout_gate import RECORD_ANNOTATION, GateRecord
from statemachine.upgrade_keys import IN_PROGRESS_STATES, STATE_LABEL, UpgradeState
from tests.integration.harness import NAMESPACE, NODE, POLICY, Running, eventually, policy_state_is
from tests.integration.test_upgrade import _gpu_nodes, _policy
from tests.integration.test_upgrade_ops import _cli

pytestmark = pytest.mark.integration

POD = by_kind("v1", "Pod")
DAEMONSET = by_kind("apps/v1", "DaemonSet")
KERNELS = ("5.15.0-124-generic", "6.8.0-45-generic")
POOLS = tuple(f"nvidia-driver-daemonset-{k}-ubuntu22.04" for k in KERNELS)
MAX_PARALLEL = 2
MAX_UNAVAILABLE = 2  # 50% of the 4 GPU nodes


def _precompiled(version: str) -> dict[str, Any]:
    """A precompiled driver whose upgrades go through the gate: one canary node first."""
    policy = _policy(
        version,
        max_parallel=MAX_PARALLEL,
        max_unavailable="50%",
        canary={"nodes": 1, "soakSeconds": 0},
        haltAfterFailures=1,
    )
    policy["spec"]["driver"]["usePrecompiled"] = True
    return policy


async def _driver_pods(rest: Rest) -> dict[str, tuple[str, str]]:
    """Node -> (DaemonSet, revision hash) of its live precompiled driver pod."""
    pods = await rest.list(POD, NAMESPACE, label_selector="nvidia.com/precompiled=true")
    return {
        p["spec"]["nodeName"]: (
            p["metadata"]["labels"]["app"],
            p["metadata"]["labels"]["controller-revision-hash"],
        )
        for p in pods
        if not p["metadata"].get("deletionTimestamp") and p["spec"].get("nodeName")
    }


class BudgetWatch:
    """Counts, at every node event, the GPU nodes upgrading and those unavailable
    (cordoned or upgrading), keeping the peaks and every state seen."""

    def __init__(self, api: client.ApiClient) -> None:
        self.core = client.CoreV1Api(api)
        self.nodes: dict[str, dict[str, Any]] = {}
        self.peak_in_progress = 0
        self.peak_unavailable = 0
        self.states: set[str] = set()
        self.events = 0
        self.first_busy: dict[str, int] = {}
        self.done_after_busy: dict[str, int] = {}
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> BudgetWatch:
        listed = await self.core.list_node()
        for node in listed.items:
            self._count(self.core.api_client.sanitize_for_serialization(node))
        version = listed.metadata.resource_version
        self._task = asyncio.create_task(self._watch(version))
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _watch(self, version: str) -> None:
        while True:
            async with watch.Watch().stream(
                self.core.list_node, resource_version=version, timeout_seconds=300
            ) as events:
                async for event in events:
                    raw = event["raw_object"]
                    version = raw["metadata"].get("resourceVersion", version)
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self.events += 1
                        self._count(raw)

    def _count(self, node: dict[str, Any]) -> None:
        node_labels = node["metadata"].get("labels") or {}
        if node_labels.get(NFD_GPU_LABEL) != "true":
            return
        self.nodes[node["metadata"]["name"]] = node
        in_progress = unavailable = 0
        for name, n in self.nodes.items():
            state = UpgradeState((n["metadata"].get("labels") or {}).get(STATE_LABEL) or "unknown")
            self.states.add(state.value)
            upgrading = state in IN_PROGRESS_STATES
            if upgrading:
                self.first_busy.setdefault(name, self.events)
            elif state is UpgradeState.UPGRADE_DONE and name in self.first_busy:
                self.done_after_busy.setdefault(name, self.events)
            in_progress += upgrading
            unavailable += upgrading or bool((n.get("spec") or {}).get("unschedulable"))
        self.peak_in_progress = max(self.peak_in_progress, in_progress)
        self.peak_unavailable = max(self.peak_unavailable, unavailable)


async def test_precompiled_version_change_upgrades_each_kernel_pool_within_budget(
    rest: Rest, api_client: client.ApiClient, local_cluster: ClusterInfo
) -> None:
    gpu = sorted(n["metadata"]["name"] for n in await _gpu_nodes(rest))
    assert len(gpu) == 4
    pool_of = {name: POOLS[i // 2] for i, name in enumerate(gpu)}  # two nodes per kernel
    original = {
        n["metadata"]["name"]: n["metadata"]["labels"].get(KERNEL_LABEL)
        for n in await _gpu_nodes(rest)
    }
    for i, name in enumerate(gpu):
        labels = {KERNEL_LABEL: KERNELS[i // 2]}
        await rest.merge_patch(NODE, name, {"metadata": {"labels": labels}})
    await rest.apply(_precompiled("595"))
    try:
        async with Running(api_client) as run:
            await eventually(lambda: policy_state_is(rest, "ready"), timeout=120, what="ready")
            await run.settle()
            names = {
                d["metadata"]["name"]
                for d in await rest.list(DAEMONSET, NAMESPACE)
                if d["metadata"]["name"].startswith("nvidia-driver-daemonset")
            }
            assert names == set(POOLS)
            before = await _driver_pods(rest)
            assert {n: app for n, (app, _) in before.items()} == pool_of

            # The plan for a new version names every node of both pools.
            code, text = await _cli(
                local_cluster, "plan", "--set", "driver.version='600'", "-o", "json"
            )
            plan = json.loads(text)
            assert sorted(n for wave in plan["waves"] for n in wave) == gpu, plan
            assert all(len(wave) <= MAX_PARALLEL for wave in plan["waves"]), plan

            async with BudgetWatch(api_client) as seen:
                await rest.apply(_precompiled("600"))

                async def upgraded() -> bool:
                    nodes = {n["metadata"]["name"]: n for n in await _gpu_nodes(rest)}
                    if any(
                        nodes[n]["metadata"]["labels"].get(STATE_LABEL) != "upgrade-done"
                        for n in gpu
                    ):
                        return False
                    now = await _driver_pods(rest)
                    return all(n in now and now[n][1] != before[n][1] for n in gpu)

                await eventually(upgraded, timeout=240, what="every node of both pools upgraded")
            assert seen.events > 0
            assert 1 <= seen.peak_in_progress <= MAX_PARALLEL, seen.peak_in_progress
            assert seen.peak_unavailable <= MAX_UNAVAILABLE, seen.peak_unavailable
            assert "upgrade-failed" not in seen.states
            # The canary (one node, of either pool) upgraded before any other started.
            policy = await rest.get(POLICY, "cluster-policy")
            assert policy is not None
            record = GateRecord.loads(policy["metadata"]["annotations"][RECORD_ANNOTATION])
            assert record is not None
            assert len(record.canary) == 1
            assert not record.halted
            (canary,) = record.canary
            others = [n for n in gpu if n != canary]
            assert all(seen.done_after_busy[canary] < seen.first_busy[n] for n in others)

            after = await _driver_pods(rest)
            assert {n: app for n, (app, _) in after.items()} == pool_of
            revisions = {app: rev for app, rev in after.values()}
            assert len(revisions) == 2  # one new revision per pool

            code, text = await _cli(local_cluster, "status", "-o", "json")
            assert code == 0, text
            rows = {r["node"]: r for r in json.loads(text)["nodes"]}
            for name in gpu:
                assert rows[name]["state"] == "upgrade-done"
                assert rows[name]["current"] == rows[name]["target"] == after[name][1], rows

            # A node boots a new kernel (NFD relabels it): its kernel's DaemonSet is
            # made, the node follows it, and its upgrade state stays done.
            moved, kernel = gpu[0], "6.11.0-9-generic"
            await rest.merge_patch(NODE, moved, {"metadata": {"labels": {KERNEL_LABEL: kernel}}})

            async def on_its_new_kernel() -> bool:
                app = (await _driver_pods(rest)).get(moved, ("", ""))[0]
                return app == f"nvidia-driver-daemonset-{kernel}-ubuntu22.04"

            await eventually(on_its_new_kernel, timeout=60, what="the node on its new kernel")
            await run.settle()
            node = await rest.get(NODE, moved)
            assert node is not None
            assert node["metadata"]["labels"].get(STATE_LABEL) == "upgrade-done"
            assert not node["spec"].get("unschedulable")
            assert run.operator.queue.stats.failed == 0
    finally:
        await rest.delete(POLICY, "cluster-policy")
        for name, kernel in original.items():
            await rest.merge_patch(NODE, name, {"metadata": {"labels": {KERNEL_LABEL: kernel}}})
