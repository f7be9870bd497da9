"""Simulated nodes: what a kubelet and NFD would report for CPU and GPU nodes.

kwok takes over nodes carrying its annotation and keeps them Ready; everything
else (labels, capacity, allocatable) is ours, shaped like a real GPU node after
NFD and a device plugin registered: NFD's PCI vendor label, GPU product labels
and ``nvidia.com/gpu`` in capacity and allocatable so GPU workloads schedule.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from components.keys import MIG_CAPABLE_LABEL, NFD_GPU_LABELS, WORKLOAD_CONFIG_LABEL
from components.keys import WORKLOADS as WORKLOADS

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
SIMULATED_LABEL = "gpuop.io/simulated"
LEGACY_SIMULATED_LABEL = "gpuop.dev/simulated"
"""What clusters made before the single `gpuop.io/` domain label their nodes with."""
NFD_GPU_LABEL = NFD_GPU_LABELS[0]
WORKLOAD_LABEL = WORKLOAD_CONFIG_LABEL
"""The node label an administrator sets to say what a GPU node serves (upstream's)."""


@dataclass(frozen=True)
class GpuModel:
    product: str
    count: int
    memory_mib: int
    family: str
    compute_major: int
    compute_minor: int
    mig_capable: bool


#: A mix of MIG-capable data-centre parts and smaller inference cards.
GPU_MODELS: tuple[GpuModel, ...] = (
    GpuModel("NVIDIA-A100-SXM4-80GB", 8, 81920, "ampere", 8, 0, True),
    GpuModel("Tesla-T4", 1, 15360, "turing", 7, 5, False),
    GpuModel("NVIDIA-H100-80GB-HBM3", 8, 81559, "hopper", 9, 0, True),
    GpuModel("NVIDIA-L4", 2, 23034, "ada-lovelace", 8, 9, False),
)


def node_name(index: int, gpu: bool) -> str:
    return f"{'gpu' if gpu else 'cpu'}-node-{index:04d}"


def node_manifest(index: int, gpu: bool) -> dict[str, Any]:
    """The Node object for simulated node ``index`` (GPU models assigned round-robin)."""
    name = node_name(index, gpu)
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        SIMULATED_LABEL: "true",
        "feature.node.kubernetes.io/system-os_release.ID": "ubuntu",
        "feature.node.kubernetes.io/system-os_release.VERSION_ID": "22.04",
        "feature.node.kubernetes.io/kernel-version.full": "5.15.0-124-generic",
    }
    capacity = {"cpu": "32", "memory": "256Gi", "pods": "110", "ephemeral-storage": "500Gi"}
    if gpu:
        model = GPU_MODELS[index % len(GPU_MODELS)]
        labels.update(
            {
                NFD_GPU_LABEL: "true",
                NFD_GPU_LABELS[1]: "true",  # the 3D-controller class
                "nvidia.com/gpu.product": model.product,
                "nvidia.com/gpu.count": str(model.count),
                "nvidia.com/gpu.memory": str(model.memory_mib),
                "nvidia.com/gpu.family": model.family,
                "nvidia.com/gpu.compute.major": str(model.compute_major),
                "nvidia.com/gpu.compute.minor": str(model.compute_minor),
                MIG_CAPABLE_LABEL: str(model.mig_capable).lower(),
            }
        )
        capacity = {**capacity, "cpu": "64", "memory": "1Ti", "nvidia.com/gpu": str(model.count)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {},
        "status": {
            "capacity": capacity,
            "allocatable": dict(capacity),
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "osImage": "Ubuntu 22.04.5 LTS",
                "kernelVersion": "5.15.0-124-generic",
                "containerRuntimeVersion": "containerd://1.7.22",
                "kubeletVersion": "kwok",
                "kubeProxyVersion": "kwok",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
            },
            "phase": "Running",
        },
    }


def parse_workload(text: str) -> tuple[str, str]:
    """One ``--workload NODE=WORKLOAD`` value, checked: (node, workload)."""
    node, sep, workload = text.partition("=")
    if not sep or not node or workload not in WORKLOADS:
        raise ValueError(
            f"--workload {text}: expected NODE=WORKLOAD with WORKLOAD one of"
            f" {', '.join(WORKLOADS)} (e.g. gpu-node-0001=vm-passthrough)"
        )
    return node, workload


def workload_labels(workloads: Iterable[tuple[str, str]], gpu_nodes: int) -> dict[str, str]:
    """Node name to workload, each naming one of the ``gpu_nodes`` GPU nodes once."""
    names = {node_name(i, True) for i in range(gpu_nodes)}
    result: dict[str, str] = {}
    for node, workload in workloads:
        if node not in names:
            last = f"gpu-node-0000..{node_name(gpu_nodes - 1, True)}" if gpu_nodes else "none"
            raise ValueError(f"--workload {node}={workload}: not a GPU node (GPU nodes: {last})")
        if node in result:
            raise ValueError(f"--workload: {node} given twice")
        result[node] = workload
    return result


def node_manifests(
    nodes: int, gpu_nodes: int, workloads: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """``gpu_nodes`` GPU nodes followed by ``nodes - gpu_nodes`` CPU-only nodes;
    ``workloads`` (node name to workload, see :func:`workload_labels`) labels GPU nodes
    with ``nvidia.com/gpu.workload.config``, as an administrator makes VM hosts."""
    if gpu_nodes > nodes:
        raise ValueError(f"--gpu-nodes ({gpu_nodes}) cannot exceed --nodes ({nodes})")
    if nodes < 0 or gpu_nodes < 0:
        raise ValueError("--nodes and --gpu-nodes must not be negative")
    chosen = workload_labels((workloads or {}).items(), gpu_nodes)
    gpu = [node_manifest(i, True) for i in range(gpu_nodes)]
    for manifest in gpu:
        workload = chosen.get(manifest["metadata"]["name"])
        if workload:
            manifest["metadata"]["labels"][WORKLOAD_LABEL] = workload
    cpu = [node_manifest(i, False) for i in range(nodes - gpu_nodes)]
    return gpu + cpu
