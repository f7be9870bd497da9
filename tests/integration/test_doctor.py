"""`gpuop doctor` against the real control plane, the rules over the API's objects: each
signature is built on the local cluster (pods and their status, Events, nodes, policies,
alert rules) and the command, run as a user would, prints that finding's line and exits
1; before the signature is built the line is absent. The pods are bare pods carrying
operand labels, their status patched as NVIDIA's images would leave it
(``doctor_support``)."""

from __future__ import annotations

import copy
import time
from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio import client

import crd
from components.monitoring import rule_groups
from gpuop.devcluster import ClusterInfo
from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Rest
from tests.integration.doctor_support import (
    GPU_NODE,
    bare_pod,
    clear_daemonsets,
    delete_pods,
    doctor,
    driver_pod,
    of_rule,
    patch_status,
    running,
)
from tests.integration.harness import NAMESPACE, NODE, POLICY, Running, eventually
from tests.integration.test_service_monitor import RULE_CRD_NAME, _crd

pytestmark = pytest.mark.integration

EVENT = by_kind("v1", "Event")
CRD = by_kind("apiextensions.k8s.io/v1", "CustomResourceDefinition")
NFD_LABELS = (
    "feature.node.kubernetes.io/pci-10de.present",
    "feature.node.kubernetes.io/pci-0302_10de.present",
    "feature.node.kubernetes.io/pci-0300_10de.present",
)


@pytest.fixture(autouse=True)
async def no_daemonsets(rest: Rest) -> AsyncIterator[None]:
    await clear_daemonsets(rest)
    yield
    await clear_daemonsets(rest)


@pytest.fixture
async def cleanup(rest: Rest) -> AsyncIterator[list[tuple[str, str]]]:
    """Pods (namespace, name) to delete after the test."""
    made: list[tuple[str, str]] = []
    yield made
    await delete_pods(rest, made)


MANAGER_FAILED = {
    "name": "k8s-driver-manager",
    "image": "nvcr.io/k8s-driver-manager:v0",
    "imageID": "",
    "ready": False,
    "restartCount": 3,
    "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}},
    "lastState": {
        "terminated": {
            "exitCode": 1,
            "reason": "Error",
            "message": "cannot proceed until all GPU pods are drained from the node",
            "startedAt": "2026-01-01T00:00:00Z",
            "finishedAt": "2026-01-01T00:00:01Z",
        }
    },
}


async def test_driver_in_use_names_the_pods_holding_the_gpus(
    local_cluster: ClusterInfo, rest: Rest, namespace: str, cleanup: list[tuple[str, str]]
) -> None:
    driver = await running(rest, driver_pod(GPU_NODE, "in-use"))
    cleanup.append((NAMESPACE, driver["metadata"]["name"]))
    gpu = {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}}
    train = bare_pod("train-0", namespace, GPU_NODE)
    train["spec"]["containers"][0]["resources"] = gpu
    await running(rest, train)

    _, lines = await doctor(local_cluster)
    assert not of_rule(lines, "driver-in-use"), lines  # a manager that has not failed

    await patch_status(
        rest, driver["metadata"]["name"], {"initContainerStatuses": [MANAGER_FAILED]}
    )
    code, lines = await doctor(local_cluster)
    assert code == 1
    (line,) = of_rule(lines, "driver-in-use")
    assert f"node {GPU_NODE}" in line
    assert "1 pod(s) hold its GPUs" in line
    assert f"pod/{namespace}/train-0" in line
    assert f"pod/{NAMESPACE}/{driver['metadata']['name']}" in line
    assert "cannot proceed until all GPU pods are drained" in line
    assert "ENABLE_GPU_POD_EVICTION=true" in line


async def test_missing_tag_names_the_image_section_and_nodes(
    local_cluster: ClusterInfo, rest: Rest, cleanup: list[tuple[str, str]]
) -> None:
    image = "nvcr.io/nvidia/k8s-device-plugin:v0.99.0-doctor"
    names = []
    for node in ("gpu-node-0002", "gpu-node-0003"):
        pod = bare_pod(
            f"nvidia-device-plugin-daemonset-doctor-{node[-1]}",
            NAMESPACE,
            node,
            labels={"app": "nvidia-device-plugin-daemonset"},
            containers=[{"name": "nvidia-device-plugin", "image": image}],
        )
        await running(rest, pod)
        cleanup.append((NAMESPACE, pod["metadata"]["name"]))
        names.append(pod["metadata"]["name"])
    _, lines = await doctor(local_cluster)
    assert not [line for line in lines if image in line], lines

    waiting = {
        "reason": "ImagePullBackOff",
        "message": f'Back-off pulling image "{image}": ErrImagePull: failed to resolve'
        f' reference "{image}": {image}: not found',
    }
    for name in names:
        status = {
            "name": "nvidia-device-plugin",
            "image": image,
            "imageID": "",
            "ready": False,
            "restartCount": 0,
            "state": {"waiting": waiting},
        }
        await patch_status(rest, name, {"containerStatuses": [status]})
    code, lines = await doctor(local_cluster)
    assert code == 1
    (line,) = of_rule(lines, "missing-tag")
    assert f"image/{image}" in line
    assert "node/gpu-node-0002, node/gpu-node-0003" in line
    assert "devicePlugin.version" in line


