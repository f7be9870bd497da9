"""Maintenance windows on the real control plane: outside a window a changed driver
starts no node (no cordon, states stay `upgrade-required`), the window opening starts
the wave on its own timer, and a node under way when the window closes finishes.

The first node is kept under way by a job it waits for (`waitForCompletion`), so the
window closes while it is mid-upgrade whatever the machine's speed."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes_asyncio import client

import crd
from gpuop.devcluster import NFD_GPU_LABEL, ClusterInfo
from gpuop.kube.informer import Informer, Obj, ResourceSpec
from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Rest
from gpuop.operator.controller.writers.upgrade_window import CONDITION_TYPE, INVALID_EVENT
from gpuop.upgrades_cli._owners import owner_plans
from gpuop.upgrades_cli._snapshot import list_objects, snapshot
from statemachine.maintenance_window import CLOSED, INVALID, OPEN, WINDOWS_ANNOTATION
from statemachine.upgrade_keys import IN_PROGRESS_STATES, STATE_LABEL, UpgradeState
from tests.integration.harness import NAMESPACE, NODE, POLICY, Running, eventually, policy_state_is
from tests.integration.test_upgrade import _bare_pod
from tests.integration.test_upgrade_ops import _cli

pytestmark = pytest.mark.integration

EVENT_KIND = by_kind("v1", "Event")
JOB = "window-job"


def _policy(version: str, windows: str | None) -> dict[str, Any]:
    policy = copy.deepcopy(crd.sample_policy())
    if windows is not None:
        policy["metadata"].setdefault("annotations", {})[WINDOWS_ANNOTATION] = windows
    driver = policy["spec"].setdefault("driver", {})
    driver["version"] = version
    driver["upgradePolicy"] = {
        "autoUpgrade": True,
        "maxParallelUpgrades": 1,
        "maxUnavailable": "50%",
        "waitForCompletion": {"podSelector": f"app={JOB}", "timeoutSeconds": 0},
        "drain": {"enable": False},
        "podDeletion": {"timeoutSeconds": 60},
    }
    return policy


def _cron_at(when: datetime) -> str:
    """A daily cron firing at ``when``'s minute (UTC)."""
    return f"{when.minute} {when.hour} * * *"


async def _nodes(rest: Rest) -> dict[str, dict[str, Any]]:
    return {
        n["metadata"]["name"]: n
        for n in await rest.list(NODE)
        if (n["metadata"].get("labels") or {}).get(NFD_GPU_LABEL) == "true"
    }


def _state(node: dict[str, Any]) -> UpgradeState:
    return UpgradeState((node["metadata"].get("labels") or {}).get(STATE_LABEL) or "unknown")


class StartWatch:
    """Every moment a GPU node is seen in an upgrade (an in-progress state, or cordoned),
    from the node watch: a start between two looks is seen too."""

    def __init__(self, rest: Rest) -> None:
        self.starts: list[tuple[float, str, str]] = []
        self.informer = Informer(ResourceSpec("test-window-nodes", rest.lister(NODE)), self._on)

    def _on(self, event: str, old: Obj | None, new: Obj | None) -> None:
        if new is None or (new["metadata"].get("labels") or {}).get(NFD_GPU_LABEL) != "true":
            return
        state = _state(new)
        if state in IN_PROGRESS_STATES or new["spec"].get("unschedulable"):
            self.starts.append((time.monotonic(), new["metadata"]["name"], state.value))

    def since(self, moment: float, *, but: str = "") -> list[tuple[float, str, str]]:
        return [s for s in self.starts if s[0] >= moment and s[1] != but]


async def _annotate(rest: Rest, windows: str | None) -> None:
    patch = {"metadata": {"annotations": {WINDOWS_ANNOTATION: windows}}}
    await rest.merge_patch(POLICY, "cluster-policy", patch)


async def _condition(rest: Rest) -> dict[str, Any]:
    policy = await rest.get(POLICY, "cluster-policy")
    for cond in ((policy or {}).get("status") or {}).get("conditions") or []:
        if cond["type"] == CONDITION_TYPE:
            return dict(cond)
    return {}


