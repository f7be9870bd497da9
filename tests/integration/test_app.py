"""The operator process end to end: its /healthz is green while its loops run and
turns red, from memory, once its watches cannot reach the API server."""

from __future__ import annotations

import asyncio
import contextlib
import re
from pathlib import Path

import aiohttp
import pytest
import yaml

from gpuop.devcluster import ClusterInfo
from gpuop.kube.rest import Rest
from gpuop.operator.app import run_operator
from gpuop.operator.controller import OperatorConfig
from tests.integration.harness import NAMESPACE, eventually
from tests.integration.harness import free_port as _free_port
from tests.integration.proxy import Proxy

pytestmark = pytest.mark.integration


async def _get(port: int, path: str) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{port}{path}") as resp,
    ):
        return resp.status, await resp.text()


async def test_healthz_fails_when_the_watches_cannot_reach_the_api_server(
    local_cluster: ClusterInfo, rest: Rest, tmp_path: Path
) -> None:
    api_port = int(local_cluster.server.rsplit(":", 1)[1])
    proxy = Proxy("127.0.0.1", api_port)
    await proxy.start()
    kubeconfig = yaml.safe_load(local_cluster.kubeconfig.read_text())
    for cluster in kubeconfig["clusters"]:
        cluster["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
    proxied = tmp_path / "kubeconfig"
    proxied.write_text(yaml.safe_dump(kubeconfig))
    port = _free_port()
    config = OperatorConfig(
        namespace=NAMESPACE, workers=2, metrics_host="127.0.0.1", metrics_port=port, probe_port=port
    )
    task = asyncio.create_task(run_operator(config, proxied, unavailable_after=1.0))
    try:

        async def ready() -> bool:
            with contextlib.suppress(aiohttp.ClientError):
                return (await _get(port, "/readyz"))[0] == 200
            return False

        await eventually(ready, timeout=60)
        assert await _get(port, "/healthz") == (200, "ok")
        await proxy.close()

        async def unhealthy() -> tuple[int, str] | None:
            got = await _get(port, "/healthz")
            return got if got[0] == 500 else None

        _, why = await eventually(unhealthy, timeout=60)
        # Every watch goes down with the proxy; whichever the probe sees first is named.
        assert re.fullmatch(r"watch [a-z0-9.-]+ failing for \d+s(; .+)?", why), why
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await proxy.close()
