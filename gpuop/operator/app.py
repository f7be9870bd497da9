"""``gpuop run``: the operator process — HTTP endpoints, caches, workers, signals."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from pathlib import Path

from gpuop.kube.client import api_client
from gpuop.kube.kinds import KINDS
from gpuop.kube.rest import Rest
from gpuop.log import get_logger
from gpuop.operator.controller import Operator, OperatorConfig
from gpuop.operator.health import UNAVAILABLE_AFTER, Liveness
from gpuop.operator.install import ensure_namespace, install_crd, install_sample_policy
from gpuop.operator.leader import Leases
from gpuop.operator.metrics import OperatorMetrics
from gpuop.operator.server import make_app, start

log = get_logger(__name__)


async def run_operator(
    config: OperatorConfig,
    kubeconfig: Path | None = None,
    install: bool = False,
    status_line: bool = False,
    unavailable_after: float = UNAVAILABLE_AFTER,
) -> int:
    """Run until SIGTERM/SIGINT (exit 0) or until a root task dies (exit 1)."""
    async with api_client(kubeconfig) as api:
        rest = Rest(api, KINDS)
        metrics = OperatorMetrics()
        operator = Operator(rest, config, metrics)
        main = asyncio.current_task()
        assert main is not None
        loop = asyncio.get_running_loop()
        stopping = False

        def stop() -> None:
            nonlocal stopping
            stopping = True
            main.cancel()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop)

        # Liveness reads only memory: the informers' and queue's own reports and
        # whether a root task has ended. It never asks the API server.
        liveness = Liveness(
            informers=lambda: operator.informers,
            queue=lambda: operator.queue,
            unavailable_after=unavailable_after,
        )

        def healthy() -> tuple[bool, str]:
            return liveness.check()

        elector = (
            Leases.named(rest, config.namespace, config.lease_names, _identity())
            if config.leader_elect
            else None
        )

        def ready() -> tuple[bool, str]:
            # A follower is ready (it can take over at once); the leader once synced.
            if elector is not None and not elector.leading:
                return True, "follower"
            return (operator.synced, "ok" if operator.synced else "caches not synced")

        app = make_app(metrics.registry, healthy, ready)
        runners = [await start(app, config.metrics_host, config.metrics_port)]
        if config.probe_port != config.metrics_port:
            runners.append(await start(app, config.metrics_host, config.probe_port))
        log.info(
            "operator starting",
            namespace=config.namespace,
            metrics=f"{config.metrics_host}:{config.metrics_port}",
            probes=f"{config.metrics_host}:{config.probe_port}",
        )
        try:
            if install:
                await install_crd(rest)
                await ensure_namespace(rest, config.namespace)
                await install_sample_policy(rest)
            if elector is not None:
                await elector.acquire()
            async with asyncio.TaskGroup() as group:
                if elector is not None:
                    liveness.tasks.append(group.create_task(elector.hold(), name="leader-lease"))
                liveness.tasks.append(group.create_task(operator.run(), name="operator"))
                if status_line:
                    group.create_task(_status_line(operator), name="status-line")
        except asyncio.CancelledError:
            if not stopping:
                raise
            log.info("operator stopped")
            return 0
        except Exception:
            log.exception("operator failed")
            return 1
        finally:
            if elector is not None:
                await elector.release()
            for runner in runners:
                await runner.cleanup()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
    return 1


def _identity() -> str:
    """Pod name inside a cluster (HOSTNAME), plus the pid so two local runs differ."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}-{os.getpid()}"


async def _status_line(operator: Operator) -> None:
    """A live line for people at a terminal; reads only the caches (no API calls)."""
    last = ""
    while True:
        await asyncio.sleep(2)
        raw, _, _ = operator.active_policy()
        status = (raw or {}).get("status") or {}
        ready = sum(1 for c in status.get("components", []) if c.get("state") == "ready")
        total = sum(1 for c in status.get("components", []) if c.get("state") != "disabled")
        gpu = int(operator.metrics.gpu_nodes_total._value.get())
        line = (
            f"policy={status.get('state', '-')} rollout={status.get('rolloutState', '-')}"
            f" components={ready}/{total} gpu-nodes={gpu} writes={operator.rest.writes}"
        )
        if line != last:
            with contextlib.suppress(Exception):
                sys.stderr.write(f"\r{line:<100}")
                sys.stderr.flush()
            last = line
