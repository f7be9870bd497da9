"""A GPUCluster against the real control plane: it renders upstream's DRA stack, a
ClusterPolicy beside it is a conflict on both sides, and deleting it removes the
claim-holding DaemonSets (foreground) before the DRA kubelet plugin, watched event by
event."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client

import crd
from components import RenderContext
from components.dra import KINDS, STATE_LABEL, render
from gpuop.devcluster._cluster import publish_dra
from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Rest
from gpuop.operator.controller.passes.gpucluster import ADMIN_ACCESS_LABEL, FINALIZER
from tests.integration.harness import NAMESPACE, NODE, POLICY, Running, eventually, watch_from

pytestmark = pytest.mark.integration

GC = by_kind(crd.GC_API_VERSION, crd.GC_KIND)
DS = by_kind("apps/v1", "DaemonSet")
SAMPLE = Path(__file__).parents[1] / "conformance/upstream/gpucluster-default/policy.yaml"
PLUGIN = "nvidia-dra-driver-kubelet-plugin"
CONSUMERS = {"nvidia-dcgm-exporter-dra", "nvidia-dra-validator"}
DRA_DEPLOY_LABEL = "nvidia.com/gpu.deploy.dra-driver"


def _sample() -> dict[str, Any]:
    return dict(yaml.safe_load(SAMPLE.read_text()))


def _wanted() -> set[tuple[str, str]]:
    spec = crd.parse_gpucluster(_sample()).spec
    ctx = RenderContext(namespace=NAMESPACE, operator_image="unused")
    return {(o["kind"], o["metadata"]["name"]) for s in render(spec, ctx).values() for o in s}


async def _present(rest: Rest) -> set[tuple[str, str]]:
    found = set()
    for kind in KINDS:
        k = by_kind(kind.api_version, kind.kind)
        if kind.optional and not await rest.api_resource_exists(kind.api_version, kind.plural):
            continue  # the Prometheus Operator's ServiceMonitor, where it is not installed
        for obj in await rest.list(k, NAMESPACE if kind.namespaced else None):
            if STATE_LABEL in (obj["metadata"].get("labels") or {}):
                found.add((kind.kind, obj["metadata"]["name"]))
    return found


async def _condition(rest: Rest, kind: Any, name: str, type_: str) -> dict[str, Any]:
    got = await rest.get(kind, name) or {}
    conditions = (got.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == type_), {})


async def _gone(rest: Rest, kind: Any, name: str) -> bool:
    return await rest.get(kind, name) is None


class DaemonSetOrder:
    """For each DaemonSet, the index of the first event showing it being deleted (a
    deletionTimestamp, or DELETED), in the order the API server sent them; and whether
    it was deleted with foreground propagation."""

    def __init__(self) -> None:
        self.count = 0
        self.first_deleting: dict[str, int] = {}
        self.deleted: dict[str, int] = {}
        self.deleted_at: dict[str, float] = {}
        self.foreground: set[str] = set()

    async def run(self, rest: Rest) -> None:
        call = rest.lister(DS, NAMESPACE)
        resp = await call()
        assert resp.status == 200, await resp.read()
        rv = json.loads(await resp.read())["metadata"]["resourceVersion"]
        async for event, obj in watch_from(call, rv, "daemonsets"):
            name = obj["metadata"]["name"]
            self.count += 1
            meta = obj["metadata"]
            if "foregroundDeletion" in (meta.get("finalizers") or []):
                self.foreground.add(name)
            if event == "DELETED":
                self.deleted.setdefault(name, self.count)
                self.deleted_at.setdefault(name, time.monotonic())
            if event == "DELETED" or meta.get("deletionTimestamp"):
                self.first_deleting.setdefault(name, self.count)


class PluginLabelDrops:
    """When (monotonic) each node first lost the label the DRA kubelet plugin's pods
    follow."""

    def __init__(self) -> None:
        self.dropped_at: dict[str, float] = {}

    async def run(self, rest: Rest) -> None:
        call = rest.lister(NODE)
        resp = await call()
        assert resp.status == 200, await resp.read()
        rv = json.loads(await resp.read())["metadata"]["resourceVersion"]
        async for _event, obj in watch_from(call, rv, "nodes"):
            labels = obj["metadata"].get("labels") or {}
            if labels.get(DRA_DEPLOY_LABEL) != "true":
                self.dropped_at.setdefault(obj["metadata"]["name"], time.monotonic())


async def _delete_policies(rest: Rest) -> None:
    for existing in await rest.list(POLICY):
        await rest.delete(POLICY, existing["metadata"]["name"])
    assert await eventually(lambda: _no_policy(rest), timeout=60, what="no ClusterPolicy")


async def _no_policy(rest: Rest) -> bool:
    return not await rest.list(POLICY)


async def test_gpucluster_renders_conflicts_and_tears_down_in_order(
    rest: Rest, api_client: client.ApiClient
) -> None:
    await _delete_policies(rest)
    wanted = _wanted()
    order = DaemonSetOrder()
    drops = PluginLabelDrops()
    watcher: asyncio.Task[None] | None = None
    label_watcher: asyncio.Task[None] | None = None
    try:
        async with Running(api_client) as running:
            await rest.apply(_sample())

            # 1. The stack: every object upstream's states render, and nothing else.
            async def rendered() -> bool:
                return await _present(rest) == wanted

            assert await eventually(rendered, timeout=90, what="the DRA stack")
            stored = await rest.get(GC, crd.GC_NAME)
            assert stored is not None
            assert FINALIZER in stored["metadata"]["finalizers"]
            ns = await rest.get(by_kind("v1", "Namespace"), NAMESPACE)
            assert ns is not None
            assert ns["metadata"]["labels"][ADMIN_ACCESS_LABEL] == "true"
            gpu_nodes_now = [
                n
                for n in await rest.list(NODE)
                if n["metadata"]["labels"].get("nvidia.com/gpu.present") == "true"
            ]
            gpu_names = [n["metadata"]["name"] for n in gpu_nodes_now]
            gpu_labels = [n["metadata"]["labels"] for n in gpu_nodes_now]
            assert gpu_labels
            assert all(lab.get(DRA_DEPLOY_LABEL) == "true" for lab in gpu_labels)
            assert (await rest.get(GC, crd.GC_NAME) or {}).get("status", {}).get("namespace") == (
                NAMESPACE
            )
            # Upstream's sample asks for nothing gpuop ignores.
            assert not await _condition(rest, GC, crd.GC_NAME, crd.CONDITION_UNSUPPORTED_FIELDS)

            # 2. A pass over an unchanged cluster writes nothing.
            await running.settle()
            before = running.rest.write_counts()
            await running.operator.gpuclusters.reconcile()
            assert running.rest.write_counts() == before

            # 3. A ClusterPolicy beside it: the conflict on both objects, as upstream.
            await rest.apply(crd.sample_policy())

            async def conflict() -> bool:
                mine = await _condition(rest, GC, crd.GC_NAME, "Error")
                theirs = await _condition(rest, POLICY, "cluster-policy", "Error")
                return (
                    mine.get("status") == "True"
                    and mine.get("reason") == crd.REASON_PREREQUISITE_NOT_MET
                    and theirs.get("status") == "True"
                    and "GPUCluster" in theirs.get("message", "")
                )

            assert await eventually(conflict, timeout=60, what="the conflict conditions")
            state = ((await rest.get(GC, crd.GC_NAME) or {}).get("status") or {}).get("state")
            assert state == "notReady"
            await _delete_policies(rest)

            async def conflict_over() -> bool:
                mine = await _condition(rest, GC, crd.GC_NAME, "Error")
                return mine.get("reason") != crd.REASON_PREREQUISITE_NOT_MET

            assert await eventually(conflict_over, timeout=60, what="the conflict cleared")
            assert await _present(rest) == wanted

            # 4. Delete: the claim consumers go first (foreground), the plugin after.
            watcher = asyncio.create_task(order.run(rest))
            label_watcher = asyncio.create_task(drops.run(rest))
            await asyncio.sleep(0.5)  # the watches are open before the delete
            await rest.delete(GC, crd.GC_NAME)

            async def all_gone() -> bool:
                return await _gone(rest, GC, crd.GC_NAME) and not await _present(rest)

            assert await eventually(all_gone, timeout=120, what="the stack deleted")
            assert await eventually(
                lambda: _settled(order), timeout=30, what="every DaemonSet's DELETED event"
            )
    finally:
        for task in (watcher, label_watcher):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        with contextlib.suppress(Exception):
            await rest.delete(GC, crd.GC_NAME)
        await publish_dra(api_client)  # the simulator's DeviceClass went with ours

    assert order.foreground >= CONSUMERS, order.foreground
    plugin_starts = order.first_deleting[PLUGIN]
    for consumer in CONSUMERS:
        assert order.deleted[consumer] < plugin_starts, (consumer, order.deleted, plugin_starts)
    # The kubelet plugin stays on every GPU node until every claim holder is gone: its
    # label goes only once the finalizer is released, never at the deletionTimestamp.
    consumers_gone = max(order.deleted_at[c] for c in CONSUMERS)
    assert set(gpu_names) <= set(drops.dropped_at), (gpu_names, drops.dropped_at)
    early = {
        n: consumers_gone - t
        for n, t in drops.dropped_at.items()
        if n in gpu_names and t < consumers_gone
    }
    assert not early, f"plugin label dropped before the claim holders were gone: {early}"


async def _settled(order: DaemonSetOrder) -> bool:
    return {PLUGIN, *CONSUMERS} <= set(order.deleted)
