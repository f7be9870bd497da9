"""Where the driver is, on the host and in the operands' containers: the facts that
``driver-ready`` carries and that the toolkit, device plugin and MIG manager entrypoints
source (they mount the host's root at ``/host`` and the driver install directory at
``/driver-root``).

A driver installed on the host (an executable ``nvidia-smi`` under the host's root)
wins over the driver container, as upstream's validator decides. Otherwise the driver
is the container's install directory, and its device nodes live there when that
directory has a ``/dev`` of its own, else on the host.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

#: Where operands see the host's root and the driver install directory.
HOST_ROOT_CTR_PATH = "/host"
DRIVER_ROOT_CTR_PATH = "/driver-root"
DEFAULT_DRIVER_INSTALL_DIR = "/run/nvidia/driver"

#: Where a host-installed ``nvidia-smi`` may be, relative to the host's root.
HOST_NVIDIA_SMI_PATHS = (
    "/usr/bin/nvidia-smi",
    "/usr/sbin/nvidia-smi",
    "/bin/nvidia-smi",
    "/sbin/nvidia-smi",
    "/usr/lib/wsl/lib/nvidia-smi",
    "/opt/bin/nvidia-smi",
)
WSL_NVIDIA_SMI = "/usr/lib/wsl/lib/nvidia-smi"
_MAX_LINKS = 40


@dataclass(frozen=True, slots=True)
class DriverInfo:
    """Host paths (``driver_root``, ``dev_root``) and where operands see them."""

    is_host_driver: bool
    driver_root: str
    driver_root_ctr_path: str
    dev_root: str
    dev_root_ctr_path: str

    def fields(self) -> dict[str, str]:
        """The ``driver-ready`` content, keys and order as upstream's validator writes."""
        return {
            "IS_HOST_DRIVER": str(self.is_host_driver).lower(),
            "NVIDIA_DRIVER_ROOT": self.driver_root,
            "DRIVER_ROOT_CTR_PATH": self.driver_root_ctr_path,
            "NVIDIA_DEV_ROOT": self.dev_root,
            "DEV_ROOT_CTR_PATH": self.dev_root_ctr_path,
        }


def host_driver(host_rootfs: str) -> DriverInfo:
    """A driver installed on the host: driver and device nodes are the host's root."""
    return DriverInfo(True, host_rootfs, HOST_ROOT_CTR_PATH, host_rootfs, HOST_ROOT_CTR_PATH)


def container_driver(host_rootfs: str, install_dir: str, install_dir_here: Path) -> DriverInfo:
    """A driver in ``install_dir`` on the host (``install_dir_here`` in this container);
    its device nodes are there if it has a ``/dev`` directory, else on the host."""
    if (install_dir_here / "dev").is_dir():
        dev_root, dev_ctr = install_dir, DRIVER_ROOT_CTR_PATH
    else:
        dev_root, dev_ctr = host_rootfs, HOST_ROOT_CTR_PATH
    return DriverInfo(False, install_dir, DRIVER_ROOT_CTR_PATH, dev_root, dev_ctr)


def resolve_in_root(root: Path, path: str, *, strict: bool = False) -> Path | None:
    """``path`` under ``root`` with symlinks followed as the host would (an absolute
    target is the host's, so it stays under ``root``); None if it does not exist.

    Every check of a host path under the host root goes through here: the container's
    own ``Path.is_file()`` would follow an absolute link to this container's files, and
    miss the host's. ``strict``: an error other than "no such file" (EACCES: the mount
    is there but we may not look) is raised instead of read as "not there", so a check
    can say it could not look rather than that nothing is installed.
    """
    parts = list(PurePosixPath(path).relative_to("/").parts)
    here: list[str] = []
    hops = 0
    while parts:
        part = parts.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if here:
                here.pop()
            continue
        candidate = root.joinpath(*here, part)
        try:
            info = candidate.lstat()
        except OSError as exc:
            if strict and not isinstance(exc, FileNotFoundError | NotADirectoryError):
                raise
            return None
        if stat.S_ISLNK(info.st_mode):
            hops += 1
            if hops > _MAX_LINKS:
                return None
            target = PurePosixPath(os.readlink(candidate))
            if target.is_absolute():
                here = []
                parts = list(target.relative_to("/").parts) + parts
            else:
                parts = list(target.parts) + parts
            continue
        here.append(part)
    return root.joinpath(*here)


def host_nvidia_smi(host_root: Path) -> str | None:
    """The first host ``nvidia-smi`` that is a non-empty executable regular file."""
    for candidate in HOST_NVIDIA_SMI_PATHS:
        found = resolve_in_root(host_root, candidate)
        if found is None:
            continue
        try:
            info = found.stat()
        except OSError:
            continue
        if stat.S_ISREG(info.st_mode) and info.st_size > 0 and info.st_mode & 0o111:
            return candidate
    return None


def is_wsl(host_root: Path) -> bool:
    """WSL2 puts its driver in the host's ``/usr/lib/wsl``; it has no /dev/char to link."""
    try:
        return (host_root / WSL_NVIDIA_SMI.lstrip("/")).lstat().st_size != 0
    except OSError:
        return False
