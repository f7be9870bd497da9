"""Upgrade slots have one owner: the fleet pass, and a slot is the node's persisted state.

The fleet pass (``Upgrades.grant``) moves the nodes the budget selects from
``upgrade-required`` to ``cordon-required`` with one merge patch each, guarded by the
node's resourceVersion; node passes (their upgrade step,
``statemachine.node_plan.plan_upgrade``) never start a node. Nothing about slots lives
in memory, so two fleet passes, a node pass racing a fleet pass, or
a restarted operator can never have more nodes in progress than the budget allows
(an in-memory grant set once let three start under a limit of two).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any, cast

import pytest
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import CollectorRegistry

from components.driver import DAEMONSET_NAME as DRIVER_DS
from gpuop.kube.informer import Informer, ResourceSpec, key_of
from gpuop.operator.controller.passes.node import read_live
from gpuop.operator.controller.views.node_views import trim_node
from gpuop.operator.controller.views.pod_records import pod_index, trim_pod
from gpuop.operator.controller.writers.node_write import NodeWriter
from gpuop.operator.controller.writers.upgrade import Upgrades
from gpuop.operator.events import EventRecorder
from gpuop.operator.metrics import OperatorMetrics
from statemachine import Decision, UpgradePolicyView
from statemachine.node_plan import NodePlan, NodeSnapshot, plan_upgrade, upgrade_reads
from statemachine.upgrade_keys import IN_PROGRESS_STATES, STATE_LABEL, UpgradeState
from tests.factories import operand_pod

Obj = dict[str, Any]
LIMIT = 2
POLICY = UpgradePolicyView(auto_upgrade=True, max_parallel_upgrades=LIMIT, max_unavailable="100%")


async def _never(**_: Any) -> None:
    raise AssertionError("not called")


def _in_progress(nodes: dict[str, Obj]) -> int:
    return sum(
        1
        for n in nodes.values()
        if UpgradeState(n["metadata"]["labels"].get(STATE_LABEL) or "unknown") in IN_PROGRESS_STATES
    )


class _Server:
    """Nodes as the API server holds them: merge patches with resourceVersion
    preconditions (409 on a stale one), optionally held until released one by one.
    Checks the budget after every write, as the chaos test does at every watch event."""

    def __init__(self, names: list[str], state: str = "upgrade-required") -> None:
        self.nodes = {name: _node(name, state) for name in names}
        self.gate: asyncio.Semaphore | None = None
        self.patches: list[tuple[str, Obj]] = []
        self.conflicts = 0
        self.peak = 0
        self.limit = LIMIT

    async def merge_patch(self, kind: Any, name: str, patch: Obj, **_: Any) -> Obj:
        if self.gate is not None:
            await self.gate.acquire()
        await asyncio.sleep(0)
        node = self.nodes[name]
        meta = node["metadata"]
        pmeta = patch.get("metadata") or {}
        if "resourceVersion" in pmeta and pmeta["resourceVersion"] != meta["resourceVersion"]:
            self.conflicts += 1
            raise ApiException(status=409, reason="Conflict")
        self.patches.append((name, patch))
        labels = {**meta["labels"], **(pmeta.get("labels") or {})}
        annotations = {**meta["annotations"], **(pmeta.get("annotations") or {})}
        spec = {**node["spec"], **(patch.get("spec") or {})}
        updated = {
            "metadata": {
                **meta,
                "labels": {k: v for k, v in labels.items() if v is not None},
                "annotations": {k: v for k, v in annotations.items() if v is not None},
                "resourceVersion": str(int(meta["resourceVersion"]) + 1),
            },
            "spec": {k: v for k, v in spec.items() if v is not None},
            "status": node["status"],
        }
        self.nodes[name] = updated
        self.peak = max(self.peak, _in_progress(self.nodes))
        assert _in_progress(self.nodes) <= self.limit, self.nodes
        return updated

    async def list(self, *_: Any, **__: Any) -> list[Obj]:
        return []

    async def create(self, *_: Any, **__: Any) -> Obj:
        return {}

    async def delete(self, *_: Any, **__: Any) -> None:
        return None


def _node(name: str, state: str) -> Obj:
    return {
        "metadata": {
            "name": name,
            "resourceVersion": "1",
            "labels": {
                "nvidia.com/gpu.present": "true",
                "feature.node.kubernetes.io/pci-10de.present": "true",
                STATE_LABEL: state,
            },
            "annotations": {},
        },
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def _driver_pod(node: str, revision: str = "old") -> Obj:
    return operand_pod(DRIVER_DS, node, revision, uid=f"uid-{node}", container="driver")


def _operator(server: _Server) -> tuple[Upgrades, Informer, OperatorMetrics]:
    """A fresh ``Upgrades`` (no memory) whose caches were just listed from the server."""
    nodes = Informer(ResourceSpec("nodes", _never, transform=trim_node), lambda *_: None)
    pods = Informer(
        ResourceSpec("pods", _never, transform=trim_pod, index=pod_index), lambda *_: None
    )
    for name, raw in server.nodes.items():
        node = trim_node(raw)
        nodes._put(key_of(node), node)
        pod = trim_pod(_driver_pod(name))
        pods._put(key_of(pod), pod)
    empty = Informer(ResourceSpec("x", _never), lambda *_: None)
    metrics = OperatorMetrics(CollectorRegistry())
    upgrades = Upgrades(
        server,  # type: ignore[arg-type]
        metrics,
        EventRecorder(server),  # type: ignore[arg-type]
        "gpu-operator",
        pods=pods,
        revisions=empty,
        daemonsets=empty,
        nodes=nodes,
    )
    upgrades.newest_driver_revision = lambda app=DRIVER_DS: "new"  # type: ignore[method-assign]
    return upgrades, nodes, metrics


async def node_step(
    upgrades: Upgrades, node: Obj, policy: UpgradePolicyView, newest: str | None
) -> Decision:
    """A node pass's upgrade step under ``policy`` with ``newest`` the driver's newest
    revision: the node pass's read, :func:`statemachine.node_plan.plan_upgrade` and its
    write. Returns the step's decision (a 409 leaves the node as it was: the writer
    then answers with ``step.on_conflict``)."""
    name = node["metadata"]["name"]
    driver, resting, refused = upgrades.node_facts(name, DRIVER_DS)
    snap = NodeSnapshot(
        name,
        node,
        now=time.time(),
        namespace=upgrades.namespace,
        driver=replace(driver, newest_revision=newest),
        resting=resting,
        refused=refused,
        ready_timeout=upgrades.driver_ready_timeout_seconds,
    )
    live = await read_live(name, upgrade_reads(snap, policy), upgrades.emptying, None)
    step = plan_upgrade(replace(snap, live=live), policy)
    writer = NodeWriter(
        rest=upgrades.rest,
        nodes=upgrades._nodes,
        upgrades=upgrades,
        workloads=cast(Any, None),
    )
    await writer.write(NodePlan(name, node, upgrade=step))
    return step.decision


def _states(server: _Server) -> dict[str, str]:
    return {n: o["metadata"]["labels"].get(STATE_LABEL, "") for n, o in server.nodes.items()}


async def test_a_grant_is_one_guarded_patch_that_persists_the_slot_and_cordons() -> None:
    server = _Server(["n0", "n1", "n2"])
    upgrades, nodes, metrics = _operator(server)

    started, conflict = await upgrades.grant(nodes.values(), POLICY)

    assert started == ["n0", "n1"]
    assert not conflict
    assert [name for name, _ in server.patches] == ["n0", "n1"]  # one write per start
    for name, patch in server.patches:
        assert patch["metadata"]["labels"] == {STATE_LABEL: "cordon-required"}
        assert patch["metadata"]["resourceVersion"] == "1"  # guarded by what was read
        assert patch["spec"] == {"unschedulable": True}  # cordoned in the same patch
        assert nodes.get(name)["metadata"]["labels"][STATE_LABEL] == "cordon-required"  # type: ignore[index]
    assert _states(server)["n2"] == "upgrade-required"
    assert metrics.upgrades_available._value.get() == 0  # type: ignore[attr-defined]


async def test_a_node_pass_never_starts_an_upgrade() -> None:
    server = _Server(["n0"])
    upgrades, nodes, _ = _operator(server)

    decision = await node_step(upgrades, nodes.get("n0") or {}, POLICY, "new")

    assert decision.target is UpgradeState.UPGRADE_REQUIRED
    assert decision.reason == "waiting for an upgrade slot"
    assert _states(server) == {"n0": "upgrade-required"}
    assert not any("spec" in patch for _, patch in server.patches)


async def test_a_node_pass_carries_a_granted_node_on() -> None:
    server = _Server(["n0"])
    upgrades, nodes, _ = _operator(server)
    await upgrades.grant(nodes.values(), POLICY)

    decision = await node_step(upgrades, nodes.get("n0") or {}, POLICY, "new")

    assert decision.current is UpgradeState.CORDON_REQUIRED
    assert decision.target is UpgradeState.POD_RESTART_REQUIRED  # nothing to empty
    assert len(server.patches) == 2  # the grant, then this step: as before, no extra write


async def test_two_concurrent_fleet_passes_never_exceed_the_limit() -> None:
    server = _Server([f"n{i}" for i in range(5)])
    server.gate = asyncio.Semaphore(0)
    first, first_nodes, _ = _operator(server)
    second, second_nodes, _ = _operator(server)  # another process, its own cache

    passes = [
        asyncio.create_task(first.grant(first_nodes.values(), POLICY)),
        asyncio.create_task(second.grant(second_nodes.values(), POLICY)),
    ]
    while not all(p.done() for p in passes):
        server.gate.release()  # let the writes land one at a time, interleaved
        await asyncio.sleep(0)
    results = [p.result() for p in passes]

    assert server.peak == LIMIT
    assert sum(len(started) for started, _ in results) == LIMIT
    assert server.conflicts == LIMIT
    assert any(conflict for _, conflict in results)


async def test_node_passes_racing_fleet_passes_never_exceed_the_limit() -> None:
    names = [f"n{i}" for i in range(6)]
    server = _Server(names)
    server.gate = asyncio.Semaphore(0)
    upgrades, nodes, _ = _operator(server)
    for _ in range(6):
        work = [asyncio.create_task(upgrades.grant(nodes.values(), POLICY))]
        work += [
            asyncio.create_task(node_step(upgrades, nodes.get(n) or {}, POLICY, "new"))
            for n in names
        ]
        while not all(w.done() for w in work):
            server.gate.release()
            await asyncio.sleep(0)
        for w in work:
            w.result()
    assert server.peak == LIMIT
    assert _in_progress(server.nodes) == LIMIT  # the slots are still taken: nothing freed them


async def test_a_restarted_operator_grants_nothing_beyond_the_limit() -> None:
    server = _Server(["n0", "n1", "n2", "n3"])
    before, before_nodes, _ = _operator(server)
    assert len((await before.grant(before_nodes.values(), POLICY))[0]) == LIMIT

    after, after_nodes, metrics = _operator(server)  # restarted: memory gone, caches relisted
    started, _ = await after.grant(after_nodes.values(), POLICY)

    assert started == []
    assert _in_progress(server.nodes) == LIMIT
    assert metrics.upgrades_in_progress._value.get() == LIMIT  # type: ignore[attr-defined]
    assert metrics.upgrades_available._value.get() == 0  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("policy", "in_progress", "available"),
    [
        # maxParallelUpgrades 3, one in progress, two start now: none left.
        (UpgradePolicyView(True, 3, "100%"), 1, 0),
        # no parallel limit, maxUnavailable 5 of 6 nodes: 1 in progress + 3 starting.
        (UpgradePolicyView(True, 0, 5), 1, 1),
        # maxParallelUpgrades 5, maxUnavailable 50% (3 of 6), 2 in progress: one starts.
        (UpgradePolicyView(True, 5, "50%"), 2, 0),
    ],
)
async def test_nodes_upgrades_available_counts_free_slots(
    policy: UpgradePolicyView, in_progress: int, available: int
) -> None:
    """Upstream's `gpu_operator_nodes_upgrades_available`: how many more may start now,
    not how many this pass started."""
    names = [f"n{i}" for i in range(6)]
    server = _Server(names)
    server.limit = len(names)
    for name in names[:in_progress]:
        server.nodes[name]["metadata"]["labels"][STATE_LABEL] = "drain-required"
        server.nodes[name]["spec"]["unschedulable"] = True
    for name in names[in_progress + 3 :]:
        server.nodes[name]["metadata"]["labels"][STATE_LABEL] = "upgrade-done"
    upgrades, nodes, metrics = _operator(server)

    await upgrades.grant(nodes.values(), policy)

    assert metrics.upgrades_available._value.get() == available  # type: ignore[attr-defined]
    # Free means free: a fleet pass over the new states starts exactly that many.
    for name in names[in_progress + 3 :]:
        server.nodes[name]["metadata"]["labels"][STATE_LABEL] = "upgrade-required"
    again, again_nodes, _ = _operator(server)
    assert len((await again.grant(again_nodes.values(), policy))[0]) == available
