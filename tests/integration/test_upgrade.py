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
from gpuop.devcluster import NFD_GPU_LABEL
from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Rest
from statemachine.upgrade_keys import (
    DRAIN_SKIP_POD_LABEL,
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
    version: str,
    max_parallel: int = 2,
    max_unavailable: int | str = "50%",
    **sections: dict[str, Any],
) -> dict[str, Any]:
    """``sections`` replace whole parts of ``upgradePolicy`` (``drain=...``)."""
    policy = copy.deepcopy(crd.sample_policy())
    driver = policy["spec"].setdefault("driver", {})
    driver["version"] = version
    driver["upgradePolicy"] = {
        "autoUpgrade": True,
        "maxParallelUpgrades": max_parallel,
        "maxUnavailable": max_unavailable,
        "drain": {"enable": True, "timeoutSeconds": 60},
        "podDeletion": {"timeoutSeconds": 60},
        **sections,
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
    try:
        async with Running(api_client) as run:
            await eventually(lambda: policy_state_is(rest, "ready"), timeout=90)
            await run.settle()
            before = await _driver_hashes(rest)
            assert set(before) == set(gpu)

            since = _now()
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

            # The trainer is a bare pod: only podDeletion.force lets it go.
            await rest.apply(
                _policy("600.10.01", podDeletion={"force": True, "timeoutSeconds": 60})
            )
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

            done = await _events(rest, "DriverUpgradeDone", since)
            assert set(upgraded) <= set(done)
            started = await _events(rest, "DriverUpgradeStarted", since)
            assert skipped not in started or after[skipped] == before[skipped]

            # Converged again: nothing more to write.
            await run.settle()
            writes = run.rest.writes
            for name in gpu:
                run.operator.queue.add(f"node/{name}")
            run.operator.queue.add("upgrades")
            await run.settle()
            assert run.rest.writes == writes, run.rest.write_counts()
    finally:
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

    # drain.force lets the bare pod go, but never past its PodDisruptionBudget.
    forced = {"enable": True, "force": True, "timeoutSeconds": 60}
    async with Running(api_client) as run:
        await run.settle()
        await rest.apply(_policy("600.10.01", max_parallel=1, max_unavailable=1, drain=forced))

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


# --- emptying a node: kubectl drain's rules, timeouts, the skip label -------------------


def _bare_pod(name: str, node: str, *, gpu: bool = False, empty_dir: bool = False) -> Any:
    """A pod no controller manages (the shapes kubectl drain refuses without flags)."""
    container: dict[str, Any] = {"name": "c", "image": "app"}
    if gpu:
        container["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    spec: dict[str, Any] = {"nodeName": node, "containers": [container]}
    if empty_dir:
        spec["volumes"] = [{"name": "scratch", "emptyDir": {}}]
        container["volumeMounts"] = [{"name": "scratch", "mountPath": "/scratch"}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": spec,
    }


def _gpu_daemonset(name: str) -> Any:
    """Somebody else's GPU DaemonSet: its pods are never ours to remove (they come back)."""
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "nodeSelector": {NFD_GPU_LABEL: "true"},
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [
                        {
                            "name": "c",
                            "image": "monitor",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ],
                },
            },
        },
    }


async def _node_meta(rest: Rest, name: str) -> tuple[dict[str, str], dict[str, str], bool]:
    node = await rest.get(NODE, name)
    assert node is not None
    meta = node["metadata"]
    return (
        meta.get("labels") or {},
        meta.get("annotations") or {},
        bool(node["spec"].get("unschedulable")),
    )


async def _state(rest: Rest, name: str) -> str:
    return (await _node_meta(rest, name))[0].get(STATE_LABEL, "")


def _event_time(event: dict[str, Any]) -> str:
    """When an Event last happened. One written through events.k8s.io/v1, as some
    control-plane components write theirs, has `eventTime` and a null `lastTimestamp`:
    one such Event in `default` beside ours made the comparison with None fail."""
    return str(event.get("lastTimestamp") or event.get("eventTime") or "")


