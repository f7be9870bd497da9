"""`gpuop crds apply`, what the chart's pre-upgrade hook Job runs, against the real
control plane: the CRDs are applied from the models, with NVIDIA's compute-domain CRDs
from their data files, and served; run again, it changes nothing. (`crds delete` is
covered in tests/unit/test_crds_delete.py: deleting the session's CRDs would take every
other module's policies with them.)"""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

import crd
from gpuop.devcluster import ClusterInfo
from gpuop.kube.rest import Rest
from gpuop.operator.install import CRD_KIND

pytestmark = pytest.mark.integration


async def test_crds_apply_serves_the_models_crds(local_cluster: ClusterInfo, rest: Rest) -> None:
    for _ in range(2):
        proc = await asyncio.to_thread(
            subprocess.run,
            [
                sys.executable,
                "-m",
                "gpuop",
                "crds",
                "apply",
                "--kubeconfig",
                str(local_cluster.kubeconfig),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        assert "CRDs applied" in proc.stdout
        for name in crd.COMPUTE_DOMAIN_CRD_NAMES:
            assert name in proc.stdout
    for manifest in (
        crd.crd_manifest(),
        crd.nvd_crd_manifest(),
        crd.gc_crd_manifest(),
        *crd.compute_domain_crd_manifests(),
    ):
        stored = await rest.get(CRD_KIND, manifest["metadata"]["name"])
        assert stored is not None
        assert stored["spec"]["versions"] == manifest["spec"]["versions"]
    # The kind the GPUCluster's compute-domain controller watches now exists.
    assert await rest.api_resource_exists(f"{crd.CD_GROUP}/v1beta1", "computedomains")
    assert await rest.api_resource_exists(f"{crd.CD_GROUP}/v1beta1", "computedomaincliques")
