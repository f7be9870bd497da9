"""`spec.psa.enabled` on the real control plane: the operator's namespace gets upstream's
Pod Security labels (privileged, for enforce, audit and warn), written once; a restart
that finds them there writes nothing to the namespace."""

from __future__ import annotations

import copy

import pytest
from kubernetes_asyncio import client

import crd
from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Rest
from gpuop.operator.controller.writers.pod_security import PSA_LABELS
from tests.integration.harness import NAMESPACE, Running, eventually

pytestmark = pytest.mark.integration

NS = by_kind("v1", "Namespace")


async def _labels(rest: Rest) -> dict[str, str]:
    ns = await rest.get(NS, NAMESPACE)
    assert ns is not None
    return dict(ns["metadata"].get("labels") or {})


async def test_psa_labels_the_operator_namespace_once(
    rest: Rest, api_client: client.ApiClient
) -> None:
    removal = {"metadata": {"labels": dict.fromkeys(PSA_LABELS)}}
    await rest.merge_patch(NS, NAMESPACE, removal)
    policy = copy.deepcopy(crd.sample_policy())
    policy["spec"]["psa"] = {"enabled": True}
    await rest.apply(policy)
    try:
        async with Running(api_client) as run:

            async def labelled() -> bool:
                labels = await _labels(rest)
                return all(labels.get(k) == v for k, v in PSA_LABELS.items())

            assert await eventually(labelled, timeout=60)
            assert run.rest.counts[("PATCH", "namespaces")] == 1
        async with Running(api_client) as again:
            await again.settle()
            assert again.rest.counts[("PATCH", "namespaces")] == 0
    finally:
        await rest.merge_patch(NS, NAMESPACE, removal)
        await rest.apply(crd.sample_policy())
