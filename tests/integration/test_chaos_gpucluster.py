"""Chaos on GPUCluster deletion: a GPUCluster created, its claim consumers (DCGM
exporter, DRA validator) holding ResourceClaims on every GPU node, then deleted, five
times over, while the operator, its own process, is SIGKILLed at random moments of
each creation and deletion.

A watcher over every pod and node event checks:

* at each pod event, exact: a DRA kubelet plugin pod never starts terminating or goes
  while a claim holder's pod (a pod of the operator's namespace with
  ``spec.resourceClaims``, terminating ones included) is still on its node; the plugin
  unprepares those claims;
* judged against the pods at the very revision a node lost
  ``nvidia.com/gpu.deploy.dra-driver`` (the label the plugin's DaemonSet follows): no
  claim holder's pod was on the node then.

Each deletion must complete: the GPUCluster gone, and with it every claim holder, every
plugin pod and every DRA deploy label. The seed is printed (``GPUOP_CHAOS_SEED``
replays one's decisions).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import crd
from components.dra import DRA_DEPLOY_LABELS
from gpuop.devcluster import NFD_GPU_LABEL, ClusterInfo
from gpuop.kube.client import api_client as make_api_client
from gpuop.kube.kinds import KINDS
from gpuop.kube.rest import Rest
from gpuop.operator.install import ensure_namespace, install_crd
from tests.integration.chaos_support import (
    EveryEvent,
    Killer,
    chaos_seed,
    labels_of,
    marker_pod,
    node_of,
    pod_ready,
)
from tests.integration.harness import own_cluster
from tests.integration.test_chaos import NODE, OPERATOR_NS, POD, OperatorProcess
from tests.integration.test_dra_local import CLAIM
from tests.integration.test_gpucluster import CONSUMERS, DRA_DEPLOY_LABEL, GC, PLUGIN, _sample

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

GPU_NODES = 4
ROUNDS = 5
MARKER_NS = "chaos-gpucluster-marker"
HELD_TIMEOUT = 120.0
"""Creation to every claim held: a few seconds here, generous for 2 busy cores."""
KILL_SPAN = 3.0
"""Kills land in a phase's first seconds: a deletion is over in one or two here."""
DELETE_TIMEOUT = 150.0
"""Deletion to nothing left (test_gpucluster allows 120 s without kills)."""


def _holds_claims(pod: dict[str, Any]) -> bool:
    return bool((pod.get("spec") or {}).get("resourceClaims"))


def _plugin(pod: dict[str, Any]) -> bool:
    refs = pod["metadata"].get("ownerReferences") or []
    return any(r.get("kind") == "DaemonSet" and r.get("name") == PLUGIN for r in refs)


@dataclass(frozen=True)
class OnNode:
    """One node's DRA pods at one revision: live plugin pods (not terminating), plugin
    pods in all, and the claim holders' pods (terminating ones included)."""

    live_plugins: int
    plugins: int
    holders: tuple[str, ...]


@dataclass
class PluginWatch(EveryEvent):
    """The module docstring's checks; label drops are judged by :meth:`judge_drops`."""

    drops: list[tuple[str, int]] = field(default_factory=list)
    labelled: dict[str, bool] = field(default_factory=dict)
    peak_holders: int = 0

    def snapshot(self, node: str, pods: list[dict[str, Any]]) -> OnNode:
        ours = [p for p in pods if p["metadata"].get("namespace") == OPERATOR_NS]
        plugins = [p for p in ours if _plugin(p)]
        live = [p for p in plugins if not p["metadata"].get("deletionTimestamp")]
        holders = sorted(p["metadata"]["name"] for p in ours if _holds_claims(p))
        return OnNode(len(live), len(plugins), tuple(holders))

    def observe(self, stream: str, what: str, rv: int, nodes: list[str]) -> None:
        if stream == "Pod":
            for node in nodes:
                past = self.history[node]
                now = past[-1][1]
                self.peak_holders = max(self.peak_holders, len(now.holders))
                before = past[-2][1] if len(past) > 1 else now
                if now.holders and now.live_plugins < before.live_plugins:
                    self.violations.append(
                        f"{what}: the kubelet plugin on {node} leaves before {now.holders}"
                    )
            return
        for name in nodes:
            labelled = (
                labels_of(self.nodes.get(name) or {"metadata": {}}).get(DRA_DEPLOY_LABEL) == "true"
            )
            if self.labelled.get(name) and not labelled:
                self.drops.append((name, rv))
            self.labelled[name] = labelled

    def judge_drops(self) -> list[str]:
        """Each plugin label dropped while a claim holder's pod was on the node."""
        found = []
        for node, rv in self.drops:
            held = self.at(node, rv)
            if held.holders:
                found.append(f"{DRA_DEPLOY_LABEL} off {node} at rv={rv} beside {held.holders}")
        return found


@pytest.fixture(scope="module")
def gc_cluster() -> Iterator[ClusterInfo]:
    with own_cluster("-chaos-gpucluster", gpu_nodes=GPU_NODES) as info:
        yield info


@pytest.fixture(scope="module")
async def gc_rest(gc_cluster: ClusterInfo) -> AsyncIterator[Rest]:
    async with make_api_client(gc_cluster.kubeconfig, user_agent="gpuop-chaos-gc") as api:
        rest = Rest(api, KINDS)
        await install_crd(rest)
        await ensure_namespace(rest, OPERATOR_NS)
        yield rest


