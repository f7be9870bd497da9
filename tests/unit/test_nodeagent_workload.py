"""The cuda and plugin checks: workload pod manifests, pod outcomes, allocatable."""

from __future__ import annotations

from typing import Any

import pytest

from gpuop.nodeagent.cuda import CudaCheck
from gpuop.nodeagent.kube import KubeError, observe_pod
from gpuop.nodeagent.kube_memory import InMemoryKube
from gpuop.nodeagent.plugin import PluginCheck, gpu_allocatable
from gpuop.nodeagent.workload import (
    DEFAULT_CUDA_IMAGE,
    OwnerPod,
    WorkloadSpec,
    build_pod,
    pod_name,
    run_pod,
)

NS = "gpu-operator"
SPEC = WorkloadSpec(node_name="gpu-node-1", namespace=NS)


def test_cuda_pod_is_pinned_and_uses_the_runtime() -> None:
    pod = build_pod(SPEC)
    spec = pod["spec"]
    assert pod["metadata"]["name"] == "nvidia-cuda-validator-gpu-node-1"
    assert pod["metadata"]["labels"]["app"] == "nvidia-cuda-validator"
    assert spec["nodeName"] == "gpu-node-1"
    assert spec["restartPolicy"] == "Never"
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["tolerations"] == [{"operator": "Exists"}]
    (container,) = spec["containers"]
    assert container["image"] == DEFAULT_CUDA_IMAGE
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"} in container["env"]
    assert "resources" not in container
    assert container["securityContext"]["allowPrivilegeEscalation"] is False


def test_pod_options() -> None:
    pod = build_pod(
        WorkloadSpec(
            node_name="n",
            namespace=NS,
            image="registry.local/cuda-sample:v1",
            runtime_class=None,
            gpu_resource="nvidia.com/mig-1g.10gb",
            image_pull_secrets=("regcred",),
            priority_class="system-node-critical",
            owner=OwnerPod("nvidia-operator-validator-abcde", "uid-1"),
        )
    )
    spec = pod["spec"]
    assert "runtimeClassName" not in spec
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert spec["priorityClassName"] == "system-node-critical"
    (container,) = spec["containers"]
    assert container["resources"] == {"limits": {"nvidia.com/mig-1g.10gb": "1"}}
    assert all(e["name"] != "NVIDIA_VISIBLE_DEVICES" for e in container["env"])
    (owner,) = pod["metadata"]["ownerReferences"]
    assert owner["uid"] == "uid-1"


def test_pod_name_fits_a_label_for_long_node_names() -> None:
    node = "ip-10-0-0-1.eu-west-1.compute.internal.example-cluster.very-long"
    name = pod_name("nvidia-cuda-validator", node)
    assert len(name) <= 63
    assert name != pod_name("nvidia-cuda-validator", node + "x")
    assert name == pod_name("nvidia-cuda-validator", node)


@pytest.mark.parametrize(
    ("status", "phase", "reason"),
    [
        ({"phase": "Succeeded"}, "Succeeded", "phase Succeeded"),
        (
            {
                "phase": "Pending",
                "containerStatuses": [
                    {
                        "name": "cuda-validator",
                        "state": {"waiting": {"reason": "ImagePullBackOff", "message": "nope"}},
                    }
                ],
            },
            "Pending",
            "container cuda-validator waiting: ImagePullBackOff: nope",
        ),
        (
            {
                "phase": "Failed",
                "containerStatuses": [
                    {
                        "name": "cuda-validator",
                        "state": {"terminated": {"reason": "Error", "exitCode": 1}},
                    }
                ],
            },
            "Failed",
            "container cuda-validator Error (exit code 1)",
        ),
        (
            {
                "phase": "Failed",
                "reason": "UnexpectedAdmissionError",
                "message": "Allocate failed\ndue to no devices",
            },
            "Failed",
            "UnexpectedAdmissionError Allocate failed due to no devices",
        ),
        (
            {
                "phase": "Pending",
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "0/1 nodes",
                    }
                ],
            },
            "Pending",
            "not scheduled: Unschedulable 0/1 nodes",
        ),
        ({}, "Pending", "phase Pending"),
    ],
)
def test_observe_pod(status: dict[str, Any], phase: str, reason: str) -> None:
    seen = observe_pod({"status": status})
    assert seen.phase == phase
    assert seen.reason == reason


