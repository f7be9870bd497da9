"""The node status exporter: ``/metrics`` (and ``/healthz``) over aiohttp.

The registry is private to the app. Scrapes run the blocking collector in a thread,
so NVML never blocks the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from gpuop.log import get_logger
from gpuop.nodeagent.collector import NodeCollector
from gpuop.nodeagent.devices import DevicePluginDevices
from gpuop.nodeagent.nvml import Nvml
from gpuop.nodeagent.status import StatusFiles
from gpuop.nodeagent.xid import XidCounts, XidWatcher

log = get_logger(__name__)

REGISTRY_KEY = web.AppKey("registry", CollectorRegistry)


async def _metrics(request: web.Request) -> web.Response:
    registry = request.app[REGISTRY_KEY]
    body = await asyncio.to_thread(generate_latest, registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _healthz(_: web.Request) -> web.Response:
    return web.Response(text="ok")


def make_app(registry: CollectorRegistry) -> web.Application:
    app = web.Application()
    app[REGISTRY_KEY] = registry
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/healthz", _healthz)
    return app


def build_registry(
    nvml: Nvml,
    node_name: str,
    status: StatusFiles,
    *,
    xid_watcher: XidWatcher | None = None,
    plugin_devices: DevicePluginDevices | None = None,
    pci_devices: Callable[[], int] | None = None,
) -> CollectorRegistry:
    registry = CollectorRegistry()
    counts = xid_watcher.counts if xid_watcher is not None else XidCounts()
    registry.register(
        NodeCollector(
            nvml,
            node_name,
            status,
            xid_counts=counts,
            xid_watcher=xid_watcher,
            plugin_devices=plugin_devices,
            pci_devices=pci_devices,
        )
    )
    return registry


async def serve(
    nvml: Nvml,
    node_name: str,
    status: StatusFiles,
    stop: asyncio.Event,
    *,
    host: str = "0.0.0.0",
    port: int = 8000,
    xid_events: bool = True,
    watcher: XidWatcher | None = None,
    plugin_devices: DevicePluginDevices | None = None,
    pci_devices: Callable[[], int] | None = None,
    background: Sequence[Callable[[asyncio.Event], Coroutine[Any, Any, None]]] = (),
) -> None:
    """Serve until ``stop`` is set, watching XID events (with ``watcher`` when given)
    and running ``background`` tasks (the health reporter, the device plugin poll)
    alongside."""
    if watcher is None and xid_events:
        watcher = XidWatcher(nvml, XidCounts())
    registry = build_registry(
        nvml,
        node_name,
        status,
        xid_watcher=watcher,
        plugin_devices=plugin_devices,
        pci_devices=pci_devices,
    )
    app = make_app(registry)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    watch_task = asyncio.create_task(watcher.run(stop)) if watcher is not None else None
    extra = [asyncio.create_task(task(stop)) for task in background]
    try:
        await web.TCPSite(runner, host, port).start()
        log.info("exporter listening", host=host, port=port, node=node_name)
        await stop.wait()
    finally:
        stop.set()
        for task in [*extra, *([watch_task] if watch_task is not None else [])]:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await runner.cleanup()
