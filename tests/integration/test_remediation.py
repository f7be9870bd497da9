"""GPU health remediation on a real control plane with 12 simulated GPU nodes (its own
cluster, so the session cluster's fleet stays what the other tests expect): quarantine
and drain of an unhealthy node, recovery after the settle time, the circuit breaker,
dry run, a restart in the middle, a drain blocked by a budget or refused by the drain
rules, and kwok keeping the condition it does not own."""

from __future__ import annotations

import asyncio
import copy
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from kubernetes_asyncio import client

import crd
from gpuop.cli import main
from gpuop.devcluster import ClusterInfo
from gpuop.devcluster._health import mark_gpu_health, verdict_for
from gpuop.devcluster.nvml_fake import H100_80GB_HBM3, FakeNvml, make_gpus
from gpuop.kube.client import api_client as make_api_client
from gpuop.kube.kinds import KINDS, by_kind
from gpuop.kube.rest import Rest
from gpuop.nodeagent.health import HealthReporter, KubernetesNodeStatus
from gpuop.nodeagent.xid import XidCounts
from gpuop.operator.install import ensure_namespace, install_crd
from statemachine.cordon import CLEARED, CORDONED_BY_ANNOTATION
from statemachine.remediation import (
    CONDITION_REMEDIATION_BLIND,
    CONDITION_REMEDIATION_PAUSED,
    DRAINED_ANNOTATION,
    MANAGED_ANNOTATIONS,
    QUARANTINED_ANNOTATION,
    RESUME_ANNOTATION,
    TAINT_KEY,
)
from tests.integration.harness import NAMESPACE, NODE, POLICY, Running, eventually, own_cluster

pytestmark = pytest.mark.integration

POD = by_kind("v1", "Pod")
EVENT = by_kind("v1", "Event")
GPU_NODES = 12
GPUS = [f"gpu-node-{i:04d}" for i in range(GPU_NODES)]


@pytest.fixture(scope="module")
def fleet() -> Iterator[ClusterInfo]:
    with own_cluster("-remediation", gpu_nodes=GPU_NODES) as info:
        yield info


@pytest.fixture(scope="module")
async def api(fleet: ClusterInfo) -> AsyncIterator[client.ApiClient]:
    async with make_api_client(fleet.kubeconfig, user_agent="gpuop-tests") as api:
        rest = Rest(api, KINDS)
        await install_crd(rest)
        await ensure_namespace(rest, NAMESPACE)
        yield api


@pytest.fixture
async def rest(api: client.ApiClient) -> AsyncIterator[Rest]:
    """Each test starts from healthy, untainted, schedulable nodes and no policy."""
    rest = Rest(api, KINDS)
    yield rest
    for existing in await rest.list(POLICY):
        await rest.delete(POLICY, existing["metadata"]["name"])
    for name in GPUS:
        await mark_gpu_health(api, name, verdict_for("True", None, None))
        node = await rest.get(NODE, name)
        assert node is not None
        taints = [t for t in node["spec"].get("taints") or [] if t["key"] != TAINT_KEY]
        await rest.merge_patch(
            NODE,
            name,
            {
                "metadata": {"annotations": {**dict.fromkeys(MANAGED_ANNOTATIONS), **CLEARED}},
                "spec": {"taints": taints or None, "unschedulable": None},
            },
        )


def _policy(**remediation: Any) -> dict[str, Any]:
    """The sample policy with operands off (remediation needs none) and remediation on.
    Drains follow driver.upgradePolicy.drain; force lets them take the test's bare
    pods (kubectl drain semantics: pods no controller manages need force)."""
    policy = copy.deepcopy(crd.sample_policy())
    for section in policy["spec"].values():
        if isinstance(section, dict) and "enabled" in section:
            section["enabled"] = False
    upgrade = policy["spec"]["driver"].setdefault("upgradePolicy", {})
    upgrade.setdefault("drain", {})["force"] = True
    policy["spec"]["healthRemediation"] = {"enabled": True, **remediation}
    return policy


async def _node(rest: Rest, name: str) -> dict[str, Any]:
    node = await rest.get(NODE, name)
    assert node is not None
    return node


def _tainted(node: dict[str, Any]) -> bool:
    return any(t["key"] == TAINT_KEY for t in node["spec"].get("taints") or [])


