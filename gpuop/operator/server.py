"""The operator's HTTP endpoints: ``/healthz`` and ``/readyz`` for probes, ``/metrics``."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

Check = Callable[[], tuple[bool, str]]


def make_app(registry: CollectorRegistry, healthy: Check, ready: Check) -> web.Application:
    """Liveness says the process's loops run; readiness says caches are synced (and leading)."""

    async def healthz(_: web.Request) -> web.Response:
        ok, why = healthy()
        return web.Response(status=200 if ok else 500, text=why or "ok")

    async def readyz(_: web.Request) -> web.Response:
        ok, why = ready()
        return web.Response(status=200 if ok else 503, text=why or "ok")

    async def metrics(_: web.Request) -> web.Response:
        # aiohttp refuses a charset inside content_type=, so set the header whole.
        return web.Response(
            body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/livez", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app


async def start(app: web.Application, host: str, port: int) -> web.AppRunner:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
