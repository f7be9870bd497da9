"""The toolkit check: the container runtime binary and its config exist on the host.

Paths are host paths; the host's root is mounted into the container at ``host_root``.
The toolkit container installs under ``/usr/local/nvidia/toolkit``; a host package
installs to ``/usr/bin`` and ``/etc``. The first candidate found wins.

Host paths are followed under ``host_root`` (`resolve_in_root`, as the driver check
does): a host package's links are absolute host paths, and followed in this container
they would point at its own files, so the toolkit would never be found and every
operand on the node would wait for it.
"""

from __future__ import annotations

import asyncio
import os
import tomllib
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from gpuop.nodeagent.checks import CheckResult
from gpuop.nodeagent.driver_root import resolve_in_root

RUNTIME_BINARY = "nvidia-container-runtime"
DEFAULT_RUNTIME_DIRS = ("/usr/local/nvidia/toolkit", "/usr/bin", "/usr/local/bin")
DEFAULT_CONFIG_PATHS = (
    "/usr/local/nvidia/toolkit/.config/nvidia-container-runtime/config.toml",
    "/etc/nvidia-container-runtime/config.toml",
)


class _Unreadable(Exception):
    pass


def under_root(host_root: Path, host_path: str) -> Path:
    """``host_path`` as seen from inside the container."""
    return host_root / PurePosixPath(host_path).relative_to("/")


def _host_file(host_root: Path, host_path: str) -> Path | None:
    """Where this container reaches ``host_path`` when that is a regular file on the
    host (links followed under ``host_root``); None when it is not there.

    Raises `_Unreadable` when the host root is mounted but may not be looked into: the
    check then says so instead of reporting a missing toolkit.
    """
    try:
        found = resolve_in_root(host_root, host_path, strict=True)
        return found if found is not None and found.is_file() else None
    except OSError as exc:  # EACCES and friends
        path = under_root(host_root, host_path)
        raise _Unreadable(f"cannot read {path}: {exc.strerror or exc}") from exc


def find_toolkit(
    host_root: Path,
    runtime_dirs: Sequence[str] = DEFAULT_RUNTIME_DIRS,
    config_paths: Sequence[str] = DEFAULT_CONFIG_PATHS,
) -> CheckResult:
    """Blocking: look for the runtime binary and a parseable config under ``host_root``."""
    try:
        runtime = next(
            (
                (d, found)
                for d in runtime_dirs
                if (found := _host_file(host_root, f"{d.rstrip('/')}/{RUNTIME_BINARY}"))
            ),
            None,
        )
        if runtime is None:
            return CheckResult.failed(
                f"{RUNTIME_BINARY} not found in {', '.join(runtime_dirs)} under {host_root}"
            )
        binary = f"{runtime[0].rstrip('/')}/{RUNTIME_BINARY}"
        if not os.access(runtime[1], os.X_OK):
            return CheckResult.failed(f"{binary} is not executable")
        config = next(
            ((c, found) for c in config_paths if (found := _host_file(host_root, c))), None
        )
    except _Unreadable as exc:
        return CheckResult.failed(str(exc))
    if config is None:
        return CheckResult.failed(
            f"runtime config not found at {', '.join(config_paths)} under {host_root}"
        )
    try:
        with config[1].open("rb") as fh:
            tomllib.load(fh)
    except OSError as exc:
        return CheckResult.failed(f"cannot read {config[0]}: {exc.strerror or exc}")
    except tomllib.TOMLDecodeError as exc:
        return CheckResult.failed(f"{config[0]} is not valid TOML: {exc}")
    # toolkit-ready is empty, as upstream's; what was found goes to the log.
    return CheckResult.passed(facts={"RUNTIME": binary, "RUNTIME_CONFIG": config[0]})
    # toolkit-ready is empty, as upstream's; what was found goes to the log.
    return CheckResult.passed(facts={"RUNTIME": binary, "RUNTIME_CONFIG": config})


class ToolkitCheck:
    name = "toolkit"
    recheck = True

    def __init__(
        self,
        host_root: Path,
        runtime_dirs: Sequence[str] = DEFAULT_RUNTIME_DIRS,
        config_paths: Sequence[str] = DEFAULT_CONFIG_PATHS,
    ) -> None:
        self.host_root = host_root
        self.runtime_dirs = tuple(runtime_dirs)
        self.config_paths = tuple(config_paths)

    async def run(self) -> CheckResult:
        return await asyncio.to_thread(
            find_toolkit, self.host_root, self.runtime_dirs, self.config_paths
        )