async def test_toolkit_configuring_another_runtime(
    local_cluster: ClusterInfo, rest: Rest, cleanup: list[tuple[str, str]]
) -> None:
    """The simulated nodes run containerd; a toolkit told docker (upstream's
    operator.defaultRuntime default) configures a runtime the node does not run, and a
    pod whose sandbox the runtime refuses for want of the nvidia handler is reported."""
    for runtime in ("containerd", "docker"):
        name = f"nvidia-container-toolkit-daemonset-doctor-{runtime}"
        pod = bare_pod(
            name,
            NAMESPACE,
            GPU_NODE,
            labels={"app": "nvidia-container-toolkit-daemonset"},
            containers=[
                {"name": "ctr", "image": "t", "env": [{"name": "RUNTIME", "value": runtime}]}
            ],
        )
        await running(rest, pod)
        cleanup.append((NAMESPACE, name))
        _, lines = await doctor(local_cluster)
        if runtime == "containerd":
            assert not of_rule(lines, "toolkit-runtime-mismatch"), lines
    (line,) = of_rule(lines, "toolkit-runtime-mismatch")
    assert f"configures docker but node {GPU_NODE} runs containerd" in line
    assert f"pod/{NAMESPACE}/nvidia-container-toolkit-daemonset-doctor-docker" in line

    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    plugin = "nvidia-device-plugin-daemonset-doctor"
    event_name = f"{plugin}.{time.time_ns():x}"
    await rest.create(
        EVENT,
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": event_name},
            "involvedObject": {"kind": "Pod", "namespace": NAMESPACE, "name": plugin},
            "reason": "FailedCreatePodSandBox",
            "message": "Failed to create pod sandbox: rpc error: code = Unknown desc = failed"
            ' to get sandbox runtime: no runtime for "nvidia" is configured',
            "type": "Warning",
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "source": {"component": "kubelet", "host": GPU_NODE},
        },
        NAMESPACE,
    )
    try:
        code, lines = await doctor(local_cluster)
    finally:
        await rest.delete(EVENT, event_name, NAMESPACE)  # the later tests' runs must not see it
    assert code == 1
    refused = [line for line in of_rule(lines, "toolkit-runtime-mismatch") if "handler" in line]
    assert len(refused) == 1, lines
    assert f"[pod/{NAMESPACE}/{plugin}]" in refused[0]


async def test_nfd_labels_missing_as_the_operator_reports_it(
    local_cluster: ClusterInfo, rest: Rest, api_client: client.ApiClient
) -> None:
    await rest.apply(crd.sample_policy())
    _, lines = await doctor(local_cluster)
    assert not of_rule(lines, "nfd-labels-missing"), lines

    saved = {}
    for node in await rest.list(NODE):
        labels = node["metadata"].get("labels") or {}
        found = {k: labels[k] for k in NFD_LABELS if k in labels}
        if found:
            saved[node["metadata"]["name"]] = found
            patch = {"metadata": {"labels": dict.fromkeys(found)}}
            await rest.merge_patch(NODE, node["metadata"]["name"], patch)
    assert saved
    try:
        async with Running(api_client):

            async def reported() -> bool:
                got = await rest.get(POLICY, "cluster-policy") or {}
                conditions = (got.get("status") or {}).get("conditions") or []
                return any(c.get("reason") == "NFDLabelsMissing" for c in conditions)

            await eventually(reported, timeout=60, what="NFDLabelsMissing")
        code, lines = await doctor(local_cluster)
    finally:
        for name, labels in saved.items():
            await rest.merge_patch(NODE, name, {"metadata": {"labels": labels}})
        await rest.delete(POLICY, "cluster-policy")
    assert code == 1
    (line,) = of_rule(lines, "nfd-labels-missing")
    assert "clusterpolicy/cluster-policy" in line
    assert "nfd.enabled=true" in line


async def test_node_status_exporter_off_with_its_alerts_installed(
    local_cluster: ClusterInfo, rest: Rest
) -> None:
    await rest.apply(_crd("prometheusrules", "PrometheusRule"))
    rule = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "doctor-node-alerts", "namespace": NAMESPACE},
        "spec": {"groups": rule_groups(node=True)},
    }
    try:

        async def served() -> bool:
            return await rest.api_resource_exists("monitoring.coreos.com/v1", "prometheusrules")

        await eventually(served, timeout=30, what="PrometheusRule served")
        await rest.apply(rule)
        policy = copy.deepcopy(crd.sample_policy())
        policy["spec"]["nodeStatusExporter"] = {"enabled": False}
        await rest.apply(policy)
        code, lines = await doctor(local_cluster)
        assert code == 1
        (line,) = of_rule(lines, "node-status-exporter-off")
        assert f"prometheusrule/{NAMESPACE}/doctor-node-alerts" in line
        assert "nodeStatusExporter.enabled=true" in line

        policy["spec"]["nodeStatusExporter"] = {"enabled": True}
        await rest.apply(policy)
        _, lines = await doctor(local_cluster)
        assert not of_rule(lines, "node-status-exporter-off"), lines
    finally:
        await rest.delete(POLICY, "cluster-policy")
        await rest.delete(CRD, RULE_CRD_NAME)
