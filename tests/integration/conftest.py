"""Integration tests run against the real local control plane (see tests/conftest.py)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio import client

from gpuop.kube.kinds import KINDS
from gpuop.kube.rest import Rest
from gpuop.operator.install import ensure_namespace, install_crd
from tests.integration.harness import NAMESPACE, POLICY


@pytest.fixture
async def namespace(api_client: client.ApiClient) -> AsyncIterator[str]:
    """A fresh namespace per test, deleted afterwards."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(api_client)
    await core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        yield name
    finally:
        await core.delete_namespace(name)


@pytest.fixture(scope="module")
async def rest(api_client: client.ApiClient) -> AsyncIterator[Rest]:
    """Admin REST access with the CRD installed, the test namespace present, and no
    ClusterPolicy left from another module (only one policy is ever active)."""
    rest = Rest(api_client, KINDS)
    await install_crd(rest)
    await ensure_namespace(rest, NAMESPACE)
    for existing in await rest.list(POLICY):
        await rest.delete(POLICY, existing["metadata"]["name"])
    yield rest
    for existing in await rest.list(POLICY):
        await rest.delete(POLICY, existing["metadata"]["name"])
