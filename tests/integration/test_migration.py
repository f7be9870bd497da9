"""In-place migration from NVIDIA's GPU Operator on the real control plane.

NVIDIA's operator's objects for the chart-default policy (as it recorded them,
tests/conformance/upstream/default/) are created, kwok runs their pods, the nodes carry
the labels that operator left and a GPU workload runs on every GPU node. Then gpuop
starts with the same policy. A watcher over the whole hand-over counts cordons, workload
pods deleted or evicted, and driver pods whose DRIVER_CONFIG_DIGEST changed: all must be
zero, every object adopted in place (same uid), the policy ready.

Also here: a DaemonSet whose selector must change (an older gpuop's) is replaced
without a cordon and with an Event, and gpuop waits while another holder renews NVIDIA's
operator's leader Lease.
"""

from __future__ import annotations

import asyncio
import copy
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client

from components.driver import digest_in
from gpuop.devcluster import NFD_GPU_LABEL
from gpuop.kube.kinds import by_kind, kind_of
from gpuop.kube.rest import Rest
from gpuop.operator.controller import OperatorConfig
from gpuop.operator.leader import LEASE, UPSTREAM_LEASE, LeaderElector, Leases
from statemachine.driver_handoff import HANDOFF_ANNOTATION
from tests.integration.handover import Watcher
from tests.integration.harness import NODE, POLICY, Running, eventually, policy_state_is

pytestmark = pytest.mark.integration

RECORDED = Path(__file__).resolve().parents[1] / "conformance" / "upstream" / "default"
NVIDIA_NAMESPACE = "gpu-operator"
"""Where NVIDIA's operator ran when recording; its objects are moved to `MIGRATION_NS`."""
MIGRATION_NS = "nvidia-gpu-operator"
WORKLOADS = "migration-workloads"
POD = by_kind("v1", "Pod")
NS = by_kind("v1", "Namespace")
DAEMONSET = by_kind("apps/v1", "DaemonSet")
DEPLOYMENT = by_kind("apps/v1", "Deployment")
EVENT = by_kind("v1", "Event")
UPGRADE_STATE = "nvidia.com/gpu-driver-upgrade-state"


def _recorded() -> tuple[list[dict[str, Any]], dict[str, dict[str, str]]]:
    docs = [d for d in yaml.safe_load_all((RECORDED / "rendered.yaml").read_text()) if d]
    labels = next(d["nodes"] for d in docs if d.get("kind") == "NodeLabels")
    return [d for d in docs if d.get("kind") != "NodeLabels"], labels


def _recorded_annotations() -> dict[str, dict[str, str]]:
    """The `nvidia.com/*` node annotations NVIDIA's operator left (recorded apart)."""
    doc = yaml.safe_load((RECORDED / "node-annotations.yaml").read_text())
    return {str(n): dict(a or {}) for n, a in doc["nodes"].items()}


def _policy() -> dict[str, Any]:
    policy: dict[str, Any] = yaml.safe_load((RECORDED / "policy.yaml").read_text())
    return policy


def _moved(obj: dict[str, Any], owner: dict[str, Any]) -> dict[str, Any]:
    """The recorded object in the test's namespace, owned by the test's policy."""
    obj = copy.deepcopy(obj)
    meta = obj["metadata"]
    if meta.get("namespace") == NVIDIA_NAMESPACE:
        meta["namespace"] = MIGRATION_NS
    for subject in obj.get("subjects") or ():
        if subject.get("namespace") == NVIDIA_NAMESPACE:
            subject["namespace"] = MIGRATION_NS
    meta["ownerReferences"] = [owner]
    return obj


def _gpu_workload(replicas: int) -> dict[str, Any]:
    """One GPU pod per GPU node (the simulated nodes advertise nvidia.com/gpu)."""
    labels = {"app": "trainer"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "trainer", "namespace": WORKLOADS},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "affinity": {
                        "podAntiAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": [
                                {
                                    "labelSelector": {"matchLabels": labels},
                                    "topologyKey": "kubernetes.io/hostname",
                                }
                            ]
                        }
                    },
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                    "containers": [
                        {
                            "name": "cuda",
                            "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ],
                },
            },
        },
    }


