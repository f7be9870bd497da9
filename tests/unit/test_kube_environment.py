"""The API client reads the proxy environment once, not per request
(``gpuop.kube.client.read_environment_once``)."""

from __future__ import annotations

import pytest
from kubernetes_asyncio import client

from gpuop.kube.client import read_environment_once

HOST = "https://10.0.0.1:6443"


async def _api(monkeypatch: pytest.MonkeyPatch, **env: str) -> client.ApiClient:
    for name in ("HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    configuration = client.Configuration(host=HOST)
    api = client.ApiClient(configuration)
    await read_environment_once(api, HOST)
    return api


async def test_requests_no_longer_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    api = await _api(monkeypatch)
    try:
        # aiohttp looked up the proxy and ~/.netrc in a thread for every request while
        # this was true (its own attribute: a rename in aiohttp fails here, not silently).
        assert api.rest_client.pool_manager._trust_env is False
        assert not api.rest_client.proxy
    finally:
        await api.close()


async def test_the_environments_proxy_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    api = await _api(monkeypatch, HTTPS_PROXY="http://user:pw@proxy.corp:3128")
    try:
        assert api.rest_client.proxy == "http://proxy.corp:3128"
        assert api.rest_client.proxy_headers["Proxy-Authorization"].startswith("Basic ")
    finally:
        await api.close()


async def test_no_proxy_still_bypasses_it(monkeypatch: pytest.MonkeyPatch) -> None:
    api = await _api(monkeypatch, HTTPS_PROXY="http://proxy.corp:3128", NO_PROXY="10.0.0.1")
    try:
        assert not api.rest_client.proxy
    finally:
        await api.close()
