"""``gpuop node-agent validate|export|health``: what each command does once its arguments
are parsed (``gpuop.nodeagent.cli``): build the checks, the exporter and the health
reporter, wire them to the API server and NVML, and run until a signal stops them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Coroutine, Iterator, Mapping
from pathlib import Path
from typing import Any

from gpuop.log import get_logger
from gpuop.nodeagent.checks import Check
from gpuop.nodeagent.cuda import CudaCheck
from gpuop.nodeagent.devchar import DevCharLinker
from gpuop.nodeagent.devices import DevicePluginDevices, nvidia_pci_devices
from gpuop.nodeagent.driver import DriverCheck, DriverLayout
from gpuop.nodeagent.exporter import serve
from gpuop.nodeagent.health import HealthReporter, KubernetesNodeStatus, NodeStatusApi
from gpuop.nodeagent.kube import KubeApi, KubernetesApi
from gpuop.nodeagent.nvml import Nvml
from gpuop.nodeagent.nvml.real import PynvmlNvml
from gpuop.nodeagent.plugin import PluginCheck
from gpuop.nodeagent.sandbox import SandboxPaths, validate_sandbox
from gpuop.nodeagent.status import StatusFiles
from gpuop.nodeagent.toolkit import ToolkitCheck
from gpuop.nodeagent.validate import Backoff, Validator
from gpuop.nodeagent.workload import OwnerPod, WorkloadSpec
from gpuop.nodeagent.xid import XidCounts, XidWatcher

log = get_logger(__name__)


@contextlib.contextmanager
def _stop_on_signals(stop: asyncio.Event) -> Iterator[None]:
    """SIGTERM (the kubelet stopping the pod) and SIGINT set ``stop`` while inside."""
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT)
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    try:
        yield
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)


async def _api_client() -> Any:
    from kubernetes_asyncio import client
    from kubernetes_asyncio import config as kube_config

    config: Any = kube_config  # partly untyped
    if "KUBERNETES_SERVICE_HOST" in os.environ:
        config.load_incluster_config()
    else:
        await config.load_kube_config()
    return client.ApiClient()


def build_checks(
    args: argparse.Namespace,
    api: KubeApi | None,
    *,
    nvml_for: Callable[[Path], Nvml] = PynvmlNvml,
    fs_root: Path = Path("/"),
) -> list[Check]:
    """The checks ``validate`` runs. ``fs_root``: where this container's /proc and /sys
    are (a test points it, and the path arguments, into a scratch tree)."""
    spec = WorkloadSpec(
        node_name=args.node_name,
        namespace=args.namespace,
        image=args.cuda_image,
        runtime_class=args.runtime_class or None,
        image_pull_secrets=tuple(args.pull_secrets),
        priority_class=args.priority_class,
        owner=_owner(),
    )
    checks: list[Check] = []
    for name in args.checks:
        if name == "driver":
            layout = DriverLayout(
                host_root_here=args.host_root,
                driver_root_here=args.driver_root,
                validations_here=args.validations_dir,
                proc_modules_here=fs_root / "proc/modules",
                host_rootfs=args.host_rootfs,
                driver_install_dir=args.driver_install_dir,
            )
            linker = (
                DevCharLinker(fs_root=fs_root, dev_char=args.dev_char_dir)
                if args.dev_char_symlinks
                else None
            )
            checks.append(
                DriverCheck(
                    nvml_for,
                    layout,
                    driver_container=args.driver_container,
                    dev_char=linker,
                )
            )
        elif name == "toolkit":
            checks.append(
                ToolkitCheck(
                    args.host_root,
                    args.toolkit_runtime_dirs,
                    args.toolkit_config_paths,
                    fs_root=fs_root,
                )
            )
        elif name == "cuda" and api is not None:
            checks.append(CudaCheck(api, spec, timeout_s=args.workload_timeout))
        elif name == "plugin" and api is not None:
            workload = spec if args.plugin_workload else None
            checks.append(
                PluginCheck(api, args.node_name, workload=workload, timeout_s=args.workload_timeout)
            )
    return checks


def _owner() -> OwnerPod | None:
    name, uid = os.environ.get("POD_NAME"), os.environ.get("POD_UID")
    return OwnerPod(name, uid) if name and uid else None


async def validate_main(args: argparse.Namespace) -> int:
    needs_api = bool({"cuda", "plugin"} & set(args.checks))
    if needs_api and not args.node_name:
        log.error("node name missing: set --node-name or NODE_NAME")
        return 2
    api_client: Any = None
    try:
        if needs_api:
            try:
                api_client = await _api_client()
            except Exception as exc:
                log.error("kubernetes client unavailable", reason=f"{type(exc).__name__}: {exc}")
                return 1
        api = KubernetesApi(api_client) if api_client is not None else None
        validator = Validator(
            build_checks(args, api),
            StatusFiles(args.validations_dir),
            backoff=Backoff(args.backoff_initial, args.backoff_max),
            recheck_interval_s=args.recheck_interval,
        )
        if not args.wait:
            return 0 if await validator.run_once() else 1
        stop = asyncio.Event()
        with _stop_on_signals(stop):
            await validator.run_wait(stop)
        return 0
    finally:
        if api_client is not None:
            await api_client.close()


def _health_reporter(nvml: Nvml, api: NodeStatusApi, args: argparse.Namespace) -> HealthReporter:
    """The reporter, woken by the XID watcher the caller builds with its counts."""
    return HealthReporter(nvml, api, args.node_name, XidCounts(), interval_s=args.health_interval)


def _xid_watcher(nvml: Nvml, reporter: HealthReporter | None) -> XidWatcher:
    counts = reporter.xids if reporter is not None else XidCounts()
    wake = reporter.wake.set if reporter is not None else None
    return XidWatcher(nvml, counts, on_event=(lambda _: wake()) if wake else None)


async def export_main(args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    nvml = PynvmlNvml(args.driver_root)
    api_client: Any = None
    reporter: HealthReporter | None = None
    devices: DevicePluginDevices | None = None
    try:
        if args.node_name:
            try:
                api_client = await _api_client()
            except Exception as exc:  # the other metrics still matter
                log.warning(
                    "GPUHealthy and device plugin GPUs not reported: kubernetes client unavailable",
                    reason=f"{type(exc).__name__}: {exc}",
                )
        if api_client is not None:
            devices = DevicePluginDevices(KubernetesApi(api_client), args.node_name)
            if args.health:
                reporter = _health_reporter(nvml, KubernetesNodeStatus(api_client), args)
        watcher = _xid_watcher(nvml, reporter) if args.xid_events else None
        background: list[Callable[[asyncio.Event], Coroutine[Any, Any, None]]] = []
        if reporter is not None:
            background.append(reporter.run)
        if devices is not None:
            background.append(devices.run)
        with _stop_on_signals(stop):
            await serve(
                nvml,
                args.node_name,
                StatusFiles(args.validations_dir),
                stop,
                host=args.address,
                port=args.port,
                xid_events=args.xid_events,
                watcher=watcher,
                plugin_devices=devices,
                pci_devices=lambda: nvidia_pci_devices(args.sysfs),
                background=background,
            )
        return 0
    finally:
        if api_client is not None:
            await api_client.close()


async def health_main(args: argparse.Namespace) -> int:
    if not args.node_name:
        log.error("node name missing: set --node-name or NODE_NAME")
        return 2
    try:
        api_client = await _api_client()
    except Exception as exc:
        log.error("kubernetes client unavailable", reason=f"{type(exc).__name__}: {exc}")
        return 1
    nvml = PynvmlNvml(args.driver_root)
    stop = asyncio.Event()
    try:
        reporter = _health_reporter(nvml, KubernetesNodeStatus(api_client), args)
        watcher = _xid_watcher(nvml, reporter)
        with _stop_on_signals(stop):
            async with asyncio.TaskGroup() as group:
                group.create_task(watcher.run(stop))
                group.create_task(reporter.run(stop))
        return 0
    finally:
        await api_client.close()


def run_validate(args: argparse.Namespace) -> int:
    return asyncio.run(validate_main(args))


async def validate_sandbox_main(args: argparse.Namespace) -> int:
    """One sandbox check (an init container of the sandbox validator); exit 0 once it
    passed, 1 when it has not and ``--wait`` is off."""
    api = KubernetesApi(await _api_client())

    async def labels() -> Mapping[str, str]:
        return await api.get_node_labels(args.node_name) or {}

    paths = SandboxPaths(args.validations_dir, args.sysfs, args.host_root, args.driver_root)
    passed = await validate_sandbox(
        args.component, labels, args.default_workload, paths, wait=args.wait
    )
    return 0 if passed else 1


def run_validate_sandbox(args: argparse.Namespace) -> int:
    return asyncio.run(validate_sandbox_main(args))


def run_export(args: argparse.Namespace) -> int:
    return asyncio.run(export_main(args))


def run_health(args: argparse.Namespace) -> int:
    return asyncio.run(health_main(args))