async def _not_rolled_out(rest: Rest, namespace: str) -> dict[str, Any]:
    """DaemonSets whose pods are not all current and ready, with their status."""
    late = {}
    for d in await rest.list(DAEMONSET, namespace):
        status = d.get("status") or {}
        desired = status.get("desiredNumberScheduled")
        if (
            status.get("observedGeneration") != d["metadata"]["generation"]
            or status.get("numberReady", -1) != desired
            or status.get("updatedNumberScheduled", 0 if desired == 0 else -1) != desired
        ):
            late[d["metadata"]["name"]] = status
    return late


async def _daemonsets_rolled_out(rest: Rest, namespace: str) -> bool:
    return bool(await rest.list(DAEMONSET, namespace)) and not await _not_rolled_out(
        rest, namespace
    )


async def _ready(rest: Rest, namespace: str, timeout: float = 180) -> None:
    """Wait for the policy to turn ready; on timeout say what it and the DaemonSets show."""
    deadline = time.monotonic() + timeout
    while not await policy_state_is(rest, "ready"):
        if time.monotonic() > deadline:
            policy = await rest.get(POLICY, "cluster-policy")
            raise AssertionError(
                f"policy not ready: {(policy or {}).get('status')}; "
                f"DaemonSets: {await _not_rolled_out(rest, namespace)}"
            )
        await asyncio.sleep(0.5)


async def _clean(rest: Rest) -> None:
    for policy in await rest.list(POLICY):
        await rest.delete(POLICY, policy["metadata"]["name"])
    for name in (MIGRATION_NS, WORKLOADS):
        await rest.delete(NS, name)

    async def gone() -> bool:
        return all([await rest.get(NS, n) is None for n in (MIGRATION_NS, WORKLOADS)])

    await eventually(gone, timeout=120, what="namespaces deleted")


