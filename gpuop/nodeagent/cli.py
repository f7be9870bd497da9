"""``gpuop node-agent validate|export|health``: argument parsing and process wiring.

``gpuop/cli.py`` calls :func:`add_subcommands`; each leaf parser sets ``func``, a
callable taking the parsed namespace and returning the exit status.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

from gpuop.log import get_logger
from gpuop.nodeagent.checks import Check
from gpuop.nodeagent.cuda import CudaCheck
from gpuop.nodeagent.devchar import DEFAULT_DEV_CHAR, DevCharLinker
from gpuop.nodeagent.devices import DEFAULT_SYSFS, DevicePluginDevices, nvidia_pci_devices
from gpuop.nodeagent.driver import CONTAINER_DRIVER_ROOT, DriverCheck, DriverLayout
from gpuop.nodeagent.driver_root import DEFAULT_DRIVER_INSTALL_DIR
from gpuop.nodeagent.exporter import serve
from gpuop.nodeagent.health import HealthReporter, KubernetesNodeStatus, NodeStatusApi
from gpuop.nodeagent.kube import KubeApi, KubernetesApi
from gpuop.nodeagent.plugin import PluginCheck
from gpuop.nodeagent.status import CHECK_NAMES, DEFAULT_VALIDATIONS_DIR, StatusFiles
from gpuop.nodeagent.toolkit import DEFAULT_CONFIG_PATHS, DEFAULT_RUNTIME_DIRS, ToolkitCheck
from gpuop.nodeagent.validate import Backoff, Validator
from gpuop.nodeagent.workload import DEFAULT_CUDA_IMAGE, OwnerPod, WorkloadSpec
from gpuop.nodeagent.xid import XidCounts, XidWatcher
from gpuop.nvml import Nvml
from gpuop.nvml.real import PynvmlNvml

log = get_logger(__name__)

DEFAULT_NAMESPACE = "gpu-operator"
DEFAULT_HOST_ROOT = Path("/host")


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _checks(text: str) -> list[str]:
    wanted = _csv(text)
    unknown = sorted(set(wanted) - set(CHECK_NAMES))
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown check(s) {', '.join(unknown)}; choose from {','.join(CHECK_NAMES)}"
        )
    return [c for c in CHECK_NAMES if c in wanted]  # always in dependency order


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--driver-root",
        type=Path,
        default=Path(os.environ.get("DRIVER_ROOT", str(CONTAINER_DRIVER_ROOT))),
        help="where the driver's files are, as seen in this container: the driver "
        "container's root (default /run/nvidia/driver) or the host's (/ or /host); "
        "validate finds a driver installed on the host by itself (under --host-root)",
    )
    parser.add_argument(
        "--validations-dir",
        type=Path,
        default=DEFAULT_VALIDATIONS_DIR,
        help="directory of the *-ready status files",
    )
    parser.add_argument(
        "--node-name",
        default=os.environ.get("NODE_NAME", ""),
        help="this node's name (default: $NODE_NAME)",
    )


def add_subcommands(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add ``node-agent validate``, ``node-agent export`` and ``node-agent health``."""
    agent = subparsers.add_parser("node-agent", help="validator and status exporter for a GPU node")
    sub = agent.add_subparsers(dest="node_agent_command", required=True)

    v = sub.add_parser("validate", help="validate the node's GPU stack, write status files")
    _common(v)
    v.add_argument("--wait", action="store_true", help="retry until passing, then stay up")
    v.add_argument("--host-root", type=Path, default=DEFAULT_HOST_ROOT, help="host / mount")
    v.add_argument(
        "--host-rootfs",
        default=os.environ.get("HOST_ROOT", "/"),
        help="the host's root on the host (hostPaths.rootFS; default $HOST_ROOT or /)",
    )
    v.add_argument(
        "--driver-install-dir",
        default=os.environ.get("DRIVER_INSTALL_DIR", DEFAULT_DRIVER_INSTALL_DIR),
        help="the driver install directory on the host (hostPaths.driverInstallDir), "
        "mounted here at --driver-root",
    )
    v.add_argument(
        "--driver-container",
        action="store_true",
        help="the policy runs a driver container: without a driver on the host, wait "
        "for its .driver-ctr-ready and the GPUDirect modules it names",
    )
    v.add_argument(
        "--dev-char-dir",
        type=Path,
        default=DEFAULT_DEV_CHAR,
        help="the host's /dev/char as mounted here",
    )
    v.add_argument(
        "--no-dev-char-symlinks",
        dest="dev_char_symlinks",
        action="store_false",
        default=os.environ.get("DISABLE_DEV_CHAR_SYMLINK_CREATION", "").lower() != "true",
        help="do not link NVIDIA device nodes in /dev/char "
        "(default: $DISABLE_DEV_CHAR_SYMLINK_CREATION)",
    )
    v.add_argument(
        "--checks", type=_checks, default=list(CHECK_NAMES), help="comma list, run in order"
    )
    v.add_argument(
        "--namespace",
        default=os.environ.get("POD_NAMESPACE", DEFAULT_NAMESPACE),
        help="namespace for workload pods (default: $POD_NAMESPACE)",
    )
    v.add_argument("--cuda-image", default=DEFAULT_CUDA_IMAGE, help="CUDA vectorAdd image")
    v.add_argument(
        "--runtime-class", default="nvidia", help="runtime class of workload pods ('' = none)"
    )
    v.add_argument("--image-pull-secret", action="append", default=[], dest="pull_secrets")
    v.add_argument("--priority-class", default=None)
    v.add_argument("--workload-timeout", type=float, default=300.0, help="seconds")
    v.add_argument(
        "--plugin-workload",
        action="store_true",
        help="after allocatable shows GPUs, also run a pod that requests one",
    )
    v.add_argument(
        "--toolkit-runtime-dirs", type=_csv, default=list(DEFAULT_RUNTIME_DIRS), help="host dirs"
    )
    v.add_argument(
        "--toolkit-config-paths", type=_csv, default=list(DEFAULT_CONFIG_PATHS), help="host paths"
    )
    v.add_argument("--backoff-initial", type=float, default=1.0, help="seconds")
    v.add_argument("--backoff-max", type=float, default=30.0, help="seconds")
    v.add_argument(
        "--recheck-interval",
        type=float,
        default=60.0,
        help="with --wait: seconds between re-runs of driver, toolkit and plugin (0 = never)",
    )
    v.set_defaults(func=run_validate)

    e = sub.add_parser("export", help="serve per-GPU health and validation status metrics")
    _common(e)
    e.add_argument("--port", type=int, default=8000)
    e.add_argument("--address", default="0.0.0.0", help="listen address")
    e.add_argument("--no-xid-events", dest="xid_events", action="store_false")
    e.add_argument(
        "--sysfs",
        type=Path,
        default=DEFAULT_SYSFS,
        help="sysfs mount whose PCI bus is counted for NVIDIA devices",
    )
    _health_args(e)
    e.add_argument(
        "--no-health",
        dest="health",
        action="store_false",
        help="do not report the GPUHealthy node condition (on by default with a node name)",
    )
    e.set_defaults(func=run_export)

    h = sub.add_parser(
        "health", help="report the GPUHealthy node condition (without serving metrics)"
    )
    _common(h)
    _health_args(h)
    h.set_defaults(func=run_health)


def _health_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--health-interval",
        type=float,
        default=10.0,
        help="seconds between GPU health reads (XID events are acted on at once)",
    )


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
                ToolkitCheck(args.host_root, args.toolkit_runtime_dirs, args.toolkit_config_paths)
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


def run_export(args: argparse.Namespace) -> int:
    return asyncio.run(export_main(args))


def run_health(args: argparse.Namespace) -> int:
    return asyncio.run(health_main(args))