async def _gpu_nodes(rest: Rest) -> list[str]:
    return sorted(
        n["metadata"]["name"]
        for n in await rest.list(NODE)
        if labels_of(n).get(NFD_GPU_LABEL) == "true"
    )


async def _claims_held(rest: Rest, nodes: list[str]) -> str | None:
    """None once every GPU node runs a Ready kubelet plugin and a pod of each claim
    consumer whose claims are allocated and reserved for it; else what is missing."""
    pods = await rest.list(POD, OPERATOR_NS)
    reserved = {
        r.get("uid")
        for c in await rest.list(CLAIM, OPERATOR_NS)
        if ((c.get("status") or {}).get("allocation"))
        for r in (c.get("status") or {}).get("reservedFor") or []
    }
    missing = []
    for node in nodes:
        here = [p for p in pods if node_of(p) == node]
        if not any(_plugin(p) and pod_ready(p) for p in here):
            missing.append(f"{node}: plugin")
        for consumer in sorted(CONSUMERS):
            holding = [
                p
                for p in here
                if p["metadata"]["name"].startswith(consumer)
                and p["metadata"]["uid"] in reserved
                and pod_ready(p)
            ]
            if not holding:
                missing.append(f"{node}: {consumer}")
    return "; ".join(missing) or None


async def _left_after_delete(rest: Rest) -> str | None:
    """None once the GPUCluster, its claim holders, plugin pods and DRA labels are gone."""
    left = []
    if await rest.get(GC, crd.GC_NAME) is not None:
        left.append("the GPUCluster")
    pods = await rest.list(POD, OPERATOR_NS)
    left += [p["metadata"]["name"] for p in pods if _plugin(p) or _holds_claims(p)]
    for node in await rest.list(NODE):
        labels = labels_of(node)
        left += [f"{node['metadata']['name']}:{k}" for k in DRA_DEPLOY_LABELS if k in labels]
    return ", ".join(left) or None


async def _kill_until(
    done: Any, kill: Killer, rng: Any, kills: int, during: str, timeout: float
) -> float:
    """SIGKILLs at ``kills`` random moments of the first ``KILL_SPAN`` seconds (those
    still before ``done()`` answers None), and the wait until it does; the seconds it
    took."""
    began = time.monotonic()
    moments = sorted(rng.uniform(0.0, KILL_SPAN) for _ in range(kills))
    while (left := await done()) is not None:
        elapsed = time.monotonic() - began
        if elapsed > timeout:
            raise AssertionError(f"{during}: not done within {timeout:.0f}s; left: {left}")
        if moments and elapsed >= moments[0]:
            moments.pop(0)
            kill(during)
            continue
        await asyncio.sleep(0.1)
    return round(time.monotonic() - began, 1)


async def test_sigkilled_operator_deletes_gpuclusters_with_the_plugin_outliving_claims(
    gc_cluster: ClusterInfo, gc_rest: Rest, tmp_path: Path
) -> None:
    rest = gc_rest
    seed, rng = chaos_seed()
    nodes = await _gpu_nodes(rest)
    assert len(nodes) == GPU_NODES
    operator = OperatorProcess(gc_cluster.kubeconfig, tmp_path)
    kill = Killer(operator)
    watcher = PluginWatch(rest)
    watching = asyncio.create_task(watcher.run())
    marker = await marker_pod(rest, MARKER_NS, "cpu-node-0000")
    try:
        await watcher.catch_up(rest, marker, nodes[0])
        operator.start()
        seconds: list[tuple[float, ...]] = []  # (creation, deletion) per round
        for round_ in range(1, ROUNDS + 1):
            await rest.apply(_sample())

            async def held() -> str | None:
                if watching.done():
                    watching.result()
                return await _claims_held(rest, nodes)

            during = f"round {round_} creation"
            took = [await _kill_until(held, kill, rng, rng.randint(1, 2), during, HELD_TIMEOUT)]
            await asyncio.sleep(rng.uniform(0.0, 2.0))
            await rest.delete(GC, crd.GC_NAME)

            async def gone() -> str | None:
                if watching.done():
                    watching.result()
                return await _left_after_delete(rest)

            during = f"round {round_} deletion"
            took.append(
                await _kill_until(gone, kill, rng, rng.randint(1, 3), during, DELETE_TIMEOUT)
            )
            seconds.append(tuple(took))
        kill.alive()

        await watcher.catch_up(rest, marker, nodes[0])
        watcher.violations.extend(watcher.judge_drops())
        if watcher.violations:
            raise AssertionError(
                f"seed {seed}, kills {kill.kills}; {len(watcher.violations)} violations, "
                "first:\n" + "\n".join(watcher.violations[:8])
            )
        assert len(watcher.drops) == ROUNDS * GPU_NODES, watcher.drops
        assert watcher.peak_holders >= len(CONSUMERS), watcher.peak_holders
        print(
            f"chaos (GPUCluster): seed {seed}, {ROUNDS} rounds (creation, deletion seconds "
            f"{seconds}), kills {kill.kills}, "
            f"{len(watcher.drops)} plugin label drops judged, "
            f"{watcher.observations} observations"
        )
    except BaseException:
        print(f"chaos seed {seed}: kills {kill.kills}\n{operator.tail()}")
        raise
    finally:
        operator.stop()
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await watching
        with contextlib.suppress(Exception):
            await rest.delete(GC, crd.GC_NAME)