async def _events(rest: Rest, reason: str, since: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for e in await rest.list(by_kind("v1", "Event"), "default"):
        if e.get("reason") == reason and _event_time(e) >= since:
            out.setdefault(e["involvedObject"]["name"], []).append(e.get("message", ""))
    return out


async def _remove_pods(rest: Rest, namespace: str, *names: str) -> None:
    """Gone before the next test: a leftover bare pod would fail its next upgrade."""
    for name in names:
        await rest.delete(POD, name, namespace, body={"gracePeriodSeconds": 0})

    async def gone() -> bool:
        return all([await rest.get(POD, n, namespace) is None for n in names])

    await eventually(gone, timeout=60)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def test_pods_the_flags_do_not_cover_fail_their_node_and_stay(
    rest: Rest, api_client: client.ApiClient, namespace: str
) -> None:
    """With force and deleteEmptyDir off, a bare pod and an emptyDir pod are never
    removed (they used to be evicted, data and all): their nodes fail at once, naming
    them, and the other nodes finish, their GPU DaemonSet pods left alone, as are bare
    pods the drain skips by label or by drain.podSelector."""
    core = client.CoreV1Api(api_client)
    apps = client.AppsV1Api(api_client)
    policy = _policy("595.91.07", max_parallel=0, max_unavailable="100%")
    await rest.apply(policy)
    gpu = sorted(n["metadata"]["name"] for n in await _gpu_nodes(rest))
    bare_node, scratch_node, healthy = gpu[0], gpu[1], gpu[2:]
    async with Running(api_client) as run:
        await eventually(lambda: policy_state_is(rest, "ready"), timeout=90)
        await run.settle()
        await apps.create_namespaced_daemon_set(namespace, _gpu_daemonset("gpu-monitor"))
        await core.create_namespaced_pod(namespace, _bare_pod("bare-gpu", bare_node, gpu=True))
        await core.create_namespaced_pod(
            namespace, _bare_pod("scratch", scratch_node, empty_dir=True)
        )
        # Left alone by the drain: one opted out by label, one outside drain.podSelector.
        opted_out = _bare_pod("opted-out", healthy[0])
        opted_out["metadata"]["labels"][DRAIN_SKIP_POD_LABEL] = "true"
        await core.create_namespaced_pod(namespace, opted_out)
        unselected = _bare_pod("unselected", healthy[-1])
        unselected["metadata"]["labels"]["tier"] = "system"
        await core.create_namespaced_pod(namespace, unselected)

        async def monitors_everywhere() -> bool:
            pods = await rest.list(POD, namespace, label_selector="app=gpu-monitor")
            return {p["spec"].get("nodeName") for p in pods} >= set(gpu)

        await eventually(monitors_everywhere, timeout=60)
        monitors = {
            p["metadata"]["uid"]
            for p in await rest.list(POD, namespace, label_selector="app=gpu-monitor")
        }
        since = _now()
        drain = {"enable": True, "timeoutSeconds": 30, "podSelector": "tier!=system"}
        await rest.apply(_policy("600.10.01", max_parallel=0, max_unavailable="100%", drain=drain))

        async def settled() -> bool:
            states = [await _state(rest, n) for n in gpu]
            return states == ["upgrade-failed"] * 2 + ["upgrade-done"] * len(healthy)

        await eventually(settled, timeout=120)

        _, bare_ann, bare_cordoned = await _node_meta(rest, bare_node)
        _, scratch_ann, scratch_cordoned = await _node_meta(rest, scratch_node)
        reason = "gpuop.io/driver-upgrade-reason"
        assert f"{namespace}/bare-gpu" in bare_ann[reason], bare_ann[reason]
        assert "needs force" in bare_ann[reason]
        assert f"{namespace}/scratch" in scratch_ann[reason], scratch_ann[reason]
        assert "needs deleteEmptyDir" in scratch_ann[reason]
        # Failed nodes stay cordoned for the admin, with the reason on record.
        assert bare_cordoned
        assert scratch_cordoned
        for name in healthy:
            assert not (await _node_meta(rest, name))[2], name

        for pod in ("bare-gpu", "scratch", "opted-out", "unselected"):
            still = await rest.get(POD, pod, namespace)
            assert still is not None, pod
            assert not still["metadata"].get("deletionTimestamp"), pod
        # The DaemonSet's pods were never touched (not one replaced).
        now = {
            p["metadata"]["uid"]
            for p in await rest.list(POD, namespace, label_selector="app=gpu-monitor")
        }
        assert now == monitors
        assert run.rest.counts[("CREATE", "pods/eviction")] == 0

        failed = await _events(rest, "DriverUpgradeFailed", since)
        assert any("bare-gpu" in m for m in failed[bare_node]), failed
        assert any("scratch" in m for m in failed[scratch_node]), failed
        # Upstream: pod deletion that cannot finish hands over to the drain (which
        # refuses too); the setback is on record.
        fallback = await _events(rest, "DriverUpgradePodDeletionFailed", since)
        assert any("bare-gpu" in m for m in fallback[bare_node]), fallback
    await _remove_pods(rest, namespace, "bare-gpu", "scratch", "opted-out", "unselected")
    await rest.delete(by_kind("apps/v1", "DaemonSet"), "gpu-monitor", namespace)
    await rest.delete(POLICY, "cluster-policy")

    async def handed_back() -> bool:
        metas = [await _node_meta(rest, n) for n in gpu]
        return all(STATE_LABEL not in lbl and not cordoned for lbl, _, cordoned in metas)

    # No policy: nothing stays cordoned by us.
    async with Running(api_client):
        await eventually(handed_back, timeout=60)


async def test_a_budget_at_zero_fails_the_node_after_the_timeout_never_deletes(
    rest: Rest, api_client: client.ApiClient, namespace: str
) -> None:
    """drain.force lets a bare pod go, never past its PodDisruptionBudget: evictions are
    retried until timeoutSeconds, then the node fails naming pod and budget. (It used
    to DELETE the pod with grace 0 once the timeout was up.)"""
    core = client.CoreV1Api(api_client)
    policy_api = client.PolicyV1Api(api_client)
    await rest.apply(_policy("595.91.07", max_parallel=0, max_unavailable="100%"))
    gpu = sorted(n["metadata"]["name"] for n in await _gpu_nodes(rest))
    guarded_node = gpu[0]
    async with Running(api_client) as run:
        await eventually(lambda: policy_state_is(rest, "ready"), timeout=90)
        await run.settle()
        await core.create_namespaced_pod(namespace, _bare_pod("guarded", guarded_node))
        await policy_api.create_namespaced_pod_disruption_budget(
            namespace,
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": "keep-guarded"},
                # A bare pod has no scale: only minAvailable applies to it.
                "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}},
            },
        )

        async def pdb_active() -> bool:
            pdb = await policy_api.read_namespaced_pod_disruption_budget_status(
                "keep-guarded", namespace
            )
            # No disruption allowed: every eviction is refused (429).
            return bool(
                pdb.status
                and pdb.status.current_healthy == 1
                and pdb.status.disruptions_allowed == 0
            )

        await eventually(pdb_active)
        since = _now()
        forced = {"enable": True, "force": True, "timeoutSeconds": 12}
        await rest.apply(_policy("600.10.01", max_parallel=0, max_unavailable="100%", drain=forced))

        async def settled() -> bool:
            states = [await _state(rest, n) for n in gpu]
            return states == ["upgrade-failed"] + ["upgrade-done"] * (len(gpu) - 1)

        await eventually(settled, timeout=120)
        _, annotations, cordoned = await _node_meta(rest, guarded_node)
        reason = annotations["gpuop.io/driver-upgrade-reason"]
        assert reason.startswith("drain timed out after 12s with 1 pods left"), reason
        assert f"{namespace}/guarded" in reason
        assert "keep-guarded" in reason  # the API names the budget
        assert cordoned
        pod = await rest.get(POD, "guarded", namespace)
        assert pod is not None
        assert not pod["metadata"].get("deletionTimestamp")
        assert run.rest.counts[("CREATE", "pods/eviction")] >= 2  # retried
        failed = await _events(rest, "DriverUpgradeFailed", since)
        assert any("keep-guarded" in m for m in failed[guarded_node]), failed
    await policy_api.delete_namespaced_pod_disruption_budget("keep-guarded", namespace)
    await _remove_pods(rest, namespace, "guarded")
    await rest.delete(POLICY, "cluster-policy")
    async with Running(api_client):

        async def uncordoned() -> bool:
            labels_, _, cordoned = await _node_meta(rest, guarded_node)
            return STATE_LABEL not in labels_ and not cordoned

        await eventually(uncordoned, timeout=60)


