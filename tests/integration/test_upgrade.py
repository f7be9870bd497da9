"""Driver upgrades on the real control plane: a driver change rolls node by node
through cordon, drain, restart, validation and uncordon within the budget."""

from __future__ import annotations

import asyncio
import copy
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes_asyncio import client

import crd
from gpuop.cluster import NFD_GPU_LABEL
from gpuop.rest import Rest, by_kind
from statemachine.upgrade_keys import (
    IN_PROGRESS_STATES,
    INITIAL_UNSCHEDULABLE_ANNOTATION,
    SKIP_LABEL,
    STATE_LABEL,
    UpgradeState,
)
from tests.integration.harness import NAMESPACE, NODE, POLICY, Running, eventually, policy_state_is

pytestmark = pytest.mark.integration

POD = by_kind("v1", "Pod")
WORKLOADS = f"gpu-workloads-{uuid.uuid4().hex[:6]}"


def _policy(
    version: str, max_parallel: int = 2, max_unavailable: int | str = "50%"
) -> dict[str, Any]:
    policy = copy.deepcopy(crd.sample_policy())
    driver = policy["spec"].setdefault("driver", {})
    driver["version"] = version
    driver["upgradePolicy"] = {
        "autoUpgrade": True,
        "maxParallelUpgrades": max_parallel,
        "maxUnavailable": max_unavailable,
        "drain": {"enable": True, "timeoutSeconds": 60},
        "podDeletion": {"timeoutSeconds": 60},
    }
    return policy


async def _gpu_nodes(rest: Rest) -> list[dict[str, Any]]:
    return [
        n
        for n in await rest.list(NODE)
        if (n["metadata"].get("labels") or {}).get(NFD_GPU_LABEL) == "true"
    ]


async def _driver_hashes(rest: Rest) -> dict[str, str]:
    pods = await rest.list(POD, NAMESPACE, label_selector="app=nvidia-driver-daemonset")
    return {
        p["spec"]["nodeName"]: p["metadata"]["labels"]["controller-revision-hash"]
        for p in pods
        # A replacement pod not yet bound to its node has no nodeName.
        if not p["metadata"].get("deletionTimestamp") and p["spec"].get("nodeName")
    }