async def test_cuda_check_succeeds_and_cleans_up() -> None:
    kube = InMemoryKube()
    result = await CudaCheck(kube, SPEC, poll_s=0).run()
    assert result.ok, result.reason
    (created,) = kube.created
    assert created["spec"]["nodeName"] == "gpu-node-1"
    assert kube.pods == {}
    assert kube.deleted == [(NS, "nvidia-cuda-validator-gpu-node-1")]


async def test_cuda_check_reports_the_pods_reason() -> None:
    failed = {
        "phase": "Failed",
        "containerStatuses": [
            {
                "name": "cuda-validator",
                "state": {
                    "terminated": {
                        "reason": "Error",
                        "exitCode": 1,
                        "message": "Failed to allocate device vector A"
                        " (error code no CUDA-capable device)",
                    }
                },
            }
        ],
    }
    kube = InMemoryKube(pod_statuses=({"phase": "Pending"}, failed))
    result = await CudaCheck(kube, SPEC, poll_s=0).run()
    assert not result.ok
    assert "failed: container cuda-validator Error (exit code 1)" in result.reason
    assert "no CUDA-capable device" in result.reason
    assert kube.pods == {}


async def test_cuda_check_times_out_with_the_waiting_reason() -> None:
    stuck = {
        "phase": "Pending",
        "containerStatuses": [
            {"name": "cuda-validator", "state": {"waiting": {"reason": "ErrImagePull"}}}
        ],
    }
    kube = InMemoryKube(pod_statuses=(stuck,))
    result = await CudaCheck(kube, SPEC, timeout_s=0.05, poll_s=0.01).run()
    assert not result.ok
    assert "not done after 0.05s" in result.reason
    assert "ErrImagePull" in result.reason
    assert kube.pods == {}


async def test_cuda_check_replaces_a_leftover_pod() -> None:
    kube = InMemoryKube()
    await kube.create_pod(NS, build_pod(SPEC))
    result = await CudaCheck(kube, SPEC, poll_s=0).run()
    assert result.ok, result.reason
    assert len(kube.created) == 2


async def test_run_pod_api_error_propagates_as_kube_error() -> None:
    kube = InMemoryKube()
    kube.error = KubeError("API error 403: Forbidden")
    with pytest.raises(KubeError):
        await run_pod(kube, build_pod(SPEC), poll_s=0)


def test_gpu_allocatable() -> None:
    assert gpu_allocatable(
        {
            "cpu": "8",
            "nvidia.com/gpu": "4",
            "nvidia.com/mig-1g.10gb": "7",
            "nvidia.com/mig-2g.20gb": "0",
            "nvidia.com/gpu.shared": "8",
            "nvidia.com/mig-bad": "1k",
        }
    ) == {"nvidia.com/gpu": 4, "nvidia.com/mig-1g.10gb": 7}


@pytest.mark.parametrize(
    "allocatable",
    [{"nvidia.com/gpu": "8"}, {"nvidia.com/gpu": "0", "nvidia.com/mig-3g.40gb": "2"}],
)
async def test_plugin_passes(allocatable: dict[str, str]) -> None:
    kube = InMemoryKube({"gpu-node-1": {"cpu": "8", **allocatable}})
    result = await PluginCheck(kube, "gpu-node-1").run()
    assert result.ok, result.reason
    assert kube.created == []


async def test_plugin_fails_without_gpus_or_node() -> None:
    kube = InMemoryKube({"gpu-node-1": {"cpu": "8", "nvidia.com/gpu": "0"}})
    result = await PluginCheck(kube, "gpu-node-1").run()
    assert not result.ok
    assert "no allocatable nvidia.com/gpu" in result.reason
    result = await PluginCheck(kube, "other").run()
    assert result.reason == "node other not found"


async def test_plugin_workload_requests_one_gpu_once() -> None:
    kube = InMemoryKube({"gpu-node-1": {"nvidia.com/mig-1g.10gb": "7"}})
    check = PluginCheck(kube, "gpu-node-1", workload=SPEC, poll_s=0)
    assert (await check.run()).ok
    assert (await check.run()).ok
    (created,) = kube.created
    assert created["metadata"]["name"] == "nvidia-device-plugin-validator-gpu-node-1"
    limits = created["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/mig-1g.10gb": "1"}


async def test_plugin_workload_failure() -> None:
    kube = InMemoryKube(
        {"gpu-node-1": {"nvidia.com/gpu": "1"}},
        pod_statuses=({"phase": "Failed", "reason": "UnexpectedAdmissionError"},),
    )
    result = await PluginCheck(kube, "gpu-node-1", workload=SPEC, poll_s=0).run()
    assert not result.ok
    assert "UnexpectedAdmissionError" in result.reason