def _untouched(node: dict[str, Any]) -> bool:
    annotations = node["metadata"].get("annotations") or {}
    return (
        not _tainted(node)
        and not node["spec"].get("unschedulable")
        and not set(MANAGED_ANNOTATIONS) & set(annotations)
        and CORDONED_BY_ANNOTATION not in annotations
    )


async def _events(rest: Rest, reason: str, name: str | None = None) -> list[dict[str, Any]]:
    return [
        e
        for e in await rest.list(EVENT, "default")
        if e["reason"] == reason and (name is None or e["involvedObject"]["name"] == name)
    ]


def _paused(policy: dict[str, Any] | None) -> dict[str, Any] | None:
    for cond in ((policy or {}).get("status") or {}).get("conditions") or []:
        if cond["type"] == CONDITION_REMEDIATION_PAUSED:
            return dict(cond)
    return None


async def _unhealthy(api: client.ApiClient, *names: str, reason: str = "XidCritical") -> None:
    for name in names:
        message = f"GPU 0 (GPU-{uuid.uuid4()}): XID 79 (GPU has fallen off the bus)"
        await mark_gpu_health(api, name, verdict_for("False", reason, message))


async def _healthy(api: client.ApiClient, *names: str) -> None:
    for name in names:
        await mark_gpu_health(api, name, verdict_for("True", None, None))


async def test_kwok_status_updates_keep_the_gpu_healthy_condition(
    api: client.ApiClient, rest: Rest, fleet: ClusterInfo
) -> None:
    """kwok rewrites a node's conditions when it (re)initialises it; ours must survive.
    The condition is set as a demo would, with `gpuop cluster gpu-health`."""
    name = GPUS[11]
    argv = ["cluster", "gpu-health", name, "--unhealthy", "--dir", str(fleet.directory)]
    assert await asyncio.to_thread(main, argv) == 0
    core = client.CoreV1Api(api)
    ready_false = {
        "status": {
            "conditions": [
                {"type": "Ready", "status": "False", "reason": "Test", "message": "forced"}
            ]
        }
    }
    core_any: Any = core
    await core_any.patch_node_status(
        name, ready_false, _content_type="application/strategic-merge-patch+json"
    )

    async def kwok_rewrote() -> dict[str, Any] | None:
        node = await _node(rest, name)
        conds = {c["type"]: c for c in node["status"]["conditions"]}
        ready = conds.get("Ready", {})
        return conds if ready.get("status") == "True" and ready.get("reason") != "Test" else None

    conds = await eventually(kwok_rewrote, timeout=60)
    assert conds["GPUHealthy"]["status"] == "False"
    assert conds["GPUHealthy"]["reason"] == "XidCritical"


