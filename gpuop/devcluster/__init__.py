"""The development wing: the local control plane (``gpuop cluster``), real Kubernetes
binaries built from the Go module proxy, simulated GPU nodes through kwok, and the NVML
fake they are seeded from (``nvml_fake``). The image leaves this folder out; the CLI
imports it only through ``gpuop._local``."""

from ._argv import ClientTuning
from ._build import ensure_binaries
from ._cluster import ClusterInfo, LocalCluster, default_dir
from ._errors import ClusterError
from ._nodes import (
    GPU_MODELS,
    NFD_GPU_LABEL,
    SIMULATED_LABEL,
    WORKLOAD_LABEL,
    WORKLOADS,
    node_manifest,
    node_manifests,
    parse_workload,
    workload_labels,
)
from ._populate import create_nodes, wait_nodes_ready
from ._versions import BinaryPaths, Versions, cache_dir

__all__ = [
    "GPU_MODELS",
    "NFD_GPU_LABEL",
    "SIMULATED_LABEL",
    "WORKLOADS",
    "WORKLOAD_LABEL",
    "BinaryPaths",
    "ClientTuning",
    "ClusterError",
    "ClusterInfo",
    "LocalCluster",
    "Versions",
    "cache_dir",
    "create_nodes",
    "default_dir",
    "ensure_binaries",
    "node_manifest",
    "node_manifests",
    "parse_workload",
    "wait_nodes_ready",
    "workload_labels",
]
