"""Shared helpers for integration tests: an in-process operator and waiting."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

from kubernetes_asyncio import client

from gpuop.controller import Operator, OperatorConfig
from gpuop.metrics import OperatorMetrics
from gpuop.rest import Rest, by_kind

NAMESPACE = "gpuop-it"
POLICY = by_kind("nvidia.com/v1", "ClusterPolicy")
NODE = by_kind("v1", "Node")


async def eventually(
    check: Callable[[], Awaitable[Any]], timeout: float = 60.0, interval: float = 0.2
) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = await check()
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"not met within {timeout}s; last={last!r}")


class Running:
    """An operator running in this process against the test cluster."""

    def __init__(self, api: client.ApiClient) -> None:
        self.rest = Rest(api)
        self.operator = Operator(
            self.rest, OperatorConfig(namespace=NAMESPACE, workers=4), OperatorMetrics()
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

    async def settle(self, quiet: float = 1.0) -> None:
        """Wait until the queue is idle and stays idle for ``quiet`` seconds."""
        while True:
            await asyncio.wait_for(self.operator.queue.wait_idle(), 60)
            await asyncio.sleep(quiet)
            if self.operator.queue.is_idle():
                return


async def policy_state(rest: Rest, name: str = "cluster-policy") -> str | None:
    got = await rest.get(POLICY, name)
    return ((got or {}).get("status") or {}).get("state")


async def policy_state_is(rest: Rest, state: str, name: str = "cluster-policy") -> bool:
    return await policy_state(rest, name) == state