async def test_unhealthy_node_is_drained_and_released_after_settling_across_a_restart(
    api: client.ApiClient, rest: Rest
) -> None:
    sick, admin_cordoned, bystander = GPUS[0], GPUS[1], GPUS[2]
    workloads = f"gpu-workloads-{uuid.uuid4().hex[:6]}"
    await rest.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": workloads}})
    core = client.CoreV1Api(api)
    for node in (sick, bystander):
        await core.create_namespaced_pod(
            workloads,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"trainer-{node}"},
                "spec": {
                    "nodeName": node,
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
    await rest.merge_patch(NODE, admin_cordoned, {"spec": {"unschedulable": True}})
    await rest.apply(_policy(action="drain", maxUnhealthy="25%", settleSeconds=3))
    async with Running(api) as run:
        await run.settle()
        await _unhealthy(api, sick, admin_cordoned)

        async def quarantined() -> bool:
            nodes = [await _node(rest, n) for n in (sick, admin_cordoned)]
            return all(_tainted(n) for n in nodes)

        await eventually(quarantined)

        async def drained() -> bool:
            pods = await rest.list(POD, workloads)
            return [p["spec"]["nodeName"] for p in pods] == [bystander]

        await eventually(drained)
        await run.settle()
        node = await _node(rest, sick)
        assert node["spec"]["unschedulable"] is True
        annotations = node["metadata"]["annotations"]
        assert annotations[QUARANTINED_ANNOTATION].startswith("XidCritical: GPU 0 (GPU-")
        assert annotations[CORDONED_BY_ANNOTATION] == "health-remediation"
        # The administrator's cordon is not ours.
        admins = await _node(rest, admin_cordoned)
        assert CORDONED_BY_ANNOTATION not in admins["metadata"]["annotations"]
        for name in GPUS[2:]:
            assert _untouched(await _node(rest, name)), name
        assert await _events(rest, "GPUUnhealthyQuarantined", sick)
        assert run.operator.metrics.health_quarantined._value.get() == 2
        writes = run.rest.writes
        await run.settle()
        assert run.rest.writes == writes  # idle: nothing more to do, nothing written

    # A new operator process finds the quarantine in the cluster and does not redo it.
    quarantine_events = len(await _events(rest, "GPUUnhealthyQuarantined"))
    async with Running(api) as run:
        await run.settle()
        assert len(await _events(rest, "GPUUnhealthyQuarantined")) == quarantine_events
        assert run.operator.metrics.health_quarantined._value.get() == 2
        await _healthy(api, sick, admin_cordoned)

        async def released() -> bool:
            nodes = [await _node(rest, n) for n in (sick, admin_cordoned)]
            return not any(_tainted(n) for n in nodes)

        await eventually(released)
        node = await _node(rest, sick)
        assert not node["spec"].get("unschedulable")
        assert not set(MANAGED_ANNOTATIONS) & set(node["metadata"].get("annotations") or {})
        assert (await _node(rest, admin_cordoned))["spec"]["unschedulable"] is True
        assert await _events(rest, "GPUHealthyQuarantineLifted", sick)


async def test_circuit_breaker_quarantines_at_most_the_limit_and_pauses(
    api: client.ApiClient, rest: Rest
) -> None:
    """6 of 12 fail at once with maxUnhealthy 25%: 3 quarantined, the rest held."""
    failing = GPUS[3:9]
    await rest.apply(_policy(action="taint", maxUnhealthy="25%", settleSeconds=1))
    async with Running(api) as run:
        await run.settle()
        await _unhealthy(api, *failing)

        async def paused() -> dict[str, Any] | None:
            cond = _paused(await rest.get(POLICY, "cluster-policy"))
            return cond if cond and cond["status"] == "True" else None

        cond = await eventually(paused)
        assert cond["reason"] == "CircuitBreakerOpen"
        await run.settle()
        tainted = [n for n in GPUS if _tainted(await _node(rest, n))]
        assert len(tainted) == 3
        assert set(tainted) <= set(failing)
        assert await _events(rest, "RemediationPaused", "cluster-policy")
        assert run.operator.metrics.health_paused._value.get() == 1

        # Resuming while still over the limit re-arms the breaker, which trips again.
        await rest.merge_patch(
            POLICY, "cluster-policy", {"metadata": {"annotations": {RESUME_ANNOTATION: "true"}}}
        )

        async def resume_taken() -> bool:
            policy = await rest.get(POLICY, "cluster-policy")
            assert policy is not None
            return RESUME_ANNOTATION not in (policy["metadata"].get("annotations") or {})

        await eventually(resume_taken)
        await run.settle()
        assert _paused(await rest.get(POLICY, "cluster-policy"))["status"] == "True"  # type: ignore[index]
        assert len([n for n in GPUS if _tainted(await _node(rest, n))]) == 3

        # Everything recovers: quarantines are lifted, but the pause holds until resumed.
        await _healthy(api, *failing)

        async def all_released() -> bool:
            return not any([_tainted(await _node(rest, n)) for n in GPUS])

        await eventually(all_released)
        assert _paused(await rest.get(POLICY, "cluster-policy"))["status"] == "True"  # type: ignore[index]
        await _unhealthy(api, GPUS[9])
        await run.settle()
        assert not _tainted(await _node(rest, GPUS[9]))

        await rest.merge_patch(
            POLICY, "cluster-policy", {"metadata": {"annotations": {RESUME_ANNOTATION: "true"}}}
        )

        async def resumed_and_quarantined() -> bool:
            cond = _paused(await rest.get(POLICY, "cluster-policy"))
            return bool(cond and cond["status"] == "False") and _tainted(await _node(rest, GPUS[9]))

        await eventually(resumed_and_quarantined)
        assert await _events(rest, "RemediationResumed", "cluster-policy")


async def test_the_node_agent_reports_an_injected_fault_and_the_node_is_quarantined(
    api: client.ApiClient, rest: Rest
) -> None:
    """The whole path: fake NVML fault -> agent -> nodes/status -> operator -> taint."""
    name = GPUS[10]
    nvml = FakeNvml(make_gpus(H100_80GB_HBM3, H100_80GB_HBM3, seed=name))
    reporter = HealthReporter(nvml, KubernetesNodeStatus(api), name, XidCounts())
    await rest.apply(_policy(action="cordon", maxUnhealthy=1, settleSeconds=0))
    async with Running(api) as run:
        assert (await reporter.check_once()).status == "True"
        await run.settle()
        assert _untouched(await _node(rest, name))
        nvml.fail_row_remap(1)
        assert (await reporter.check_once()).reason == "RowRemapFailure"

        async def quarantined() -> dict[str, Any] | None:
            node = await _node(rest, name)
            return node if _tainted(node) and node["spec"].get("unschedulable") else None

        node = await eventually(quarantined)
        why = node["metadata"]["annotations"][QUARANTINED_ANNOTATION]
        assert why.startswith("RowRemapFailure: GPU 1 (GPU-")
        nvml.heal(1)
        assert (await reporter.check_once()).status == "True"
        await eventually(lambda: _released(rest, name))


async def _released(rest: Rest, name: str) -> bool:
    return _untouched(await _node(rest, name))


async def test_dry_run_changes_nothing(api: client.ApiClient, rest: Rest) -> None:
    await rest.apply(_policy(action="drain", maxUnhealthy="25%", dryRun=True))
    async with Running(api) as run:
        await run.settle()
        await _unhealthy(api, *GPUS[:5])

        async def reported() -> bool:
            told = {e["involvedObject"]["name"] for e in await _events(rest, "GPUUnhealthyDryRun")}
            return set(GPUS[:3]) <= told and bool(await _events(rest, "RemediationPausedDryRun"))

        await eventually(reported)
        await run.settle()
        for name in GPUS:
            assert _untouched(await _node(rest, name)), name
        assert _paused(await rest.get(POLICY, "cluster-policy")) is None
        assert run.operator.metrics.health_would_quarantine._value.get() == 3


def _bare_pod(name: str, node: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "cuda"}], **spec},
    }


