"""The REST layer against the real API server behind a proxy that goes silent: a
request on a dead connection fails at the client's own timeout instead of hanging
(the SDK's default is no timeout at all)."""

from __future__ import annotations

import asyncio

import pytest

from gpuop.devcluster import ClusterInfo
from gpuop.kube.kinds import KINDS, by_kind
from gpuop.kube.rest import REQUEST_TIMEOUT, Rest
from tests.integration.harness import NAMESPACE
from tests.integration.proxy import proxied_client

pytestmark = pytest.mark.integration

NS = by_kind("v1", "Namespace")


async def test_every_plain_request_is_bounded_by_the_clients_timeout(
    local_cluster: ClusterInfo, rest: Rest
) -> None:
    assert REQUEST_TIMEOUT > 0
    async with proxied_client(local_cluster.kubeconfig) as (api, proxy):
        bounded = Rest(api, KINDS, timeout=1.0)
        assert await bounded.get(NS, NAMESPACE) is not None
        proxy.blackhole()
        for call in (
            lambda: bounded.get(NS, NAMESPACE),
            lambda: bounded.list(NS),
            lambda: bounded.lister(NS)(limit=10),
        ):
            # The guard is far longer; it must not be what ends the request.
            async with asyncio.timeout(60) as guard:
                with pytest.raises(TimeoutError):
                    await call()
            assert not guard.expired()