async def test_driver_version_change_upgrades_every_node_within_budget(
    rest: Rest, api_client: client.ApiClient
) -> None:
    core = client.CoreV1Api(api_client)
    await rest.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": WORKLOADS}})
    await rest.apply(_policy("595.91.07"))
    gpu = sorted(n["metadata"]["name"] for n in await _gpu_nodes(rest))
    cordoned_by_admin = gpu[-1]
    skipped = gpu[-2]
    async with Running(api_client) as run:
        await eventually(lambda: policy_state_is(rest, "ready"), timeout=90)
        await run.settle()
        before = await _driver_hashes(rest)
        assert set(before) == set(gpu)

        since = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        # An administrator cordoned one node for their own reasons; another is skipped.
        await rest.merge_patch(NODE, cordoned_by_admin, {"spec": {"unschedulable": True}})
        await rest.merge_patch(NODE, skipped, {"metadata": {"labels": {SKIP_LABEL: "true"}}})
        # A GPU workload on the first node must be evicted by the drain.
        await core.create_namespaced_pod(
            WORKLOADS,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "trainer", "labels": {"app": "trainer"}},
                "spec": {
                    "nodeName": gpu[0],
                    "containers": [
                        {
                            "name": "c",
                            "image": "cuda",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ],
                },
            },
        )
        await run.settle()

        await rest.apply(_policy("600.10.01"))
        peak_in_progress = 0
        peak_unavailable = 0
        deadline = time.monotonic() + 180
        upgraded = [n for n in gpu if n != skipped]
        while time.monotonic() < deadline:
            nodes = {n["metadata"]["name"]: n for n in await _gpu_nodes(rest)}
            states = {
                name: (n["metadata"].get("labels") or {}).get(STATE_LABEL, "")
                for name, n in nodes.items()
            }
            in_progress = sum(
                1 for s in states.values() if UpgradeState(s or "unknown") in IN_PROGRESS_STATES
            )
            # The admin-cordoned node was unavailable before; count it like the budget does.
            unavailable = sum(
                1
                for name, n in nodes.items()
                if n["spec"].get("unschedulable")
                or UpgradeState(states[name] or "unknown") in IN_PROGRESS_STATES
            )
            peak_in_progress = max(peak_in_progress, in_progress)
            peak_unavailable = max(peak_unavailable, unavailable)
            assert in_progress <= 2, states
            assert unavailable <= 2, states  # 50% of 4 GPU nodes
            if all(states[n] == "upgrade-done" for n in upgraded):
                hashes = await _driver_hashes(rest)
                if all(hashes.get(n, before[n]) != before[n] for n in upgraded):
                    break
            assert not any(s == "upgrade-failed" for s in states.values()), states
            await asyncio.sleep(0.1)
        else:
            raise AssertionError(f"upgrade did not finish: {states}")
        assert peak_in_progress >= 1

        after = await _driver_hashes(rest)
        for name in upgraded:
            assert after[name] != before[name], name
        assert after[skipped] == before[skipped]
        assert states[skipped] != "upgrade-done" or after[skipped] == before[skipped]

        nodes = {n["metadata"]["name"]: n for n in await _gpu_nodes(rest)}
        for name in upgraded:
            meta = nodes[name]["metadata"]
            if name == cordoned_by_admin:
                assert nodes[name]["spec"].get("unschedulable") is True
            else:
                assert not nodes[name]["spec"].get("unschedulable"), name
            assert INITIAL_UNSCHEDULABLE_ANNOTATION not in (meta.get("annotations") or {})

        async def trainer_gone() -> bool:
            return await rest.get(POD, "trainer", WORKLOADS) is None

        assert await eventually(trainer_gone, timeout=30)
        assert run.operator.queue.stats.failed == 0

        events = [
            e
            for e in await rest.list(by_kind("v1", "Event"), "default")
            if e.get("lastTimestamp", "") >= since
        ]
        done = {
            e["involvedObject"]["name"] for e in events if e.get("reason") == "DriverUpgradeDone"
        }
        assert set(upgraded) <= done
        assert (
            skipped
            not in {
                e["involvedObject"]["name"]
                for e in events
                if e.get("reason") == "DriverUpgradeStarted"
            }
            or after[skipped] == before[skipped]
        )

        # Converged again: nothing more to write.
        await run.settle()
        writes = run.rest.writes
        for name in gpu:
            run.operator.queue.add(f"node/{name}")
        run.operator.queue.add("upgrades")
        await run.settle()
        assert run.rest.writes == writes, run.rest.write_counts()

    await rest.merge_patch(NODE, cordoned_by_admin, {"spec": {"unschedulable": None}})
    await rest.merge_patch(NODE, skipped, {"metadata": {"labels": {SKIP_LABEL: None}}})
    await rest.delete(by_kind("v1", "Namespace"), WORKLOADS)
    await rest.apply(crd.sample_policy())
    await rest.delete(POLICY, "cluster-policy")


