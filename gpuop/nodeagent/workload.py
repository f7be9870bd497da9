"""A validation workload pod pinned to this node: its manifest, and running it to the end.

The cuda check runs the CUDA vectorAdd sample through the NVIDIA runtime before any
device plugin exists; the plugin check may run the same sample asking the device
plugin for one GPU. Building the manifest is pure; running it needs a KubeApi.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuop.nodeagent.checks import CheckResult
from gpuop.nodeagent.kube import KubeApi, observe_pod

DEFAULT_CUDA_IMAGE = "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda11.7.1-ubuntu20.04"
CUDA_VALIDATOR = "nvidia-cuda-validator"
PLUGIN_VALIDATOR = "nvidia-device-plugin-validator"
_MAX_NAME = 63


@dataclass(frozen=True, slots=True)
class OwnerPod:
    """The validator's own pod: owning the workload lets the garbage collector clean up."""

    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    node_name: str
    namespace: str
    image: str = DEFAULT_CUDA_IMAGE
    app: str = CUDA_VALIDATOR
    runtime_class: str | None = "nvidia"
    gpu_resource: str | None = None  # ask the device plugin for one of these
    image_pull_secrets: tuple[str, ...] = ()
    priority_class: str | None = None
    owner: OwnerPod | None = None
    deadline_seconds: int = 600


def pod_name(app: str, node_name: str) -> str:
    """Stable per node and at most 63 characters (it becomes the pod's hostname)."""
    name = f"{app}-{node_name}"
    if len(name) <= _MAX_NAME:
        return name
    digest = hashlib.sha256(node_name.encode()).hexdigest()[:10]
    return f"{app}-{node_name[: _MAX_NAME - len(app) - 12].rstrip('-.')}-{digest}"


def build_pod(spec: WorkloadSpec) -> dict[str, Any]:
    """The workload pod's manifest: pinned by ``nodeName``, tolerating every taint."""
    env = [{"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"}]
    resources: dict[str, Any] = {}
    if spec.gpu_resource:
        resources = {"limits": {spec.gpu_resource: "1"}}
    else:
        env.insert(0, {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"})
    container: dict[str, Any] = {
        "name": spec.app.removeprefix("nvidia-"),
        "image": spec.image,
        "imagePullPolicy": "IfNotPresent",
        "env": env,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    if resources:
        container["resources"] = resources
    metadata: dict[str, Any] = {
        "name": pod_name(spec.app, spec.node_name),
        "namespace": spec.namespace,
        "labels": {
            "app": spec.app,
            "app.kubernetes.io/managed-by": "gpuop",
            "app.kubernetes.io/component": "node-agent",
        },
    }
    if spec.owner is not None:
        metadata["ownerReferences"] = [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": spec.owner.name,
                "uid": spec.owner.uid,
                "blockOwnerDeletion": False,
            }
        ]
    pod_spec: dict[str, Any] = {
        "nodeName": spec.node_name,
        "restartPolicy": "Never",
        "activeDeadlineSeconds": spec.deadline_seconds,
        "automountServiceAccountToken": False,
        "tolerations": [{"operator": "Exists"}],
        "containers": [container],
    }
    if spec.runtime_class:
        pod_spec["runtimeClassName"] = spec.runtime_class
    if spec.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in spec.image_pull_secrets]
    if spec.priority_class:
        pod_spec["priorityClassName"] = spec.priority_class
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


async def _wait_gone(api: KubeApi, namespace: str, name: str, timeout_s: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while await api.get_pod(namespace, name) is not None:
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(1.0)
    return True


async def run_pod(
    api: KubeApi,
    manifest: Mapping[str, Any],
    *,
    timeout_s: float = 300.0,
    poll_s: float = 2.0,
) -> CheckResult:
    """Create the pod, wait for it to succeed or fail, and always delete it afterwards."""
    namespace = manifest["metadata"]["namespace"]
    name = manifest["metadata"]["name"]
    await api.delete_pod(namespace, name)  # a leftover from an interrupted attempt
    if not await _wait_gone(api, namespace, name, timeout_s=60.0):
        return CheckResult.failed(f"previous pod {namespace}/{name} is still terminating")
    await api.create_pod(namespace, manifest)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    try:
        while True:
            pod = await api.get_pod(namespace, name)
            if pod is None:
                return CheckResult.failed(f"pod {namespace}/{name} disappeared")
            seen = observe_pod(pod)
            if seen.phase == "Succeeded":
                return CheckResult.passed(facts={"POD": name})  # cuda-ready is empty
            if seen.phase == "Failed":
                return CheckResult.failed(f"pod {namespace}/{name} failed: {seen.reason}")
            if loop.time() >= deadline:
                return CheckResult.failed(
                    f"pod {namespace}/{name} not done after {timeout_s:g}s: {seen.reason}"
                )
            await asyncio.sleep(poll_s)
    finally:
        await api.delete_pod(namespace, name)