def _drained_at(node: dict[str, Any]) -> str | None:
    return (node["metadata"].get("annotations") or {}).get(DRAINED_ANNOTATION)


async def _said(rest: Rest, reason: str, node: str, *words: str) -> bool:
    return any(
        all(w in e.get("message", "") for w in words) for e in await _events(rest, reason, node)
    )


async def test_a_drain_a_budget_blocks_is_retried_across_a_restart_until_it_drains(
    api: client.ApiClient, rest: Rest
) -> None:
    """The drain is owed until the node records it done: refused by a
    PodDisruptionBudget it is retried, by a new operator process too, and completes once
    the budget allows. The Events say what happened, never "drained" before it is."""
    sick = GPUS[0]
    workloads = f"guarded-{uuid.uuid4().hex[:6]}"
    await rest.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": workloads}})
    core = client.CoreV1Api(api)
    policy_api = client.PolicyV1Api(api)
    await core.create_namespaced_pod(workloads, _bare_pod("guarded", sick))
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
    await rest.apply(_policy(action="drain", maxUnhealthy="25%", settleSeconds=3))
    async with Running(api) as run:
        await run.settle()
        await _unhealthy(api, sick)
        await eventually(lambda: _said(rest, "GPUUnhealthyDrainBlocked", sick, "guarded"))
        node = await _node(rest, sick)
        assert _tainted(node)
        assert node["spec"]["unschedulable"] is True
        assert _drained_at(node) is None
        assert await rest.get(POD, "guarded", workloads) is not None
        told = await _events(rest, "GPUUnhealthyQuarantined", sick)
        assert told
        assert not any("drained" in e["message"] for e in told)

    # A new process: nothing in memory, the node's record says the drain is owed (it
    # retries every few seconds, so the queue is never quiet: no settle() here).
    async with Running(api) as run:
        await asyncio.sleep(6)  # at least one retry refused again
        assert _drained_at(await _node(rest, sick)) is None
        assert await rest.get(POD, "guarded", workloads) is not None
        await policy_api.delete_namespaced_pod_disruption_budget("guard", workloads)

        async def drained() -> bool:
            gone = await rest.get(POD, "guarded", workloads) is None
            return gone and _drained_at(await _node(rest, sick)) is not None

        await eventually(drained, timeout=60)
        assert await _said(rest, "GPUUnhealthyDrained", sick, "drained")
        writes = run.rest.writes
        await run.settle()
        assert run.rest.writes == writes  # drained: nothing more to do
    await rest.delete(by_kind("v1", "Namespace"), workloads)