async def test_a_restarted_operator_resumes_a_drain_blocked_by_a_budget(
    rest: Rest, api_client: client.ApiClient
) -> None:
    """Progress lives in node labels: kill the operator mid-drain, start another,
    and the node continues from drain-required once the PodDisruptionBudget allows."""
    core = client.CoreV1Api(api_client)
    policy_api = client.PolicyV1Api(api_client)
    workloads = f"{WORKLOADS}-b"
    await rest.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": workloads}})
    await rest.apply(_policy("595.91.07", max_parallel=1, max_unavailable=1))
    gpu = sorted(n["metadata"]["name"] for n in await _gpu_nodes(rest))
    first = gpu[0]
    async with Running(api_client) as run:
        await eventually(lambda: policy_state_is(rest, "ready"), timeout=90)
        await run.settle()
    await core.create_namespaced_pod(
        workloads,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "guarded", "labels": {"app": "guarded"}},
            "spec": {"nodeName": first, "containers": [{"name": "c", "image": "app"}]},
        },
    )
    await policy_api.create_namespaced_pod_disruption_budget(
        workloads,
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "guard"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}},
        },
    )

    async def pdb_active() -> bool:
        pdb = await policy_api.read_namespaced_pod_disruption_budget_status("guard", workloads)
        return bool(pdb.status and pdb.status.current_healthy == 1)

    await eventually(pdb_active)

    async def state_of(name: str) -> str:
        node = await rest.get(NODE, name)
        return ((node or {})["metadata"].get("labels") or {}).get(STATE_LABEL, "")

    async with Running(api_client) as run:
        await run.settle()
        await rest.apply(_policy("600.10.01", max_parallel=1, max_unavailable=1))

        async def blocked_in_drain() -> bool:
            return await state_of(first) == "drain-required"

        await eventually(blocked_in_drain, timeout=60)
        await asyncio.sleep(6)  # at least one refused eviction retried
        assert await state_of(first) == "drain-required"
        assert await rest.get(POD, "guarded", workloads) is not None
        # One slot: nobody else started.
        assert all([await state_of(n) in ("upgrade-required", "upgrade-done") for n in gpu[1:]])
    # The operator is gone; the node stays cordoned with its state and reason on record.
    node = await rest.get(NODE, first)
    assert node is not None
    assert node["spec"].get("unschedulable") is True
    assert node["metadata"]["labels"][STATE_LABEL] == "drain-required"

    async with Running(api_client) as run:
        await asyncio.sleep(2)
        assert await state_of(first) == "drain-required"  # resumed, not restarted
        await policy_api.delete_namespaced_pod_disruption_budget("guard", workloads)

        async def all_done() -> bool:
            return all([await state_of(n) == "upgrade-done" for n in gpu])

        await eventually(all_done, timeout=120)
        node = await rest.get(NODE, first)
        assert node is not None
        assert not node["spec"].get("unschedulable")
        assert run.operator.queue.stats.failed == 0

    await rest.delete(by_kind("v1", "Namespace"), workloads)
    await rest.delete(POLICY, "cluster-policy")


async def test_a_not_ready_node_does_not_stall_the_fleet(
    rest: Rest, api_client: client.ApiClient
) -> None:
    """Upstream users saw one NotReady node hold every upgrade back; here it is
    passed over (and reported), the others finish, and it follows once Ready."""
    await rest.apply(_policy("595.91.07", max_parallel=1, max_unavailable=2))
    gpu = sorted(n["metadata"]["name"] for n in await _gpu_nodes(rest))
    sick = gpu[0]  # first in line: without the fix it would block the single slot
    # The NotReady node counts against maxUnavailable (it is unavailable), so the
    # budget is 2: one for it, one for the upgrade slot.

    async def state_of(name: str) -> str:
        node = await rest.get(NODE, name)
        return ((node or {})["metadata"].get("labels") or {}).get(STATE_LABEL, "")

    async with Running(api_client) as run:
        await eventually(lambda: policy_state_is(rest, "ready"), timeout=90)
        await run.settle()
        # kwok stops heartbeating a node without its annotation; mark it NotReady.
        await rest.merge_patch(
            NODE, sick, {"metadata": {"annotations": {"kwok.x-k8s.io/node": None}}}
        )
        node = await rest.get(NODE, sick)
        assert node is not None
        conditions = [
            {**c, "status": "False", "reason": "KubeletDown"} if c["type"] == "Ready" else c
            for c in node["status"]["conditions"]
        ]
        await rest.merge_patch(
            NODE, sick, {"status": {"conditions": conditions}}, subresource="status"
        )
        before = await _driver_hashes(rest)
        await rest.apply(_policy("610.0.0", max_parallel=1, max_unavailable=2))

        async def others_done() -> bool:
            states = [await state_of(n) for n in gpu[1:]]
            hashes = await _driver_hashes(rest)
            return (
                all(s == "upgrade-done" for s in states)
                and all(hashes.get(n) not in (None, before[n]) for n in gpu[1:])
                and await state_of(sick) == "upgrade-required"
            )

        await eventually(others_done, timeout=120)

        async def one_pending() -> bool:
            return bool(run.operator.metrics.upgrades_pending._value.get() == 1)

        await eventually(one_pending, timeout=10)

        # Back to health (kwok manages it again): it upgrades too.
        await rest.merge_patch(
            NODE, sick, {"metadata": {"annotations": {"kwok.x-k8s.io/node": "fake"}}}
        )

        async def sick_done() -> bool:
            return await state_of(sick) == "upgrade-done"

        await eventually(sick_done, timeout=120)
    await rest.delete(POLICY, "cluster-policy")
