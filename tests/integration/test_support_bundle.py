"""`gpuop support-bundle` against the real control plane, with a policy rolled out by
the operator: the archive holds the policies with their status, the operand objects,
the nodes' labels, Events about nodes and policies, a note for each log the simulated
nodes cannot serve (kwok runs no kubelet), and a manifest indexing it all; ConfigMaps
only by name, and nothing of any Secret."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

import crd
from gpuop.devcluster import ClusterInfo
from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Rest
from tests.conftest import TEST_NODES
from tests.integration.harness import NAMESPACE, Running, eventually

pytestmark = pytest.mark.integration

DS = by_kind("apps/v1", "DaemonSet")
POD = by_kind("v1", "Pod")
EVENT = by_kind("v1", "Event")
CONFIG_MAP = by_kind("v1", "ConfigMap")
SECRET_VALUE = "s3cret-never-in-a-bundle"
CONFIG_VALUE = "configmap-data-never-in-a-bundle"


def _members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path, "r:gz") as tar:
        return {
            m.name.split("/", 1)[1]: tar.extractfile(m).read()  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.isfile()
        }


async def _objects(rest: Rest) -> None:
    """A Secret and a ConfigMap whose data must stay out, an Event about the policy."""
    core = client.CoreV1Api(rest.api)
    secret = client.V1Secret(
        metadata=client.V1ObjectMeta(name="bundle-secret"), string_data={"token": SECRET_VALUE}
    )
    existing = await core.list_namespaced_secret(
        NAMESPACE, field_selector="metadata.name=bundle-secret"
    )
    if not existing.items:
        await core.create_namespaced_secret(NAMESPACE, secret)
    await rest.apply(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "bundle-config", "namespace": NAMESPACE},
            "data": {"key": CONFIG_VALUE},
        }
    )
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    await rest.create(
        EVENT,
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"cluster-policy.bundle{time.time_ns():x}"},
            "involvedObject": {
                "apiVersion": "nvidia.com/v1",
                "kind": "ClusterPolicy",
                "name": "cluster-policy",
            },
            "reason": "BundleTest",
            "message": "an event about the policy",
            "type": "Normal",
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "source": {"component": "gpuop-tests"},
        },
        "default",
    )


async def test_support_bundle_collects_the_cluster(
    local_cluster: ClusterInfo, rest: Rest, api_client: client.ApiClient, tmp_path: Path
) -> None:
    await rest.apply(crd.sample_policy())
    await _objects(rest)
    async with Running(api_client):

        async def operands() -> bool:
            return bool(await rest.list(POD, NAMESPACE)) and bool(await rest.list(DS, NAMESPACE))

        assert await eventually(operands, timeout=90)
        output = tmp_path / "bundle.tar.gz"
        proc = await asyncio.to_thread(
            subprocess.run,
            [
                sys.executable,
                "-m",
                "gpuop",
                "support-bundle",
                "--kubeconfig",
                str(local_cluster.kubeconfig),
                "--namespace",
                NAMESPACE,
                "--since",
                "10m",
                "--output",
                str(output),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    assert proc.returncode == 0, proc.stderr
    assert f"support bundle: {output}" in proc.stdout
    assert "support-bundle" in proc.stderr  # the progress line
    assert "Traceback" not in proc.stderr

    files = _members(output)
    manifest = json.loads(files["manifest.json"])
    assert manifest["namespace"] == NAMESPACE
    assert manifest["sinceSeconds"] == 600
    assert manifest["server"]
    assert set(manifest["files"]) == set(files) - {"manifest.json"}

    def load(name: str) -> Any:
        return json.loads(files[name])

    (policy,) = load("cluster/clusterpolicies.json")
    assert policy["metadata"]["name"] == "cluster-policy"
    assert "managedFields" not in policy["metadata"]
    assert policy["status"]["state"]  # with its status
    assert load("cluster/nvidiadrivers.json") == []
    assert isinstance(load("cluster/gpuclusters.json"), list)

    daemonsets = {d["metadata"]["name"] for d in load("namespace/daemonsets.json")}
    assert "nvidia-driver-daemonset" in daemonsets
    pods = load("namespace/pods.json")
    assert pods
    assert all(p["metadata"]["namespace"] == NAMESPACE for p in pods)
    assert isinstance(load("namespace/deployments.json"), list)
    assert "bundle-config" in load("namespace/configmaps.json")

    nodes = load("nodes.json")
    assert len(nodes) == TEST_NODES
    assert {"name", "labels", "annotations", "taints", "conditions"} <= set(nodes[0])
    assert any(n["labels"].get("nvidia.com/gpu.deploy.driver") == "true" for n in nodes)

    events = load("events.json")
    assert any(
        e["involvedObject"]["kind"] == "ClusterPolicy" and e["reason"] == "BundleTest"
        for e in events
    )

    # Simulated nodes serve no logs: a note per container, never a failed bundle.
    log_files = [name for name in files if name.startswith("logs/")]
    assert log_files
    pod = pods[0]["metadata"]["name"]
    assert any(name.startswith(f"logs/{pod}/") for name in log_files)
    for name in log_files:
        if name.endswith(".unavailable.txt"):
            assert manifest["files"][name]["note"]

    everything = b"".join(files.values())
    assert SECRET_VALUE.encode() not in everything
    assert CONFIG_VALUE.encode() not in everything
    assert b"bundle-secret" not in everything


async def test_support_bundle_without_a_cluster_is_one_error_line(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
    )
    output = tmp_path / "bundle.tar.gz"
    proc = await asyncio.to_thread(
        subprocess.run,
        [
            sys.executable,
            "-m",
            "gpuop",
            "support-bundle",
            "--kubeconfig",
            str(kubeconfig),
            "--output",
            str(output),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert "gpuop: error:" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not output.exists()
