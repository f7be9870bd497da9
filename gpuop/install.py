"""Install what the operator needs in a fresh cluster: the CRD, its namespace and,
for demos and tests, the sample ClusterPolicy. Real installs use the Helm chart."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import crd
from gpuop.kinds import by_kind
from gpuop.rest import Rest

CRD_KIND = by_kind("apiextensions.k8s.io/v1", "CustomResourceDefinition")
NAMESPACE = by_kind("v1", "Namespace")


async def install_crd(rest: Rest, timeout: float = 60.0) -> None:
    """Apply the generated CRDs (ClusterPolicy, NVIDIADriver) and wait until served."""
    for manifest in (crd.crd_manifest(), crd.nvd_crd_manifest()):
        await _install_one(rest, manifest, timeout)


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
    """Delete our CRDs (and with them every ClusterPolicy and NVIDIADriver): what the
    chart's `operator.cleanupCRD` pre-delete hook runs. Returns the names deleted."""
    deleted = []
    for manifest in (crd.crd_manifest(), crd.nvd_crd_manifest()):
        name = manifest["metadata"]["name"]
        if await rest.delete(CRD_KIND, name):
            deleted.append(name)
    return deleted


async def ensure_namespace(rest: Rest, name: str) -> None:
    await rest.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


async def install_sample_policy(rest: Rest) -> None:
    """Create the chart-default ClusterPolicy unless one already exists."""
    existing = await rest.list(by_kind("nvidia.com/v1", "ClusterPolicy"))
    if existing:
        return
    await rest.apply(crd.sample_policy())
