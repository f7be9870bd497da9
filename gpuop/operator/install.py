"""Install what the operator needs in a fresh cluster: the CRD, its namespace and,
for demos and tests, the sample ClusterPolicy. Real installs use the Helm chart."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

import crd
from components import ObjectKind
from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Rest
from gpuop.log import get_logger

CRD_KIND = by_kind("apiextensions.k8s.io/v1", "CustomResourceDefinition")
NAMESPACE = by_kind("v1", "Namespace")
COMPUTE_DOMAIN = ObjectKind(f"{crd.CD_GROUP}/v1beta1", "ComputeDomain", "computedomains")
"""Read only by `crds delete` (the operator itself never touches the kind)."""

log = get_logger(__name__)


def _our_crds() -> list[dict[str, Any]]:
    """The CRDs generated from our models: ClusterPolicy, NVIDIADriver, GPUCluster."""
    return [crd.crd_manifest(), crd.nvd_crd_manifest(), crd.gc_crd_manifest()]


async def install_crd(rest: Rest, timeout: float = 60.0) -> list[str]:
    """Apply the generated CRDs (ClusterPolicy, NVIDIADriver, GPUCluster) and NVIDIA's
    compute-domain CRDs (ComputeDomain, ComputeDomainClique: the API the GPUCluster's
    compute-domain controller watches, shipped as upstream's chart ships them), and wait
    until each is served. Returns their names, in that order."""
    names = []
    for manifest in (*_our_crds(), *crd.compute_domain_crd_manifests()):
        await _install_one(rest, manifest, timeout)
        names.append(str(manifest["metadata"]["name"]))
    return names


async def _install_one(rest: Rest, manifest: dict[str, Any], timeout: float) -> None:
    await rest.apply(manifest)
    deadline = time.monotonic() + timeout
    while True:
        got = await rest.get(CRD_KIND, manifest["metadata"]["name"])
        conditions = (got or {}).get("status", {}).get("conditions") or []
        if any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"CRD {manifest['metadata']['name']} not Established in {timeout}s")
        await asyncio.sleep(0.2)


async def delete_crds(rest: Rest) -> list[str]:
    """Delete our CRDs (and with them every ClusterPolicy, NVIDIADriver and GPUCluster):
    what the chart's `operator.cleanupCRD` pre-delete hook runs. The compute-domain CRDs
    go too, but only while no ComputeDomain exists: deleting them would take a running
    multi-node workload's domains with them (upstream's cleanup hook leaves them for
    ever). Returns the names deleted."""
    deleted = []
    for manifest in _our_crds():
        name = manifest["metadata"]["name"]
        if await rest.delete(CRD_KIND, name):
            deleted.append(name)
    in_use = await _compute_domains(rest)
    if in_use:
        log.warning(
            "compute-domain CRDs kept: ComputeDomains exist",
            computedomains=in_use,
            crds=list(crd.COMPUTE_DOMAIN_CRD_NAMES),
        )
        return deleted
    for name in crd.COMPUTE_DOMAIN_CRD_NAMES:
        if await rest.delete(CRD_KIND, name):
            deleted.append(name)
    return deleted


async def _compute_domains(rest: Rest) -> int:
    """How many ComputeDomains exist, in every namespace (none where the kind is not
    served)."""
    try:
        return len(await rest.list(COMPUTE_DOMAIN))
    except ApiException as err:
        if err.status == 404:
            return 0
        raise


async def ensure_namespace(rest: Rest, name: str) -> None:
    await rest.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


async def install_sample_policy(rest: Rest) -> None:
    """Create the chart-default ClusterPolicy unless one already exists."""
    existing = await rest.list(by_kind("nvidia.com/v1", "ClusterPolicy"))
    if existing:
        return
    await rest.apply(crd.sample_policy())
