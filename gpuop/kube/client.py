"""The one shared kubernetes-asyncio ``ApiClient`` per process, and how it is configured."""

from __future__ import annotations

import asyncio
import contextlib
import os
from asyncio import sslproto
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from aiohttp.helpers import get_env_proxy_for_url
from kubernetes_asyncio import client, config
from kubernetes_asyncio.config.kube_config import KUBE_CONFIG_DEFAULT_LOCATION
from yarl import URL

USER_AGENT = "gpuop"

#: Bytes asyncio's TLS transport reads at once. It allocates and zero-fills a read
#: buffer of ``SSLProtocol.max_size`` (256 KiB) for every connection, and the operator
#: holds one connection per watch, 30 to 60 of them: 7 to 15 MiB resident, a tenth of
#: the process (``GPUOP_BENCH_TRACEMALLOC``, docs/benchmarks.md). At 64 KiB a LIST page
#: still arrives in a few reads.
TLS_READ_BUFFER = 64 * 1024


def limit_tls_read_buffer() -> None:
    """Apply :data:`TLS_READ_BUFFER` to every TLS connection this process opens from now
    on (a class attribute of the standard library's protocol: process-wide)."""
    if getattr(sslproto.SSLProtocol, "max_size", 0) > TLS_READ_BUFFER:
        sslproto.SSLProtocol.max_size = TLS_READ_BUFFER


def _proxy_for(host: str) -> tuple[str, str | None] | None:
    """The proxy the environment names for ``host`` (``HTTPS_PROXY``, minus
    ``NO_PROXY``), with its ``Proxy-Authorization`` value; None: go direct."""
    with contextlib.suppress(LookupError):
        proxy, auth = get_env_proxy_for_url(URL(host))
        return str(proxy), None if auth is None else auth.encode()
    return None


async def read_environment_once(api: client.ApiClient, host: str) -> None:
    """Settle the proxy once, then stop the session reading the environment per request.

    kubernetes-asyncio's session trusts the environment, so aiohttp looked up the proxy
    variables and parsed ``~/.netrc`` in a worker thread for every request: two thread
    hops per request, a twentieth of the operator's CPU in a 1,000-node rollout. The
    API server is one host, so the answer is the same each time; a proxy set in the
    kubeconfig still wins, and netrc credentials never applied to a client that
    authenticates with a certificate or a bearer token."""
    rest = api.rest_client
    session = rest.pool_manager
    if not getattr(session, "_trust_env", False):
        return
    found = None if rest.proxy else await asyncio.to_thread(_proxy_for, host)
    if found is not None:
        rest.proxy, auth = found
        if auth is not None:
            rest.proxy_headers = {**(rest.proxy_headers or {}), "Proxy-Authorization": auth}
    session._trust_env = False


class KubeconfigError(ValueError):
    """No kubeconfig to read: named here, where the library would only say that a key
    is missing from an empty configuration."""


def _check_kubeconfig(kubeconfig: Path | None) -> None:
    if kubeconfig is not None:
        if not kubeconfig.is_file():
            raise KubeconfigError(f"kubeconfig {kubeconfig} does not exist")
        return
    if os.environ.get("KUBECONFIG"):
        return  # a list of files, merged by the library
    default = Path(KUBE_CONFIG_DEFAULT_LOCATION).expanduser()
    if not default.is_file():
        raise KubeconfigError(f"no kubeconfig: $KUBECONFIG is unset and {default} does not exist")


async def load_configuration(kubeconfig: Path | None = None) -> client.Configuration:
    """In-cluster credentials inside a pod, else the given (or default) kubeconfig."""
    configuration = client.Configuration()
    if kubeconfig is None and "KUBERNETES_SERVICE_HOST" in os.environ:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        _check_kubeconfig(kubeconfig)
        await config.load_kube_config(
            config_file=str(kubeconfig) if kubeconfig else None,
            client_configuration=configuration,
        )
    return configuration


@asynccontextmanager
async def api_client(
    kubeconfig: Path | None = None, user_agent: str = USER_AGENT
) -> AsyncIterator[client.ApiClient]:
    """One ``ApiClient`` shared by every API object, closed on exit (no leaked sessions)."""
    configuration = await load_configuration(kubeconfig)
    configuration.connection_pool_maxsize = 64
    limit_tls_read_buffer()
    api = client.ApiClient(configuration)
    api.user_agent = user_agent
    try:
        await read_environment_once(api, str(configuration.host))
        yield api
    finally:
        await api.close()