async def test_gpuop_takes_over_nvidias_objects_in_place(
    rest: Rest, api_client: client.ApiClient
) -> None:
    objects, node_labels = _recorded()
    for name in (MIGRATION_NS, WORKLOADS):
        await rest.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    try:
        created = await rest.create(POLICY, _policy())
        owner = {
            "apiVersion": "nvidia.com/v1",
            "kind": "ClusterPolicy",
            "name": created["metadata"]["name"],
            "uid": created["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
        # NVIDIA's operator's objects, as it left them, and the node labels it wrote.
        uids: dict[tuple[str, str], str] = {}
        for obj in objects:
            moved = _moved(obj, owner)
            meta = moved["metadata"]
            if not meta.get("namespace"):
                # Cluster-scoped: a leftover of an earlier test's operator must not clash.
                await rest.delete(kind_of(moved), meta["name"])
            made = await rest.create(kind_of(moved), moved, meta.get("namespace"))
            uids[(moved["kind"], meta["name"])] = made["metadata"]["uid"]
        annotations = _recorded_annotations()
        for node, labels in node_labels.items():
            meta = {"labels": labels, "annotations": annotations.get(node) or {}}
            await rest.merge_patch(NODE, node, {"metadata": meta})
        deadline = time.monotonic() + 120
        while not await _daemonsets_rolled_out(rest, MIGRATION_NS):
            late = await _not_rolled_out(rest, MIGRATION_NS)
            assert time.monotonic() < deadline, f"NVIDIA's DaemonSets not running: {late}"
            await asyncio.sleep(0.5)
        await rest.create(DEPLOYMENT, _gpu_workload(len(node_labels)), WORKLOADS)

        async def workload_running() -> bool:
            pods = await rest.list(POD, WORKLOADS)
            return len(pods) == len(node_labels) and all(
                (p.get("status") or {}).get("phase") == "Running" for p in pods
            )

        await eventually(workload_running, timeout=120, what="GPU workload running")
        workload = await rest.list(POD, WORKLOADS)
        assert {p["spec"]["nodeName"] for p in workload} == set(node_labels)

        config = OperatorConfig(namespace=MIGRATION_NS, workers=4)
        async with (
            Watcher(api_client, workload_namespace=WORKLOADS) as watcher,
            Running(api_client, config) as run,
        ):
            await _ready(rest, MIGRATION_NS)

            async def handed_over() -> bool:
                nodes = {n["metadata"]["name"]: n for n in await rest.list(NODE)}
                done = all(
                    nodes[n]["metadata"]["labels"].get(UPGRADE_STATE) == "upgrade-done"
                    for n in node_labels
                )
                return done and await _daemonsets_rolled_out(rest, MIGRATION_NS)

            deadline = time.monotonic() + 300
            while not await handed_over():
                assert time.monotonic() < deadline, watcher.seen
                await asyncio.sleep(0.5)
            await run.settle()
            assert await policy_state_is(rest, "ready")
            assert run.operator.queue.stats.failed == 0
        seen = watcher.seen

        # No node cordoned, no GPU workload pod evicted, no driver reinstalled.
        assert seen.cordons == []
        assert seen.workload_pods_removed == []
        assert seen.digest_changes == {}
        # Each driver pod was replaced (gpuop's template differs), with the same digest.
        assert all(len(seen.driver_digests[n]) >= 2 for n in node_labels), seen.driver_digests
        driver = next(o for o in objects if o["metadata"]["name"] == "nvidia-driver-daemonset")
        recorded = digest_in(driver["spec"]["template"]["spec"])
        assert {d for ds in seen.driver_digests.values() for d in ds} == {recorded}
        after = await rest.list(POD, WORKLOADS)
        assert {p["metadata"]["uid"] for p in after} == {p["metadata"]["uid"] for p in workload}
        # Every object adopted in place: the same object, now carrying gpuop's labels.
        for (kind, name), uid in uids.items():
            obj = next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)
            namespace = MIGRATION_NS if obj["metadata"].get("namespace") else None
            live = await rest.get(kind_of(obj), name, namespace)
            assert live is not None, (kind, name)
            assert live["metadata"]["uid"] == uid, f"{kind} {name} was replaced"
            managed_by = live["metadata"]["labels"]["app.kubernetes.io/managed-by"]
            assert managed_by == "gpuop", (kind, name)
        events = await rest.list(EVENT, MIGRATION_NS)
        assert [e for e in events if e["reason"] == "SelectorReplaced"] == []
        # The driver manager's hand-off stays as NVIDIA's operator left it: ours.
        for node in node_labels:
            live_node = await rest.get(NODE, node)
            assert live_node is not None
            got = (live_node["metadata"].get("annotations") or {}).get(HANDOFF_ANNOTATION)
            assert got == annotations[node][HANDOFF_ANNOTATION] == "true", node
    finally:
        for node in node_labels:
            await rest.merge_patch(
                NODE, node, {"metadata": {"annotations": {HANDOFF_ANNOTATION: None}}}
            )
        await _clean(rest)


def _old_gpuop_gfd(node: str) -> dict[str, Any]:
    """GFD as gpuop rendered it before its selector was upstream's (`app` only)."""
    labels = {
        "app": "gpu-feature-discovery",
        "app.kubernetes.io/managed-by": "gpuop",
        "app.kubernetes.io/part-of": "gpu-operator",
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "gpu-feature-discovery", "namespace": MIGRATION_NS, "labels": labels},
        "spec": {
            "selector": {"matchLabels": {"app": "gpu-feature-discovery"}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{"name": "gfd", "image": "gfd"}],
                },
            },
        },
    }


