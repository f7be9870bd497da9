"""Upgrade operations on the real control plane: `gpuop upgrade status|plan` (the real CLI,
run as a process), canary then the rest, halt after a failure (surviving an operator
restart), and a pod-only change restarting driver pods without evicting anything.

With GPUOP_CAPTURE_DIR set, the CLI outputs are also written there (docs/upgrades.md quotes them).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from gpuop.devcluster import ClusterInfo
from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Rest
from statemachine.rollout_gate import RECORD_ANNOTATION, GateRecord
from statemachine.upgrade_keys import IN_PROGRESS_STATES, UpgradeState
from tests.integration.harness import NAMESPACE, NODE, POLICY, Running, eventually, policy_state_is
from tests.integration.test_upgrade import (
    _bare_pod,
    _driver_hashes,
    _events,
    _gpu_nodes,
    _now,
    _policy,
    _state,
)

pytestmark = pytest.mark.integration

POD = by_kind("v1", "Pod")
PDB = by_kind("policy/v1", "PodDisruptionBudget")


async def _cli(info: ClusterInfo, *args: str, capture: str = "") -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gpuop",
        "--log-level",
        "error",
        "upgrade",
        *args,
        "--kubeconfig",
        str(info.kubeconfig),
        "-n",
        NAMESPACE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    assert proc.returncode in (0, 1), err.decode()
    text = out.decode()
    folder = os.environ.get("GPUOP_CAPTURE_DIR")
    if folder and capture:
        _capture(Path(folder) / f"{capture}.txt", f"$ gpuop upgrade {' '.join(args)}\n{text}")
    return proc.returncode, text


def _capture(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


async def _states(rest: Rest, names: list[str]) -> dict[str, str]:
    return {n: await _state(rest, n) for n in names}


async def _gpu(rest: Rest) -> list[str]:
    return sorted(n["metadata"]["name"] for n in await _gpu_nodes(rest))


async def _gate_condition(rest: Rest) -> dict[str, Any]:
    policy = await rest.get(POLICY, "cluster-policy")
    for cond in ((policy or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == "DriverUpgradeGate":
            return dict(cond)
    return {}


async def test_status_shows_a_real_upgrade_and_its_budget(
    rest: Rest, api_client: client.ApiClient, namespace: str, local_cluster: ClusterInfo
) -> None:
    core = client.CoreV1Api(api_client)
    wait = {"podSelector": "app=job", "timeoutSeconds": 0}
    base = {"max_parallel": 1, "max_unavailable": "100%", "drain": {"enable": False}}
    await rest.apply(_policy("595.91.07", waitForCompletion=wait, **base))  # type: ignore[arg-type]
    gpu = await _gpu(rest)
    async with Running(api_client) as run:
        await eventually(lambda: policy_state_is(rest, "ready"), timeout=90, what="ready")
        await run.settle()
        before = await _driver_hashes(rest)
        job = _bare_pod("job", gpu[0])
        job["metadata"]["labels"] = {"app": "job"}
        await core.create_namespaced_pod(namespace, job)
        await rest.apply(_policy("600.10.01", waitForCompletion=wait, **base))  # type: ignore[arg-type]

        async def waiting() -> bool:
            return await _state(rest, gpu[0]) == "wait-for-jobs-required"

        await eventually(waiting, timeout=60, what="first node waits for its job")
        code, text = await _cli(local_cluster, "status", "-o", "json")
        assert code == 0
        report = json.loads(text)
        rows = {r["node"]: r for r in report["nodes"]}
        assert rows[gpu[0]]["state"] == "wait-for-jobs-required"
        assert rows[gpu[0]]["current"] == before[gpu[0]]
        assert rows[gpu[0]]["target"] != before[gpu[0]]
        assert "app=job" in rows[gpu[0]]["waits_for"]
        assert report["budget"]["inProgress"] == 1
        assert report["budget"]["maxParallelUpgrades"] == 1
        assert report["totals"]["wait-for-jobs-required"] == 1
        code, text = await _cli(local_cluster, "status", "-o", "wide", capture="status-wide")
        assert f"{gpu[0]}  wait-for-jobs-required" in text
        assert "budget: in progress 1/1" in text

        await core.delete_namespaced_pod("job", namespace, grace_period_seconds=0)

        async def all_done() -> bool:
            return set((await _states(rest, gpu)).values()) == {"upgrade-done"}

        await eventually(all_done, timeout=180, what="all nodes upgraded")
        code, text = await _cli(local_cluster, "status", capture="status-done")
        assert code == 0
        assert f"totals: upgrade-done {len(gpu)}" in text
    await rest.delete(POLICY, "cluster-policy")


async def test_plan_names_a_zero_disruption_pdb_and_an_empty_dir_pod(
    rest: Rest, api_client: client.ApiClient, namespace: str, local_cluster: ClusterInfo
) -> None:
    core = client.CoreV1Api(api_client)
    drain = {"enable": True, "force": True, "timeoutSeconds": 60}
    await rest.apply(_policy("595.91.07", drain=drain))
    gpu = await _gpu(rest)
    async with Running(api_client) as run:
        await eventually(lambda: policy_state_is(rest, "ready"), timeout=90, what="ready")
        await run.settle()
        await core.create_namespaced_pod(namespace, _bare_pod("web", gpu[1]))
        await core.create_namespaced_pod(namespace, _bare_pod("scratch", gpu[2], empty_dir=True))
        await rest.create(
            PDB,
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": "web-pdb", "namespace": namespace},
                "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}},
            },
            namespace,
        )

        async def pdb_counted() -> bool:
            pdb = await rest.get(PDB, "web-pdb", namespace)
            status = (pdb or {}).get("status") or {}
            return status.get("currentHealthy") == 1 and status.get("disruptionsAllowed") == 0

        await eventually(pdb_counted, timeout=60, what="PDB status")
        await run.settle()
        policy_before = await rest.get(POLICY, "cluster-policy")
        writes = run.rest.writes
        code, text = await _cli(
            local_cluster, "plan", "--set", "driver.version=600.10.01", capture="plan"
        )
        assert code == 0, text
        assert f"{gpu[1]}: PDB {namespace}/web-pdb allows 0 disruptions: {namespace}/web" in text
        assert f"{gpu[2]}: drain refuses {namespace}/scratch: uses emptyDir" in text
        assert "wave 1:" in text
        assert "duration: at most" in text
        # Nothing written: not by the CLI, and the operator had nothing to react to.
        await run.settle()
        policy_after = await rest.get(POLICY, "cluster-policy")
        assert policy_before is not None
        assert policy_after is not None
        assert (
            policy_after["metadata"]["resourceVersion"]
            == (policy_before["metadata"]["resourceVersion"])
        )
        assert run.rest.writes == writes
        assert set((await _states(rest, gpu)).values()) <= {"upgrade-done", ""}
    for name in ("web", "scratch"):
        await core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    await rest.delete(PDB, "web-pdb", namespace)
    await rest.delete(POLICY, "cluster-policy")


async def test_canary_of_two_nodes_then_the_rest(
    rest: Rest, api_client: client.ApiClient, local_cluster: ClusterInfo
) -> None:
    canary = {"nodes": 2, "soakSeconds": 3}
    base: dict[str, Any] = {"max_parallel": 0, "max_unavailable": "100%"}
    await rest.apply(_policy("595.91.07", canary=canary, drain={"enable": False}, **base))  # type: ignore[arg-type]
    gpu = await _gpu(rest)
    assert len(gpu) >= 4
    async with Running(api_client) as run:
        await eventually(lambda: policy_state_is(rest, "ready"), timeout=90, what="ready")
        await run.settle()
        before = await _driver_hashes(rest)
        since = _now()
        await rest.apply(_policy("600.10.01", canary=canary, drain={"enable": False}, **base))  # type: ignore[arg-type]
        started: list[str] = []
        done_before_others: set[str] = set()
        deadline = asyncio.get_running_loop().time() + 240
        while True:
            states = await _states(rest, gpu)
            assert asyncio.get_running_loop().time() < deadline, (started, states)
            # A node counts as started once seen in progress or with a new driver pod: on
            # a busy machine a node can go through every state between two polls.
            hashes = await _driver_hashes(rest)
            for name, state in states.items():
                moving = UpgradeState(state or "unknown") in IN_PROGRESS_STATES
                moved = hashes.get(name, before[name]) != before[name]
                if (moving or moved) and name not in started:
                    if len(started) >= 2:
                        # A node beyond the canary starts only after both canaries are done.
                        assert done_before_others >= set(started[:2]), states
                    started.append(name)
            if len(started) < 3:
                done_before_others = {n for n in started if states[n] == "upgrade-done"}
            assert "upgrade-failed" not in states.values(), states
            if set(states.values()) == {"upgrade-done"} and len(started) == len(gpu):
                break
            await asyncio.sleep(0.1)
        policy = await rest.get(POLICY, "cluster-policy")
        assert policy is not None
        record = GateRecord.loads(policy["metadata"]["annotations"][RECORD_ANNOTATION])
        assert record is not None
        assert set(record.canary) == set(started[:2])
        assert record.validated_at is not None
        cond = await _gate_condition(rest)
        assert cond["reason"] == "Proceeding"
        assert cond["status"] == "False"
        for reason in ("DriverUpgradeCanaryStarted", "DriverUpgradeCanaryValidated"):
            assert "cluster-policy" in await _events(rest, reason, since), reason
        assert run.operator.metrics.upgrade_canary._value.get() == 0
        # Converged: another pass writes nothing.
        await run.settle()
        writes = run.rest.writes
        run.operator.queue.add("upgrades")
        await run.settle()
        assert run.rest.writes == writes, run.rest.write_counts()
    await rest.delete(POLICY, "cluster-policy")


async def test_halt_after_one_failure_survives_a_restart_and_resumes_by_annotation(
    rest: Rest, api_client: client.ApiClient, local_cluster: ClusterInfo
) -> None:
    """A new driver pod that never gets Ready (here: a taint it does not tolerate keeps
    it from being created, as in test_upgrade) fails the first node; no other starts."""
    base: dict[str, Any] = {"max_parallel": 1, "max_unavailable": "100%"}
    extra: dict[str, Any] = {"haltAfterFailures": 1, "drain": {"enable": False}}
    await rest.apply(_policy("595.91.07", **base, **extra))
    gpu = await _gpu(rest)
    blocked = {"key": "gpuop.io/test-no-new-pods", "value": "x", "effect": "NoSchedule"}
    taints: dict[str, list[Any]] = {}
    try:
        async with Running(api_client) as run:
            run.operator.upgrades.driver_ready_timeout_seconds = 10
            await eventually(lambda: policy_state_is(rest, "ready"), timeout=90, what="ready")
            await run.settle()
            for name in gpu:
                node = await rest.get(NODE, name)
                assert node is not None
                taints[name] = node["spec"].get("taints") or []
                await rest.merge_patch(NODE, name, {"spec": {"taints": [*taints[name], blocked]}})
            since = _now()
            await rest.apply(_policy("600.10.01", **base, **extra))

            async def halted() -> bool:
                return (await _gate_condition(rest)).get("reason") == "Halted"

            await eventually(halted, timeout=90, what="halted")
            await run.settle()
            states = await _states(rest, gpu)
            failed = [n for n, s in states.items() if s == "upgrade-failed"]
            assert len(failed) == 1, states
            others = [s for n, s in states.items() if n not in failed]
            assert set(others) == {"upgrade-required"}, states
            assert run.operator.metrics.upgrade_halted._value.get() == 1
            assert "cluster-policy" in await _events(rest, "DriverUpgradeHalted", since)
            code, text = await _cli(local_cluster, "status", "-o", "wide", capture="status-halted")
            assert code == 1
            assert f"FAILED: {failed[0]}" in text
            assert "rollout gate: halted" in text
        # A restarted operator stays halted: the record is on the ClusterPolicy.
        async with Running(api_client) as run:
            run.operator.upgrades.driver_ready_timeout_seconds = 10
            await run.settle()
            assert await halted()
            states = await _states(rest, gpu)
            assert [n for n, s in states.items() if s == "upgrade-failed"] == failed
            assert sum(1 for s in states.values() if s == "upgrade-required") == len(gpu) - 1
            # The cause is fixed and the administrator resumes: the rest of the fleet goes on.
            for name in gpu:
                await rest.merge_patch(NODE, name, {"spec": {"taints": taints[name] or None}})
            await rest.merge_patch(
                POLICY,
                "cluster-policy",
                {"metadata": {"annotations": {"gpuop.io/driver-upgrade-resume": "true"}}},
            )

            async def all_done() -> bool:
                return set((await _states(rest, gpu)).values()) == {"upgrade-done"}

            await eventually(all_done, timeout=240, what="all nodes upgraded after the resume")
            policy = await rest.get(POLICY, "cluster-policy")
            assert policy is not None
            assert "gpuop.io/driver-upgrade-resume" not in policy["metadata"]["annotations"]
            cond = await _gate_condition(rest)
            assert cond.get("reason") in ("Proceeding", "Idle"), cond  # Idle: nothing left to do
            assert cond.get("status") == "False"
            assert "cluster-policy" in await _events(rest, "DriverUpgradeResumed", since)
    finally:
        # A failure above must not leave the nodes tainted for the tests after this one.
        for name, before in taints.items():
            await rest.merge_patch(NODE, name, {"spec": {"taints": before or None}})
    await rest.delete(POLICY, "cluster-policy")


async def test_a_pod_only_change_restarts_driver_pods_and_evicts_nothing(
    rest: Rest, api_client: client.ApiClient, namespace: str, local_cluster: ClusterInfo
) -> None:
    core = client.CoreV1Api(api_client)
    removal = {"force": True, "deleteEmptyDir": True, "timeoutSeconds": 60}
    sections: dict[str, Any] = {"drain": {**removal, "enable": True}, "podDeletion": removal}
    base: dict[str, Any] = {"max_parallel": 0, "max_unavailable": "100%"}
    policy = _policy("595.91.07", **base, **sections)
    await rest.apply(policy)
    gpu = await _gpu(rest)
    async with Running(api_client) as run:
        await eventually(lambda: policy_state_is(rest, "ready"), timeout=90, what="ready")
        await run.settle()
        before = await _driver_hashes(rest)
        # Everything a full upgrade would remove: a GPU pod with emptyDir, flags allowing it.
        trainer = await core.create_namespaced_pod(
            namespace, _bare_pod("trainer", gpu[0], gpu=True, empty_dir=True)
        )
        since = _now()
        policy["spec"].setdefault("daemonsets", {})["annotations"] = {"example.com/touch": "1"}
        await rest.apply(policy)
        seen: dict[str, set[str]] = {n: set() for n in gpu}
        deadline = asyncio.get_running_loop().time() + 240
        while True:
            states = await _states(rest, gpu)
            assert asyncio.get_running_loop().time() < deadline, seen
            for name, state in states.items():
                seen[name].add(state)
            hashes = await _driver_hashes(rest)
            moved = all(hashes.get(n, before[n]) != before[n] for n in gpu)
            if moved and set(states.values()) == {"upgrade-done"}:
                break
            assert "upgrade-failed" not in states.values(), states
            await asyncio.sleep(0.1)
        restarted = {n for n, s in seen.items() if "pod-restart-required" in s}
        assert restarted, seen
        for name in gpu:
            assert not seen[name] & {"drain-required", "pod-deletion-required"}, seen[name]
        still = await rest.get(POD, "trainer", namespace)
        assert still is not None
        assert still["metadata"]["uid"] == trainer.metadata.uid
        assert not still["metadata"].get("deletionTimestamp")
        assert not await _events(rest, "DriverUpgradeFailed", since)
        nodes = {n["metadata"]["name"]: n for n in await rest.list(NODE)}
        assert not any(nodes[n]["spec"].get("unschedulable") for n in gpu)
    await core.delete_namespaced_pod("trainer", namespace, grace_period_seconds=0)
    await rest.delete(POLICY, "cluster-policy")
