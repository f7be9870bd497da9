"""The operator against the real control plane: labels, ordered rollout, status,
zero writes when nothing changes, user overrides, invalid and extra policies."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from kubernetes_asyncio import client

import crd
from components._k8s import MANAGED_BY, MANAGED_BY_LABEL
from components.keys import (
    DEPLOY_DCGM_EXPORTER_LABEL,
    DEPLOY_DRIVER_LABEL,
    GPU_PRESENT_LABEL,
    MIG_CONFIG_LABEL,
)
from components.registry import DEPLOY_LABELS
from gpuop.devcluster import NFD_GPU_LABEL
from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Rest
from gpuop.operator.controller.wiring.operator import OPERAND_SELECTOR
from statemachine.upgrade_keys import MANAGED_ANNOTATIONS, STATE_LABEL
from tests.conftest import TEST_GPU_NODES
from tests.integration.harness import NAMESPACE, NODE, POLICY, Running, eventually, policy_state_is

pytestmark = pytest.mark.integration

DS = by_kind("apps/v1", "DaemonSet")
POD = by_kind("v1", "Pod")


async def _policy(rest: Rest, name: str = "cluster-policy") -> dict[str, Any] | None:
    return await rest.get(POLICY, name)


async def _state(rest: Rest, name: str = "cluster-policy") -> str | None:
    got = await _policy(rest, name)
    return ((got or {}).get("status") or {}).get("state")


async def _node_labels(rest: Rest) -> dict[str, dict[str, str]]:
    return {n["metadata"]["name"]: n["metadata"].get("labels", {}) for n in await rest.list(NODE)}


async def _fresh_nodes(rest: Rest) -> None:
    """Nodes as a new cluster has them: earlier modules leave their labels and
    annotations on the nodes (an operator stopped before its policy was deleted)."""

    async def no_operand_pods() -> bool:
        return not await rest.list(POD, NAMESPACE, label_selector=OPERAND_SELECTOR)

    assert await eventually(no_operand_pods, timeout=60)
    ours = {GPU_PRESENT_LABEL, MIG_CONFIG_LABEL, STATE_LABEL, *DEPLOY_LABELS}
    for node in await rest.list(NODE):
        meta = node["metadata"]
        labels = {k: None for k in meta.get("labels") or {} if k in ours}
        notes = {k: None for k in meta.get("annotations") or {} if k in MANAGED_ANNOTATIONS}
        if labels or notes:
            patch = {"metadata": {"labels": labels, "annotations": notes}}
            await rest.merge_patch(NODE, meta["name"], patch)


async def test_policy_rolls_out_in_order_and_converges_with_zero_writes(
    rest: Rest, api_client: client.ApiClient
) -> None:
    await _fresh_nodes(rest)
    policy = crd.sample_policy()
    await rest.apply(policy)
    async with Running(api_client) as run:
        assert await eventually(lambda: policy_state_is(rest, "ready"), timeout=90)
        status = (await _policy(rest))["status"]  # type: ignore[index]
        assert status["namespace"] == NAMESPACE
        assert status["rolloutState"] == "ready"
        states = {c["name"]: c["state"] for c in status["components"]}
        assert states["driver"] == "ready"
        assert states["device-plugin"] == "ready"
        assert states["node-status-exporter"] == "disabled"
        assert [c["name"] for c in status["components"]][:3] == [
            "pre-requisites",
            "operator-metrics",
            "driver",
        ]

        labels = await _node_labels(rest)
        gpu = {n for n, lab in labels.items() if lab.get(NFD_GPU_LABEL) == "true"}
        assert len(gpu) == TEST_GPU_NODES
        for name, lab in labels.items():
            if name in gpu:
                assert lab[GPU_PRESENT_LABEL] == "true"
                assert lab[DEPLOY_DRIVER_LABEL] == "true"
                assert lab[STATE_LABEL] == "upgrade-done"
            else:
                assert GPU_PRESENT_LABEL not in lab
                assert not any(k.startswith("nvidia.com/gpu.deploy.") for k in lab)

        daemonsets = await rest.list(DS, NAMESPACE)
        by_name = {d["metadata"]["name"]: d for d in daemonsets}
        driver = by_name["nvidia-driver-daemonset"]
        assert driver["spec"]["updateStrategy"]["type"] == "OnDelete"
        owners = driver["metadata"]["ownerReferences"]
        assert [(o["kind"], o["name"]) for o in owners] == [("ClusterPolicy", "cluster-policy")]
        assert driver["status"]["numberReady"] == TEST_GPU_NODES

        # One write per GPU node: its deploy labels and first upgrade state together.
        assert run.rest.write_counts()["PATCH nodes"] == len(gpu), run.rest.write_counts()

        # Converged: a full pass over every key writes nothing.
        await run.settle()
        before = run.rest.writes
        run.operator.queue.add("cluster")
        for name in labels:
            run.operator.queue.add(f"node/{name}")
        await run.settle()
        assert run.rest.writes == before, run.rest.write_counts()

        # Idle: watch-driven, no timers. Nothing at all is requested while nothing changes.
        idle_before = dict(run.rest.counts)
        await asyncio.sleep(5)
        assert dict(run.rest.counts) == idle_before

    # A restarted operator finds everything in place and writes nothing.
    async with Running(api_client) as again:
        await again.settle()
        assert again.rest.writes == 0, again.rest.write_counts()
        assert again.operator.metrics.reconciliation_status._value.get() == 1


async def test_user_false_label_wins_and_disabling_a_component_removes_its_daemonset(
    rest: Rest, api_client: client.ApiClient
) -> None:
    await rest.apply(crd.sample_policy())
    gpu_node = "gpu-node-0000"
    async with Running(api_client) as run:
        await eventually(lambda: policy_state_is(rest, "ready"), timeout=90)
        await rest.merge_patch(
            NODE, gpu_node, {"metadata": {"labels": {DEPLOY_DCGM_EXPORTER_LABEL: "false"}}}
        )

        async def exporter_gone_from_node() -> bool:
            pods = await rest.list(
                by_kind("v1", "Pod"), NAMESPACE, label_selector="app=nvidia-dcgm-exporter"
            )
            return all(p["spec"].get("nodeName") != gpu_node for p in pods)

        assert await eventually(exporter_gone_from_node)
        await run.settle()
        assert (await _node_labels(rest))[gpu_node][DEPLOY_DCGM_EXPORTER_LABEL] == "false"

        policy = copy.deepcopy(crd.sample_policy())
        policy["spec"].setdefault("dcgmExporter", {})["enabled"] = False
        await rest.apply(policy)

        async def exporter_deleted() -> bool:
            return await rest.get(DS, "nvidia-dcgm-exporter", NAMESPACE) is None

        assert await eventually(exporter_deleted)
        await run.settle()
        labels = await _node_labels(rest)
        # The user's "false" stays; like upstream, the other GPU nodes keep the deploy
        # label of a disabled operand (its DaemonSet is gone, so nothing runs there).
        assert labels[gpu_node][DEPLOY_DCGM_EXPORTER_LABEL] == "false"
        others = [
            lab for name, lab in labels.items() if name != gpu_node and GPU_PRESENT_LABEL in lab
        ]
        assert others
        assert all(lab[DEPLOY_DCGM_EXPORTER_LABEL] == "true" for lab in others)
        status = (await _policy(rest))["status"]  # type: ignore[index]
        assert {c["name"]: c["state"] for c in status["components"]}["dcgm-exporter"] == "disabled"
    await rest.merge_patch(
        NODE, gpu_node, {"metadata": {"labels": {DEPLOY_DCGM_EXPORTER_LABEL: None}}}
    )


async def test_semantic_error_is_reported_and_a_second_policy_is_ignored(
    rest: Rest, api_client: client.ApiClient
) -> None:
    await rest.apply(crd.sample_policy())
    async with Running(api_client) as run:
        await eventually(lambda: policy_state_is(rest, "ready"), timeout=90)
        second = copy.deepcopy(crd.sample_policy())
        second["metadata"]["name"] = "second-policy"
        await rest.apply(second)
        assert await eventually(lambda: policy_state_is(rest, "ignored", "second-policy"))
        ignored = (await _policy(rest, "second-policy"))["status"]  # type: ignore[index]
        ready = next(c for c in ignored["conditions"] if c["type"] == "Ready")
        assert "cluster-policy" in ready["message"]
        await rest.delete(POLICY, "second-policy")

        bad = copy.deepcopy(crd.sample_policy())
        bad["spec"]["driver"] = {
            **bad["spec"].get("driver", {}),
            "upgradePolicy": {"drain": {"podSelector": "app in (a"}},
        }
        await rest.apply(bad)

        async def error_condition() -> dict[str, Any] | None:
            status = ((await _policy(rest)) or {}).get("status") or {}
            errors = [c for c in status.get("conditions", []) if c["type"] == "Error"]
            return errors[0] if errors and errors[0]["status"] == "True" else None

        error = await eventually(error_condition)
        assert "spec.driver.upgradePolicy.drain.podSelector" in error["message"]
        assert (await _state(rest)) == "notReady"
        # Nothing crashed or looped: the queue settles and stays idle.
        await run.settle()
        assert run.operator.metrics.reconciliation_status._value.get() == -2
        events = await rest.list(by_kind("v1", "Event"), "default")
        warnings = [
            e
            for e in events
            if e["involvedObject"]["kind"] == "ClusterPolicy" and e["type"] == "Warning"
        ]
        assert any("podSelector" in e["message"] for e in warnings)
    await rest.apply(crd.sample_policy())


async def test_policy_pod_labels_win_and_the_operator_still_finds_its_pods(
    rest: Rest, api_client: client.ApiClient
) -> None:
    """Upstream's chart policy labels operand pods `managed-by: gpu-operator`: the pods
    carry it (as upstream's), and the operator, which finds operand pods by `part-of`,
    still sees them Ready and turns the policy ready."""
    policy = copy.deepcopy(crd.sample_policy())
    labels = {MANAGED_BY_LABEL: "gpu-operator", "helm.sh/chart": "gpu-operator-v26.7.0"}
    policy["spec"].setdefault("daemonsets", {})["labels"] = labels
    await rest.apply(policy)
    async with Running(api_client):

        async def relabelled_and_ready() -> bool:
            pods = await rest.list(POD, NAMESPACE, label_selector=OPERAND_SELECTOR)
            relabelled = bool(pods) and all(
                labels.items() <= p["metadata"]["labels"].items() for p in pods
            )
            return relabelled and await policy_state_is(rest, "ready")

        assert await eventually(relabelled_and_ready, timeout=180)
        driver = await rest.get(DS, "nvidia-driver-daemonset", NAMESPACE)
        assert driver is not None
        assert driver["metadata"]["labels"][MANAGED_BY_LABEL] == MANAGED_BY  # ours: watched
    await rest.apply(crd.sample_policy())
