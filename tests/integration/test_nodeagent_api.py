"""The validator's cluster-facing checks against the real API server: the CUDA
workload pod runs to completion on a simulated GPU node, and the plugin check
reads the node's allocatable GPUs."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes_asyncio import client

from gpuop.nodeagent.cuda import CudaCheck
from gpuop.nodeagent.kube import KubernetesApi
from gpuop.nodeagent.plugin import PluginCheck
from gpuop.nodeagent.status import StatusFiles
from gpuop.nodeagent.validate import Validator
from gpuop.nodeagent.workload import WorkloadSpec
from gpuop.rest import Rest, by_kind

pytestmark = pytest.mark.integration


async def test_cuda_and_plugin_checks_pass_on_a_gpu_node(
    rest: Rest, api_client: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    await rest.apply(
        {
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": "nvidia"},
            "handler": "nvidia",
        }
    )
    kube = KubernetesApi(api_client)
    node = "gpu-node-0001"
    status = StatusFiles(tmp_path)
    validator = Validator(
        [
            CudaCheck(kube, WorkloadSpec(node_name=node, namespace=namespace), poll_s=0.2),
            PluginCheck(kube, node, poll_s=0.2),
        ],
        status,
    )
    assert await validator.run_once(), {k: v.reason for k, v in validator.last.items()}
    assert status.read("cuda") == {}  # empty, as upstream's
    assert status.read("plugin") == {}
    assert "nvidia.com/gpu" in validator.last["plugin"].facts["RESOURCES"]
    # The one-shot pod is cleaned up after it succeeded.
    pods = await rest.list(by_kind("v1", "Pod"), namespace)
    assert pods == []


async def test_plugin_check_fails_on_a_node_without_gpus(
    api_client: client.ApiClient, tmp_path: Path
) -> None:
    status = StatusFiles(tmp_path)
    validator = Validator([PluginCheck(KubernetesApi(api_client), "cpu-node-0000")], status)
    assert not await validator.run_once()
    assert "nvidia.com/gpu" in validator.last["plugin"].reason
    assert status.read("plugin") is None
