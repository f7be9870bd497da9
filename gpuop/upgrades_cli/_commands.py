"""`gpuop upgrade status` and `gpuop upgrade plan`: read the cluster, print a report."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from kubernetes_asyncio.config.kube_config import KUBE_CONFIG_DEFAULT_LOCATION

from gpuop._local import LocalClusterMissing, local_cluster
from gpuop.kube.client import KubeconfigError, api_client
from gpuop.kube.informer import Informer, ResourceSpec
from gpuop.kube.kinds import KINDS
from gpuop.kube.rest import Rest
from gpuop.upgrades_cli._owners import owner_plans, plans_json, render_plans
from gpuop.upgrades_cli._preflight import preflight_lines
from gpuop.upgrades_cli._render import nvd_gate_lines, render_status, status_json
from gpuop.upgrades_cli._snapshot import (
    DAEMONSET,
    NODE,
    NVD,
    PDB,
    POD,
    POLICY,
    REVISION,
    Objects,
    Snapshot,
    apply_sets,
    list_objects,
    snapshot,
)
from gpuop.upgrades_cli._windows import status_window_lines, windows_json
from statemachine.fleet_report import StatusReport, status_report

#: A burst of watch events (a node moving through several states) redraws once.
REDRAW_DEBOUNCE_SECONDS = 0.3


def kubeconfig_for(args: argparse.Namespace) -> Path | None:
    """Like kubectl: --kubeconfig, $KUBECONFIG, in-cluster; else the local cluster's
    kubeconfig when `gpuop cluster up` left one (as `gpuop run` does)."""
    if args.kubeconfig:
        return Path(args.kubeconfig)
    if os.environ.get("KUBECONFIG") or "KUBERNETES_SERVICE_HOST" in os.environ:
        return None
    default = Path(KUBE_CONFIG_DEFAULT_LOCATION).expanduser()
    try:
        local = local_cluster(Path(args.dir) if args.dir else None)
    except LocalClusterMissing:  # the operator image: kubectl's default or nothing
        if default.is_file():
            return None
        raise KubeconfigError(
            f"no cluster to read: pass --kubeconfig or set $KUBECONFIG ({default} does not exist)"
        ) from None
    if local.info() is not None:
        return local.kubeconfig
    if not default.is_file():
        raise KubeconfigError(
            f"no cluster to read: pass --kubeconfig, set $KUBECONFIG or start one with "
            f"`gpuop cluster up` ({default} does not exist, no local cluster in "
            f"{local.directory})"
        )
    return None


def _status(snap: Snapshot) -> StatusReport:
    return status_report(
        snap.nodes,
        snap.policy,
        snap.rules,
        snap.pdbs,
        snap.target,
        namespace=snap.namespace,
        now=time.time(),
        gate=snap.gate,
        held=snap.held,
        nvd_gates=snap.nvd_gates,
    )


def _print_status(report: StatusReport, output: str, snap: Snapshot) -> None:
    if output == "json":
        data = {**status_json(report), "windows": windows_json(snap.windows, snap.policy_name)}
        data["preflight"] = dict(snap.preflight)
        print(json.dumps(data, indent=2, sort_keys=True))
    else:
        sys.stdout.write(render_status(report, wide=output == "wide"))
        for line in status_window_lines(snap.windows, snap.policy_name):
            print(line)
        for line in preflight_lines(snap.preflight):
            print(line)


async def _watch(rest: Rest, args: argparse.Namespace) -> int:
    """Redraw on every watch event (debounced); never polls. Ends on Ctrl-C."""
    changed = asyncio.Event()

    def handler(event: str, old: Any, new: Any) -> None:
        changed.set()

    ns = args.namespace
    informers = [
        Informer(ResourceSpec(name, rest.lister(kind, namespace)), handler)
        for name, kind, namespace in (
            ("nodes", NODE, None),
            ("pods", POD, None),
            ("pdbs", PDB, None),
            ("daemonsets", DAEMONSET, ns),
            ("revisions", REVISION, ns),
            ("policies", POLICY, None),
            ("drivers", NVD, None),
        )
    ]
    tasks = [asyncio.create_task(i.run()) for i in informers]
    report: StatusReport | None = None
    try:
        await asyncio.gather(*(i.synced.wait() for i in informers))
        while True:
            changed.clear()
            objects = Objects(*(list(i.store.values()) for i in informers))
            snap = snapshot(objects, ns)
            report = _status(snap)
            if sys.stdout.isatty():
                sys.stdout.write("\x1b[H\x1b[2J")
            print(time.strftime("%H:%M:%S"), "gpuop upgrade status --watch (Ctrl-C ends)")
            _print_status(report, args.output, snap)
            sys.stdout.flush()
            await changed.wait()
            await asyncio.sleep(REDRAW_DEBOUNCE_SECONDS)
    except (KeyboardInterrupt, asyncio.CancelledError):
        pass
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
    return 1 if report is not None and report.failed else 0


async def _status_main(args: argparse.Namespace) -> int:
    async with api_client(kubeconfig_for(args)) as api:
        rest = Rest(api, KINDS)
        if args.watch:
            return await _watch(rest, args)
        snap = snapshot(await list_objects(rest, args.namespace), args.namespace)
        report = _status(snap)
    _print_status(report, args.output, snap)
    return 1 if report.failed else 0


async def _plan_main(args: argparse.Namespace) -> int:
    apply_sets({}, args.set or ())  # a bad proposal is named before any cluster is read
    async with api_client(kubeconfig_for(args)) as api:
        objects = await list_objects(Rest(api, KINDS), args.namespace)
    snap = snapshot(objects, args.namespace, args.set or ())
    # One plan per driver owner: each has its own budget, gate and windows.
    plans = owner_plans(snap, proposed=bool(args.set))
    if args.output == "json":
        data = {**plans_json(plans), "nvidiaDriverGates": dict(snap.nvd_gates)}
        data["preflight"] = dict(snap.preflight)  # the current driver templates' holds
        print(json.dumps(data, indent=2, sort_keys=True))
    else:
        text = render_plans(plans, ", ".join(args.set or ()))
        sys.stdout.write(text + "".join(f"{line}\n" for line in nvd_gate_lines(snap.nvd_gates)))
        sys.stdout.write("".join(f"{line}\n" for line in preflight_lines(snap.preflight)))
    return 0


def _run(main: Any, args: argparse.Namespace) -> int:
    """Errors (no cluster, a bad --set, the API refusing) go to the CLI's one handler."""
    code: int = asyncio.run(main(args))
    return code


def cmd_status(args: argparse.Namespace) -> int:
    return _run(_status_main, args)


def cmd_plan(args: argparse.Namespace) -> int:
    return _run(_plan_main, args)
