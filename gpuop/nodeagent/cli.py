"""``gpuop node-agent validate|validate-sandbox|export|health``: argument parsing.

``gpuop/cli.py`` calls :func:`add_subcommands`; each leaf parser sets ``func``, a
callable taking the parsed namespace and returning the exit status
(``gpuop.nodeagent.commands``).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from gpuop.log import get_logger
from gpuop.nodeagent.devchar import DEFAULT_DEV_CHAR
from gpuop.nodeagent.devices import DEFAULT_SYSFS
from gpuop.nodeagent.driver import CONTAINER_DRIVER_ROOT
from gpuop.nodeagent.driver_root import DEFAULT_DRIVER_INSTALL_DIR
from gpuop.nodeagent.sandbox import COMPONENTS as SANDBOX_COMPONENTS
from gpuop.nodeagent.status import CHECK_NAMES, DEFAULT_VALIDATIONS_DIR
from gpuop.nodeagent.toolkit import DEFAULT_CONFIG_PATHS, DEFAULT_RUNTIME_DIRS
from gpuop.nodeagent.workload import DEFAULT_CUDA_IMAGE

log = get_logger(__name__)

DEFAULT_NAMESPACE = "gpu-operator"
DEFAULT_HOST_ROOT = Path("/host")


def _command(name: str) -> Any:
    """``gpuop.nodeagent.commands.<name>``, imported when the command runs: the commands
    bring NVML, the exporter and the checks (about 4 MiB), which the operator, whose
    ``gpuop`` parser lists these subcommands too, never needs."""

    def run(args: argparse.Namespace) -> int:
        from gpuop.nodeagent import commands

        status: int = getattr(commands, name)(args)
        return status

    run.__name__ = name
    return run


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
    v.add_argument(
        "--image-pull-secret",
        action="append",
        default=[],
        dest="pull_secrets",
        help="Secret that pulls the workload pods' image (repeatable)",
    )
    v.add_argument("--priority-class", default=None, help="priority class of the workload pods")
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
    v.set_defaults(func=_command("run_validate"))

    s = sub.add_parser(
        "validate-sandbox",
        help="validate one part of a VM host (vfio-pci, vGPU manager and devices, CC mode)",
    )
    _common(s)
    s.add_argument(
        "--component",
        choices=SANDBOX_COMPONENTS,
        default=os.environ.get("COMPONENT") or None,
        required=not os.environ.get("COMPONENT"),
        help="what to validate (default: $COMPONENT, as upstream's validator)",
    )
    s.add_argument(
        "--wait",
        action="store_true",
        default=os.environ.get("WITH_WAIT", "").lower() == "true",
        help="retry until passing (default: $WITH_WAIT)",
    )
    s.add_argument(
        "--default-workload",
        default=os.environ.get("DEFAULT_GPU_WORKLOAD_CONFIG", "container"),
        help="the workload of a node without a valid nvidia.com/gpu.workload.config "
        "(default: $DEFAULT_GPU_WORKLOAD_CONFIG)",
    )
    s.add_argument("--sysfs", type=Path, default=DEFAULT_SYSFS, help="the host's /sys")
    s.add_argument("--host-root", type=Path, default=DEFAULT_HOST_ROOT, help="host / mount")
    s.set_defaults(func=_command("run_validate_sandbox"))

    e = sub.add_parser("export", help="serve per-GPU health and validation status metrics")
    _common(e)
    e.add_argument("--port", type=int, default=8000, help="port of /metrics")
    e.add_argument("--address", default="0.0.0.0", help="listen address")
    e.add_argument(
        "--no-xid-events",
        dest="xid_events",
        action="store_false",
        help="do not watch NVML's XID events (health is then read every --health-interval only)",
    )
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
    e.set_defaults(func=_command("run_export"))

    h = sub.add_parser(
        "health", help="report the GPUHealthy node condition (without serving metrics)"
    )
    _common(h)
    _health_args(h)
    h.set_defaults(func=_command("run_health"))


def _health_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--health-interval",
        type=float,
        default=10.0,
        help="seconds between GPU health reads (XID events are acted on at once)",
    )