async def test_a_driver_change_waits_for_the_window_and_a_started_node_finishes(
    rest: Rest, api_client: client.ApiClient, namespace: str, local_cluster: ClusterInfo
) -> None:
    closed = _cron_at(datetime.now(UTC) + timedelta(hours=12)) + " 1h"
    await rest.apply(_policy("595.91.07", closed))
    gpu = sorted(await _nodes(rest))
    core = client.CoreV1Api(api_client)
    # The first node to start (by name) waits for this job until the test deletes it.
    await core.create_namespaced_pod(namespace, _bare_pod(JOB, gpu[0]))
    watch = StartWatch(rest)
    watcher = asyncio.create_task(watch.informer.run())
    try:
        await watch.informer.synced.wait()
        outside = time.monotonic()  # from the driver change on, until the window opens
        async with Running(api_client) as run:
            await eventually(lambda: policy_state_is(rest, "ready"), timeout=90, what="ready")
            await run.settle()

            # Outside the window: the new driver marks every node, cordons none.
            await rest.apply(_policy("600.10.01", closed))

            async def all_queued() -> bool:
                nodes = await _nodes(rest)
                return all(_state(n) is UpgradeState.UPGRADE_REQUIRED for n in nodes.values())

            await eventually(all_queued, timeout=60, what="every node upgrade-required")
            try:
                await run.settle()  # a started node would wait for its job: never quiet
            except TimeoutError:
                states = {n: _state(node).value for n, node in (await _nodes(rest)).items()}
                raise AssertionError(f"nodes moved outside the window: {states}") from None
            nodes = await _nodes(rest)
            assert not any(n["spec"].get("unschedulable") for n in nodes.values()), nodes
            assert {_state(n) for n in nodes.values()} == {UpgradeState.UPGRADE_REQUIRED}
            cond = await _condition(rest)
            assert (cond["status"], cond["reason"]) == ("False", CLOSED), cond
            assert "next opens" in cond["message"]
            # `gpuop upgrade status` and `plan` read the same windows.
            snap = snapshot(await list_objects(rest, NAMESPACE), NAMESPACE)
            assert snap.windows[None]["state"] == CLOSED
            assert set(snap.held) == set(gpu)
            (plan,) = owner_plans(snap, proposed=False)
            assert plan.window is not None
            assert "next opens" in str(plan.window["message"])
            assert sorted(n.name for w in plan.plan.waves for n in w) == gpu
            _, text = await _cli(local_cluster, "status", capture="status-window")
            assert "maintenance window (ClusterPolicy" in text, text

            # An unreadable window holds too, and says so with a Warning Event.
            await _annotate(rest, "0 25 * * * 1h")

            async def invalid() -> dict[str, Any] | None:
                cond = await _condition(rest)
                return cond if cond.get("reason") == INVALID else None

            cond = await eventually(invalid, timeout=30, what="InvalidWindow condition")
            assert WINDOWS_ANNOTATION in cond["message"]
            events = await rest.list(EVENT_KIND)  # every namespace
            assert any(e.get("reason") == INVALID_EVENT for e in events)
            await run.settle()
            assert not any(n["spec"].get("unschedulable") for n in (await _nodes(rest)).values())

            # A window opening at the next minute boundary (at least 5s ahead): the fleet
            # pass's own timer starts the wave then; nothing starts before.
            opening = (datetime.now(UTC) + timedelta(seconds=65)).replace(second=0, microsecond=0)
            if (opening - datetime.now(UTC)).total_seconds() > 60:
                opening -= timedelta(minutes=1)
            await _annotate(rest, _cron_at(opening) + " 30m")
            while datetime.now(UTC) < opening:
                nodes = await _nodes(rest)
                started = [n for n, node in nodes.items() if _state(node) in IN_PROGRESS_STATES]
                assert not started, f"started before the window opened: {started}"
                await asyncio.sleep(0.2)

            async def first_started() -> str | None:
                nodes = await _nodes(rest)
                moving = [n for n, node in nodes.items() if _state(node) in IN_PROGRESS_STATES]
                return moving[0] if moving else None

            opened = time.monotonic()
            first = await eventually(first_started, timeout=30, what="the wave to start")
            assert first == gpu[0]
            # the watch saw no node start, not even briefly, while the window was closed
            early = [s for s in watch.since(outside) if s[0] < opened - 1.0]
            assert not early, f"started outside the window: {early}"
            assert (await _condition(rest))["reason"] == OPEN

            async def waits_for_its_job() -> bool:
                node = (await _nodes(rest))[first]
                return _state(node) is UpgradeState.WAIT_FOR_JOBS_REQUIRED

            await eventually(waits_for_its_job, timeout=30, what=f"{first} waits for its job")

            # The window closes (the annotation now names a window hours away) while the
            # first node is under way: no other node starts, and it finishes.
            await _annotate(rest, closed)

            async def closed_again() -> bool:
                return (await _condition(rest)).get("reason") == CLOSED

            # The fleet pass that wrote this held every waiting node (the first node's
            # job poll keeps the queue busy, so the test does not wait for it to settle).
            await eventually(closed_again, timeout=30, what="WindowClosed condition")
            closed_at = time.monotonic()
            nodes = await _nodes(rest)
            assert _state(nodes[first]) is UpgradeState.WAIT_FOR_JOBS_REQUIRED
            await core.delete_namespaced_pod(JOB, namespace, grace_period_seconds=0)
            deadline = time.monotonic() + 120
            while True:
                nodes = await _nodes(rest)
                others = {n: _state(node) for n, node in nodes.items() if n != first}
                cordoned = [n for n in others if nodes[n]["spec"].get("unschedulable")]
                assert not cordoned, f"started after the window closed: {cordoned}"
                if _state(nodes[first]) is UpgradeState.UPGRADE_DONE:
                    break
                assert _state(nodes[first]) is not UpgradeState.UPGRADE_FAILED, nodes[first]
                assert time.monotonic() < deadline, f"{first}: {_state(nodes[first])}"
                await asyncio.sleep(0.2)
            assert not nodes[first]["spec"].get("unschedulable")
            await run.settle()
            nodes = await _nodes(rest)
            assert _state(nodes[first]) is UpgradeState.UPGRADE_DONE
            for name in gpu:
                if name != first:
                    assert _state(nodes[name]) is UpgradeState.UPGRADE_REQUIRED, name
                    assert not nodes[name]["spec"].get("unschedulable"), name
            assert (await _condition(rest))["reason"] == CLOSED
            assert run.operator.queue.stats.failed == 0
            late = watch.since(closed_at, but=first)
            assert not late, f"started after the window closed: {late}"
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        await rest.apply(crd.sample_policy())
        await rest.delete(POLICY, "cluster-policy")
