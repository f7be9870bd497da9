"""The toolkit check: a container started through the NVIDIA runtime can run ``nvidia-smi``.

Upstream's validator (``Toolkit.validate`` in cmd/nvidia-validator/main.go) runs plain
``nvidia-smi`` in its toolkit-validation init container, which asks for the ``nvidia``
RuntimeClass and ``NVIDIA_VISIBLE_DEVICES=all``: the binary is there and works only when
the toolkit injected the driver. This check runs the ``nvidia-smi`` it finds on ``PATH``
(or where the runtime injects it) and passes on exit status 0. Our validator runs it
as upstream's does, in its ``toolkit-validation`` init container, created only after
``driver-validation`` passed (``components/validator.py``): asking the runtime for GPUs
before the driver works would fail the container's start and back it off for minutes.

Where no ``nvidia-smi`` can be run (no GPUs given to the container, a test tree), the
check falls back to looking for the files: the runtime
binary and its config on the host. Paths are host paths; the host's root is mounted into
the container at ``host_root``. The toolkit container installs under
``/usr/local/nvidia/toolkit``; a host package installs to ``/usr/bin`` and ``/etc``. The
first candidate found wins.

Host paths are followed under ``host_root`` (`resolve_in_root`, as the driver check
does): a host package's links are absolute host paths, and followed in this container
they would point at its own files, so the toolkit would never be found and every
operand on the node would wait for it.

``toolkit-ready`` says which check passed, ``TOOLKIT_CHECK=nvidia-smi`` or
``TOOLKIT_CHECK=files`` (upstream's file is empty; its readers only test that it exists).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
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
NVIDIA_SMI = "nvidia-smi"
#: Where the runtime injects ``nvidia-smi`` into a container, searched after ``PATH``.
INJECTED_DIRS = ("/usr/bin",)
SMI_TIMEOUT_S = 60.0
#: The key in ``toolkit-ready`` naming the check that passed, and its values.
CHECK_FIELD = "TOOLKIT_CHECK"
CHECK_SMI = "nvidia-smi"
CHECK_FILES = "files"


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
    return CheckResult.passed(
        fields={CHECK_FIELD: CHECK_FILES},
        facts={"RUNTIME": binary, "RUNTIME_CONFIG": config[0]},
    )


def smi_dirs() -> tuple[str, ...]:
    """This container's ``PATH``, then where the runtime injects ``nvidia-smi``."""
    path = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d]
    return tuple(dict.fromkeys([*path, *INJECTED_DIRS]))


def find_nvidia_smi(dirs: Sequence[str], fs_root: Path = Path("/")) -> Path | None:
    """The first executable regular ``nvidia-smi`` in ``dirs`` (under ``fs_root``)."""
    for directory in dirs:
        if not directory.startswith("/"):
            continue  # a relative PATH entry depends on the working directory
        candidate = under_root(fs_root, f"{directory.rstrip('/')}/{NVIDIA_SMI}")
        try:
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return candidate
        except OSError:
            continue
    return None


def _last_line(*texts: str) -> str:
    for text in texts:
        lines = [line for line in text.splitlines() if line.strip()]
        if lines:
            return lines[-1].strip()
    return ""


def run_nvidia_smi(smi: Path, timeout_s: float = SMI_TIMEOUT_S) -> CheckResult | None:
    """Blocking: run ``smi`` as upstream does (no arguments). None when it cannot be
    started at all (the caller falls back to the file checks)."""
    try:
        done = subprocess.run(
            [str(smi)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return CheckResult.failed(f"{smi} did not finish within {timeout_s:g}s")
    except OSError:
        return None
    if done.returncode != 0:
        said = _last_line(done.stderr, done.stdout)
        return CheckResult.failed(
            f"{smi} exited with status {done.returncode} in a container started through"
            f" the NVIDIA runtime{': ' + said if said else ''}"
        )
    facts = {"NVIDIA_SMI": str(smi)}
    for line in done.stdout.splitlines():
        _, sep, rest = line.partition("Driver Version:")
        if sep and rest.split():
            facts["DRIVER_VERSION"] = rest.split()[0]
            break
    return CheckResult.passed(fields={CHECK_FIELD: CHECK_SMI}, facts=facts)


class ToolkitCheck:
    name = "toolkit"
    recheck = True

    def __init__(
        self,
        host_root: Path,
        runtime_dirs: Sequence[str] = DEFAULT_RUNTIME_DIRS,
        config_paths: Sequence[str] = DEFAULT_CONFIG_PATHS,
        *,
        nvidia_smi_dirs: Sequence[str] | None = None,
        fs_root: Path = Path("/"),
        timeout_s: float = SMI_TIMEOUT_S,
    ) -> None:
        """``nvidia_smi_dirs``: where to look for ``nvidia-smi`` (None: `smi_dirs`, read
        at each run); ``fs_root``: this container's / (a test points it into a tree)."""
        self.host_root = host_root
        self.runtime_dirs = tuple(runtime_dirs)
        self.config_paths = tuple(config_paths)
        self.nvidia_smi_dirs = None if nvidia_smi_dirs is None else tuple(nvidia_smi_dirs)
        self.fs_root = fs_root
        self.timeout_s = timeout_s

    def _run(self) -> CheckResult:
        dirs = smi_dirs() if self.nvidia_smi_dirs is None else self.nvidia_smi_dirs
        smi = find_nvidia_smi(dirs, self.fs_root)
        if smi is not None:
            result = run_nvidia_smi(smi, self.timeout_s)
            if result is not None:
                return result
        # No nvidia-smi to run: the runtime did not inject the driver here.
        found = find_toolkit(self.host_root, self.runtime_dirs, self.config_paths)
        if not found.ok:
            return CheckResult.failed(f"no {NVIDIA_SMI} to run here; {found.reason}")
        return found

    async def run(self) -> CheckResult:
        return await asyncio.to_thread(self._run)
