"""NVIDIA's compute-domain API (`resource.nvidia.com/v1beta1` ComputeDomain and
ComputeDomainClique): the kinds the GPUCluster's compute-domain controller (the DRA
driver's, rendered by `components.dra.driver`) watches, for multi-node NVLink (IMEX)
workloads such as GB200 racks.

They are NVIDIA's DRA driver's API definitions, not ours: shipped as data files,
byte for byte the CRDs upstream's v26.7 chart keeps in its `crds/` (each file says where
it comes from), and installed beside ours by the chart and `gpuop crds apply`. Without
them the kind does not exist and the controller has nothing to watch.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

import yaml

CD_GROUP = "resource.nvidia.com"
COMPUTE_DOMAIN_CRD_NAMES = (
    f"computedomains.{CD_GROUP}",
    f"computedomaincliques.{CD_GROUP}",
)
"""The CRDs' names, in the order they are applied."""
COMPUTE_DOMAIN_CRD_FILES = tuple(
    f"crd/{CD_GROUP}_{n.split('.')[0]}.yaml" for n in COMPUTE_DOMAIN_CRD_NAMES
)
"""The data files (package data of `crd`)."""
COMPUTE_DOMAIN_CHART_CRD_FILES = tuple(
    f"{folder}/{path.removeprefix('crd/')}"
    for folder in ("deploy/crds", "deploy/helm/gpu-operator/crds")
    for path in COMPUTE_DOMAIN_CRD_FILES
)
"""Their copies beside our generated CRDs (the same bytes)."""


def compute_domain_crd_manifests() -> list[dict[str, Any]]:
    """The two CRDs as plain dicts, read from the package's data files."""
    folder = resources.files("crd")
    return [
        yaml.safe_load(folder.joinpath(path.removeprefix("crd/")).read_text())
        for path in COMPUTE_DOMAIN_CRD_FILES
    ]
