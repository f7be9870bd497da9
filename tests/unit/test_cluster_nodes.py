"""Simulated node manifests: what NFD and a device plugin would have reported."""

from __future__ import annotations

import pytest

from gpuop.devcluster import (
    GPU_MODELS,
    NFD_GPU_LABEL,
    SIMULATED_LABEL,
    WORKLOAD_LABEL,
    node_manifests,
    parse_workload,
    workload_labels,
)


def test_counts_and_names() -> None:
    nodes = node_manifests(5, 3)
    names = [n["metadata"]["name"] for n in nodes]
    assert names == [
        "gpu-node-0000",
        "gpu-node-0001",
        "gpu-node-0002",
        "cpu-node-0000",
        "cpu-node-0001",
    ]
    assert len(set(names)) == 5


def test_gpu_nodes_carry_nfd_label_and_gpu_capacity() -> None:
    nodes = node_manifests(6, 4)
    gpu = [n for n in nodes if n["metadata"]["labels"].get(NFD_GPU_LABEL) == "true"]
    cpu = [n for n in nodes if NFD_GPU_LABEL not in n["metadata"]["labels"]]
    assert len(gpu) == 4
    assert len(cpu) == 2
    for node in gpu:
        alloc = node["status"]["allocatable"]
        assert int(alloc["nvidia.com/gpu"]) == int(
            node["metadata"]["labels"]["nvidia.com/gpu.count"]
        )
        assert alloc == node["status"]["capacity"]
    for node in cpu:
        assert "nvidia.com/gpu" not in node["status"]["allocatable"]
    for node in nodes:
        assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
        assert node["metadata"]["labels"][SIMULATED_LABEL] == "true"
        assert "taints" not in node["spec"]


def test_models_mix_mig_capable_and_not() -> None:
    nodes = node_manifests(len(GPU_MODELS), len(GPU_MODELS))
    capable = {n["metadata"]["labels"]["nvidia.com/mig.capable"] for n in nodes}
    assert capable == {"true", "false"}
    products = {n["metadata"]["labels"]["nvidia.com/gpu.product"] for n in nodes}
    assert products == {m.product for m in GPU_MODELS}


@pytest.mark.parametrize(("nodes", "gpus"), [(2, 3), (-1, 0), (3, -1)])
def test_bad_counts_are_refused_naming_the_flag(nodes: int, gpus: int) -> None:
    with pytest.raises(ValueError, match=r"--(gpu-)?nodes"):
        node_manifests(nodes, gpus)


def test_workloads_label_the_named_gpu_nodes_only() -> None:
    nodes = node_manifests(5, 3, {"gpu-node-0001": "vm-passthrough", "gpu-node-0002": "vm-vgpu"})
    got = {n["metadata"]["name"]: n["metadata"]["labels"].get(WORKLOAD_LABEL) for n in nodes}
    assert got == {
        "gpu-node-0000": None,
        "gpu-node-0001": "vm-passthrough",
        "gpu-node-0002": "vm-vgpu",
        "cpu-node-0000": None,
        "cpu-node-0001": None,
    }


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("gpu-node-0001", "expected NODE=WORKLOAD"),
        ("gpu-node-0001=vm", "vm-passthrough"),
        ("=container", "expected NODE=WORKLOAD"),
    ],
)
def test_a_bad_workload_value_names_it(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words) as err:
        parse_workload(text)
    assert text in str(err.value)


def test_a_workload_must_name_a_gpu_node_once() -> None:
    assert parse_workload("gpu-node-0001=vm-vgpu") == ("gpu-node-0001", "vm-vgpu")
    with pytest.raises(ValueError, match=r"cpu-node-0000.*not a GPU node"):
        workload_labels([("cpu-node-0000", "vm-vgpu")], 2)
    with pytest.raises(ValueError, match=r"gpu-node-0002.*not a GPU node.*gpu-node-0001"):
        workload_labels([("gpu-node-0002", "vm-vgpu")], 2)
    with pytest.raises(ValueError, match="gpu-node-0000 given twice"):
        workload_labels([("gpu-node-0000", "vm-vgpu"), ("gpu-node-0000", "container")], 2)
