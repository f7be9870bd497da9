"""`gpuop crds delete` (the chart's `operator.cleanupCRD` hook) deletes exactly our three
CRDs, and NVIDIA's two compute-domain CRDs while no ComputeDomain exists, and says which
were there."""

from __future__ import annotations

import asyncio
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from gpuop.operator.install import COMPUTE_DOMAIN, CRD_KIND, delete_crds

OURS = ["clusterpolicies.nvidia.com", "nvidiadrivers.nvidia.com", "gpuclusters.nvidia.com"]
COMPUTE_DOMAINS = ["computedomains.resource.nvidia.com", "computedomaincliques.resource.nvidia.com"]


class _Rest:
    def __init__(self, present: set[str], domains: int | None = 0) -> None:
        self.present = present
        self.domains = domains
        self.deleted: list[tuple[Any, str]] = []

    async def delete(self, kind: Any, name: str, namespace: str | None = None) -> bool:
        self.deleted.append((kind, name))
        return name in self.present

    async def list(self, kind: Any, namespace: str | None = None) -> list[Any]:
        assert kind is COMPUTE_DOMAIN
        assert namespace is None  # every namespace
        if self.domains is None:
            raise ApiException(status=404)  # the kind is not served
        return [{}] * self.domains


def test_deletes_every_crd_and_names_those_that_were_there() -> None:
    rest = _Rest({"clusterpolicies.nvidia.com", "computedomains.resource.nvidia.com"})
    deleted = asyncio.run(delete_crds(rest))  # type: ignore[arg-type]
    assert deleted == ["clusterpolicies.nvidia.com", "computedomains.resource.nvidia.com"]
    assert rest.deleted == [(CRD_KIND, name) for name in (*OURS, *COMPUTE_DOMAINS)]


def test_compute_domain_crds_stay_while_compute_domains_exist() -> None:
    rest = _Rest({*OURS, *COMPUTE_DOMAINS}, domains=2)
    assert asyncio.run(delete_crds(rest)) == OURS  # type: ignore[arg-type]
    assert [name for _, name in rest.deleted] == OURS


def test_a_cluster_without_the_compute_domain_kind_deletes_ours() -> None:
    rest = _Rest(set(OURS), domains=None)
    assert asyncio.run(delete_crds(rest)) == OURS  # type: ignore[arg-type]
