"""Integration tests run against the real local control plane (see tests/conftest.py)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio import client


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