async def test_a_driver_pod_that_never_turns_ready_fails_its_node(
    rest: Rest, api_client: client.ApiClient
) -> None:
    """A new driver pod that never turns Ready used to hold its node cordoned in
    pod-restart-required for ever. Now the node fails with a reason, the fleet goes on
    with the slots left (a failed node keeps its maxParallelUpgrades slot, as upstream
    counts it), and the node heals by itself once a Ready driver pod runs there."""
    await rest.apply(_policy("595.91.07", max_parallel=2, max_unavailable="100%"))
    gpu = sorted(n["metadata"]["name"] for n in await _gpu_nodes(rest))
    stuck = gpu[0]  # first in line
    # A taint the driver does not tolerate: its old pod stays, a new one is never made.
    blocked = {"key": "gpuop.io/test-no-new-pods", "value": "x", "effect": "NoSchedule"}
    async with Running(api_client) as run:
        run.operator.upgrades.driver_ready_timeout_seconds = 10
        await eventually(lambda: policy_state_is(rest, "ready"), timeout=90)
        await run.settle()
        node = await rest.get(NODE, stuck)
        assert node is not None
        taints = node["spec"].get("taints") or []
        await rest.merge_patch(NODE, stuck, {"spec": {"taints": [*taints, blocked]}})
        since = _now()
        await rest.apply(
            _policy("600.10.01", max_parallel=2, max_unavailable="100%", drain={"enable": False})
        )

        async def failed() -> bool:
            return await _state(rest, stuck) == "upgrade-failed"

        await eventually(failed, timeout=90)
        _, annotations, cordoned = await _node_meta(rest, stuck)
        reason = annotations["gpuop.io/driver-upgrade-reason"]
        assert reason == "new driver pod not ready after 10s (no new driver pod on the node)"
        assert cordoned  # cordoned, and the reason says why
        events = await _events(rest, "DriverUpgradeFailed", since)
        assert reason in events[stuck]

        async def others_done() -> bool:
            return all([await _state(rest, n) == "upgrade-done" for n in gpu[1:]])

        await eventually(others_done, timeout=120)

        # The driver can run there again: the node heals and is handed back.
        await rest.merge_patch(NODE, stuck, {"spec": {"taints": taints or None}})

        async def healed() -> bool:
            labels_, _, cordoned = await _node_meta(rest, stuck)
            return labels_.get(STATE_LABEL) == "upgrade-done" and not cordoned

        await eventually(healed, timeout=120)
    await rest.delete(POLICY, "cluster-policy")


