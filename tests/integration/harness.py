"""Shared helpers for integration tests: an in-process operator and waiting."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client

from gpuop.devcluster import ClusterInfo, LocalCluster, cache_dir
from gpuop.kube.kinds import KINDS, by_kind
from gpuop.kube.rest import Rest
from gpuop.operator.controller import Operator, OperatorConfig
from gpuop.operator.metrics import OperatorMetrics

NAMESPACE = "gpuop-it"
POLICY = by_kind("nvidia.com/v1", "ClusterPolicy")
NODE = by_kind("v1", "Node")


def cluster_dir(suffix: str = "") -> Path:
    """A fixed directory per cluster, so a run killed before teardown is cleaned by the
    next; `suffix` names a test module's own cluster beside the session's."""
    explicit = os.environ.get("GPUOP_TEST_CLUSTER_DIR")
    base = Path(explicit) if explicit else cache_dir() / "test-cluster"
    return base.with_name(base.name + suffix)


@contextlib.contextmanager
def own_cluster(
    suffix: str, *, gpu_nodes: int, cpu_nodes: int = 1, node_images: bool = False
) -> Iterator[ClusterInfo]:
    """A control plane of a module's own, for fleets bigger than the session cluster's
    (``node_images``: with the node-image simulator, see ``gpuop.devcluster.node_images``)."""
    cluster = LocalCluster(cluster_dir(suffix))
    cluster.down()
    info = cluster.up(
        nodes=gpu_nodes + cpu_nodes,
        gpu_nodes=gpu_nodes,
        tie_to_parent=True,
        node_images=node_images,
    )
    try:
        yield info
    finally:
        cluster.down()


def free_port() -> int:
    """A TCP port free on loopback now (the operator's and exporters' test servers)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def eventually(
    check: Callable[[], Awaitable[Any]],
    timeout: float = 60.0,
    interval: float = 0.2,
    what: str = "condition",
) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = await check()
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"{what}: not met within {timeout:.0f}s; last={last!r}")


class Running:
    """An operator running in this process against the test cluster."""

    def __init__(self, api: client.ApiClient, config: OperatorConfig | None = None) -> None:
        self.rest = Rest(api, KINDS)
        self.operator = Operator(
            self.rest, config or OperatorConfig(namespace=NAMESPACE, workers=4), OperatorMetrics()
        )
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Running:
        self.task = asyncio.create_task(self.operator.run())

        async def synced() -> bool:
            return self.operator.synced

        await eventually(synced, timeout=30)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.task is not None
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task

    async def settle(self, quiet: float = 1.0, horizon: float = 30.0) -> None:
        """Wait until no work is queued, running or due within ``horizon`` seconds, and it
        stays so for ``quiet`` seconds (a timer further out is not work to wait for)."""
        deadline = asyncio.get_running_loop().time() + 60
        while True:
            while not self.operator.queue.quiet_within(horizon):
                if asyncio.get_running_loop().time() > deadline:
                    raise TimeoutError(f"queue not quiet: {len(self.operator.queue)} keys")
                await asyncio.sleep(0.05)
            await asyncio.sleep(quiet)
            if self.operator.queue.quiet_within(horizon):
                return


async def policy_state(rest: Rest, name: str = "cluster-policy") -> str | None:
    got = await rest.get(POLICY, name)
    return ((got or {}).get("status") or {}).get("state")


async def policy_state_is(rest: Rest, state: str, name: str = "cluster-policy") -> bool:
    return await policy_state(rest, name) == state


async def watch_from(
    call: Callable[..., Awaitable[Any]], rv: str, what: str, **params: Any
) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """Every event of a raw watch (``Rest.lister``'s call) from resourceVersion ``rv``,
    for ever: re-watches from the last version seen when the server ends a watch, skips
    bookmarks, and fails on an ERROR event (a test's watcher must never miss one).

    Two answers are not failures: 429 while the API server's watch cache is
    (re)initializing, and "Too large resource version" (504), the cache still behind the
    version a LIST just gave (read from etcd while the cache lagged: a control plane
    just started, or busy). The server asks the client to watch again from the same
    version a moment later, as client-go's reflector does; no event is missed."""
    while True:
        resp = await call(
            **params,
            watch=True,
            resource_version=rv,
            allow_watch_bookmarks=True,
            timeout_seconds=600,
            _request_timeout=aiohttp.ClientTimeout(total=None, sock_read=None),
        )
        if resp.status == 429 or (resp.status == 504 and _too_large(await resp.read())):
            await asyncio.sleep(0.5)  # 429: the watch cache is (re)initializing
            continue
        assert resp.status == 200, await resp.read()
        async with resp:
            while line := await resp.content.readline():
                event = json.loads(line)
                obj = event["object"]
                if event["type"] == "ERROR" and _too_large(obj):
                    await asyncio.sleep(0.5)
                    break  # watch again from ``rv`` (the last version yielded)
                if event["type"] == "ERROR":
                    raise AssertionError(f"watch of {what} failed: {obj}")
                rv = obj["metadata"]["resourceVersion"]
                if event["type"] != "BOOKMARK":
                    yield event["type"], obj


def _too_large(status: Any) -> bool:
    """Is ``status`` (a Status object, or its bytes) the watch cache's "Too large
    resource version"?"""
    if isinstance(status, bytes | bytearray):
        try:
            status = json.loads(status)
        except ValueError:
            return False
    if not isinstance(status, dict):
        return False
    causes = (status.get("details") or {}).get("causes") or []
    return any(c.get("reason") == "ResourceVersionTooLarge" for c in causes) or (
        "Too large resource version" in str(status.get("message", ""))
    )