async def test_a_drain_the_rules_refuse_evicts_nothing_and_says_so(
    api: client.ApiClient, rest: Rest
) -> None:
    """kubectl drain semantics with driver.upgradePolicy.drain's flags: a pod with an
    emptyDir (a GPU pod's /dev/shm) and no deleteEmptyDir refuses the whole drain. The
    Event names it; allowing it in the policy lets the owed drain finish."""
    sick = GPUS[1]
    workloads = f"scratch-{uuid.uuid4().hex[:6]}"
    await rest.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": workloads}})
    core = client.CoreV1Api(api)
    shm = {"volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}]}
    await core.create_namespaced_pod(workloads, _bare_pod("scratch", sick, **shm))
    await core.create_namespaced_pod(workloads, _bare_pod("plain", sick))
    await rest.apply(_policy(action="drain", maxUnhealthy="25%", settleSeconds=3))
    drained_before = len(await _events(rest, "GPUUnhealthyDrained", sick))  # earlier tests'
    async with Running(api) as run:
        await run.settle()
        await _unhealthy(api, sick)
        await eventually(
            lambda: _said(rest, "GPUUnhealthyDrainRefused", sick, "scratch", "deleteEmptyDir")
        )
        await run.settle()
        assert {p["metadata"]["name"] for p in await rest.list(POD, workloads)} == {
            "scratch",
            "plain",
        }
        assert _drained_at(await _node(rest, sick)) is None
        assert len(await _events(rest, "GPUUnhealthyDrained", sick)) == drained_before

        policy = _policy(action="drain", maxUnhealthy="25%", settleSeconds=3)
        policy["spec"]["driver"]["upgradePolicy"]["drain"]["deleteEmptyDir"] = True
        await rest.apply(policy)

        async def drained() -> bool:
            empty = not await rest.list(POD, workloads)
            return empty and _drained_at(await _node(rest, sick)) is not None

        await eventually(drained, timeout=60)
    await rest.delete(by_kind("v1", "Namespace"), workloads)


def _blind(policy: dict[str, Any] | None) -> dict[str, Any] | None:
    for cond in ((policy or {}).get("status") or {}).get("conditions") or []:
        if cond["type"] == CONDITION_REMEDIATION_BLIND:
            return dict(cond)
    return None


async def test_remediation_without_the_node_agent_says_it_is_blind(
    api: client.ApiClient, rest: Rest
) -> None:
    """Remediation on, nodeStatusExporter off (as `_policy` leaves it): no node agent
    reports GPUHealthy, and the policy says so; off again, the condition goes."""
    await rest.apply(_policy(action="taint"))
    async with Running(api) as run:

        async def flagged() -> dict[str, Any] | None:
            return _blind(await rest.get(POLICY, "cluster-policy"))

        cond = await eventually(flagged)
        assert (cond["status"], cond["reason"]) == ("True", "NodeStatusExporterDisabled")
        assert "nodeStatusExporter.enabled is false" in cond["message"]
        events = await _events(rest, CONDITION_REMEDIATION_BLIND, "cluster-policy")
        assert events
        assert {e["type"] for e in events} == {"Warning"}
        await run.settle()
        writes = run.rest.writes
        run.operator.queue.add("cluster")
        run.operator.queue.add("remediation")
        await run.settle()
        assert run.rest.writes == writes  # said once, not rewritten
        assert len(await _events(rest, CONDITION_REMEDIATION_BLIND, "cluster-policy")) == len(
            events
        )

        off = _policy(action="taint")
        off["spec"]["healthRemediation"]["enabled"] = False
        await rest.apply(off)

        async def cleared() -> bool:
            return _blind(await rest.get(POLICY, "cluster-policy")) is None

        await eventually(cleared)