async def test_skip_label_set_mid_upgrade_finishes_or_hands_the_node_back(
    rest: Rest, api_client: client.ApiClient, namespace: str
) -> None:
    """The skip label only stops a start. Set on nodes already waiting for jobs, one
    finishes when its job ends; the other, when the policy goes, is uncordoned and
    unlabelled. (Both used to stay cordoned in their state for ever.)"""
    core = client.CoreV1Api(api_client)
    wait = {"podSelector": "app=job", "timeoutSeconds": 0}
    await rest.apply(_policy("595.91.07", max_parallel=2, max_unavailable="100%"))
    gpu = sorted(n["metadata"]["name"] for n in await _gpu_nodes(rest))
    finishing, abandoned = gpu[0], gpu[1]
    async with Running(api_client) as run:
        await eventually(lambda: policy_state_is(rest, "ready"), timeout=90)
        await run.settle()
        for i, name in enumerate((finishing, abandoned)):
            pod = _bare_pod(f"job-{i}", name)
            pod["metadata"]["labels"] = {"app": "job"}
            await core.create_namespaced_pod(namespace, pod)
        await rest.apply(
            _policy(
                "600.10.01",
                max_parallel=2,
                max_unavailable="100%",
                waitForCompletion=wait,
                drain={"enable": False},
            )
        )

        async def both_waiting() -> bool:
            states = [await _state(rest, n) for n in (finishing, abandoned)]
            return states == ["wait-for-jobs-required"] * 2

        await eventually(both_waiting, timeout=60)
        for name in (finishing, abandoned):
            await rest.merge_patch(NODE, name, {"metadata": {"labels": {SKIP_LABEL: "true"}}})
        await core.delete_namespaced_pod("job-0", namespace, grace_period_seconds=0)

        async def finished() -> bool:
            labels_, _, cordoned = await _node_meta(rest, finishing)
            return labels_.get(STATE_LABEL) == "upgrade-done" and not cordoned

        await eventually(finished, timeout=90)
        assert await _state(rest, abandoned) == "wait-for-jobs-required"
    await rest.delete(POLICY, "cluster-policy")
    async with Running(api_client):

        async def handed_back() -> bool:
            labels_, annotations, cordoned = await _node_meta(rest, abandoned)
            ours = [k for k in annotations if k.startswith("gpuop.io/driver-upgrade")]
            return STATE_LABEL not in labels_ and not cordoned and not ours

        await eventually(handed_back, timeout=60)
    await _remove_pods(rest, namespace, "job-1")
    for name in (finishing, abandoned):
        await rest.merge_patch(NODE, name, {"metadata": {"labels": {SKIP_LABEL: None}}})