async def test_a_daemonset_whose_selector_changed_is_replaced_with_an_event(
    rest: Rest, api_client: client.ApiClient
) -> None:
    """An older gpuop's GFD DaemonSet (selector `app` only) cannot be updated to
    upstream's selector (422, immutable): it is deleted with its pods orphaned and
    created again; the old pod the new selector does not match goes, no node is
    cordoned, an Event says what happened and the policy turns ready."""
    for name in (MIGRATION_NS, WORKLOADS):
        await rest.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    gpu = sorted(
        n["metadata"]["name"]
        for n in await rest.list(NODE)
        if (n["metadata"].get("labels") or {}).get(NFD_GPU_LABEL) == "true"
    )
    try:
        old = await rest.create(DAEMONSET, _old_gpuop_gfd(gpu[0]), MIGRATION_NS)

        async def old_pod_running() -> bool:
            pods = await rest.list(POD, MIGRATION_NS, label_selector="app=gpu-feature-discovery")
            return any((p.get("status") or {}).get("phase") == "Running" for p in pods)

        await eventually(old_pod_running, timeout=60, what="old GFD pod running")
        await rest.apply(_policy())
        config = OperatorConfig(namespace=MIGRATION_NS, workers=4)
        async with (
            Watcher(api_client, workload_namespace=WORKLOADS) as watcher,
            Running(api_client, config) as run,
        ):
            await _ready(rest, MIGRATION_NS)
            await run.settle()
        assert watcher.seen.cordons == []
        live = await rest.get(DAEMONSET, "gpu-feature-discovery", MIGRATION_NS)
        assert live is not None
        assert live["metadata"]["uid"] != old["metadata"]["uid"]
        assert live["spec"]["selector"]["matchLabels"] == {
            "app": "gpu-feature-discovery",
            "app.kubernetes.io/part-of": "nvidia-gpu",
        }

        async def only_new_pods() -> bool:
            pods = await rest.list(POD, MIGRATION_NS, label_selector="app=gpu-feature-discovery")
            return bool(pods) and all(
                (p["metadata"].get("labels") or {}).get("app.kubernetes.io/part-of") == "nvidia-gpu"
                for p in pods
                if not p["metadata"].get("deletionTimestamp")
            )

        await eventually(only_new_pods, timeout=60, what="old GFD pods gone")
        events = [
            e for e in await rest.list(EVENT, MIGRATION_NS) if e["reason"] == "SelectorReplaced"
        ]
        assert len(events) == 1, events
        assert events[0]["involvedObject"]["name"] == "gpu-feature-discovery"
        assert "orphaned" in events[0]["message"]
    finally:
        await _clean(rest)


async def test_gpuop_waits_while_nvidias_operator_holds_its_lease(rest: Rest) -> None:
    """NVIDIA's operator (controller-runtime) renews the Lease `53822513.nvidia.com`:
    gpuop, holding the same Lease name by default, does not lead until it stops."""
    assert OperatorConfig().lease_names[0] == UPSTREAM_LEASE
    namespace = "gpuop-it"
    timing: dict[str, Any] = {"lease_seconds": 2, "renew_deadline": 1.0, "retry_period": 0.2}
    nvidia = LeaderElector(rest, namespace, UPSTREAM_LEASE, "gpu-operator-5d8f_nvidia", **timing)
    ours = Leases(
        [
            LeaderElector(rest, namespace, name, "gpuop-0", **timing)
            for name in OperatorConfig().lease_names
        ]
    )
    await nvidia.acquire()
    renewing = asyncio.create_task(nvidia.hold())
    waiting = asyncio.create_task(ours.acquire())
    try:
        await asyncio.sleep(5)  # more than two lease durations: NVIDIA's keeps renewing
        assert not waiting.done()
        assert not ours.leading
        lease = await rest.get(LEASE, UPSTREAM_LEASE, namespace)
        assert lease is not None
        assert lease["spec"]["holderIdentity"] == "gpu-operator-5d8f_nvidia"

        renewing.cancel()  # NVIDIA's operator is uninstalled (it stops renewing)
        await asyncio.wait_for(waiting, timeout=15)
        assert ours.leading
        for name in OperatorConfig().lease_names:
            held = await rest.get(LEASE, name, namespace)
            assert held is not None
            assert held["spec"]["holderIdentity"] == "gpuop-0", name
    finally:
        for task in (renewing, waiting):
            task.cancel()
        await ours.release()
        for name in OperatorConfig().lease_names:
            await rest.delete(LEASE, name, namespace)
