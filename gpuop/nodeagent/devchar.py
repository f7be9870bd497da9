"""``/dev/char/MAJOR:MINOR`` links for every NVIDIA device node the driver can have.

runc with systemd cgroups re-applies a container's device rules after a
``systemctl daemon-reload`` by the ``/dev/char`` path of each device; without a link
there, containers lose their GPUs (NVIDIA/gpu-operator#430, #485). As upstream's
validator does, every *possible* node is linked (control devices, one per GPU found on
the PCI bus, MIG capabilities), not only those that exist now, and the control nodes
are created where missing, after loading the kernel modules if nothing has yet.

Paths: ``fs_root`` is this container's root (``/proc``, ``/sys``, the dev root's ``dev``);
``dev_char`` is the host's ``/dev/char`` as mounted here. A link's target is a host
path (``<dev root>/dev/nvidia0``): the link lives on the host.
"""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from gpuop.log import get_logger
from gpuop.nodeagent.driver_root import DriverInfo

log = get_logger(__name__)

GPU_MAJOR_NAMES = ("nvidia", "nvidia-frontend")
UVM_MAJOR = "nvidia-uvm"
CAPS_MAJOR = "nvidia-caps"
NVIDIA_VENDOR = 0x10DE
GPU_CLASSES = (0x0300, 0x0302)  # VGA and 3D controllers
KERNEL_MODULES = ("nvidia", "nvidia-uvm", "nvidia-modeset")
DEFAULT_DEV_CHAR = Path("/host-dev-char")


class DevCharError(Exception):
    """The links could not be made; the message says why."""


@dataclass(frozen=True, slots=True)
class DeviceNode:
    path: str  # host path
    major: int
    minor: int

    @property
    def link_name(self) -> str:
        return f"{self.major}:{self.minor}"


def parse_majors(text: str) -> dict[str, int]:
    """``/proc/devices``: NVIDIA device names and their major numbers."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        number, _, name = line.strip().partition(" ")
        name = name.strip()
        if number.isdigit() and name.startswith("nvidia"):
            out[name] = int(number)
    return out


def parse_mig_minors(text: str) -> dict[str, int]:
    """``/proc/driver/nvidia-caps/mig-minors``: capability (``config``,
    ``gpu0/gi1/access``, ``gpu0/gi1/ci0/access``) to minor number."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split(" ")
        if len(parts) == 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


def count_gpus(pci_devices: Path) -> int:
    """NVIDIA display and 3D controllers on the PCI bus, virtual functions left out."""
    count = 0
    try:
        entries = list(pci_devices.iterdir())
    except OSError:
        return 0
    for device in entries:
        try:
            vendor = int((device / "vendor").read_text().strip(), 16)
            klass = int((device / "class").read_text().strip(), 16)
        except (OSError, ValueError):
            continue
        if (
            vendor == NVIDIA_VENDOR
            and klass >> 8 in GPU_CLASSES
            and not (device / "physfn").exists()
        ):
            count += 1
    return count


def _join(root: str, path: str) -> str:
    return str(PurePosixPath(root) / PurePosixPath(path).relative_to("/"))


def _cap_path(minor: int) -> str:
    return f"/dev/nvidia-caps/nvidia-cap{minor}"


def possible_nodes(
    majors: dict[str, int], mig: dict[str, int] | None, gpus: int, dev_root: str
) -> list[DeviceNode]:
    """Every node the driver may create for ``gpus`` GPUs, as host paths under
    ``dev_root``. Raises DevCharError without the majors these need."""
    gpu_major = next((majors[n] for n in GPU_MAJOR_NAMES if n in majors), None)
    required = [("nvidia", gpu_major), (UVM_MAJOR, majors.get(UVM_MAJOR))]
    if mig is not None:
        required.append((CAPS_MAJOR, majors.get(CAPS_MAJOR)))
    missing = [name for name, major in required if major is None]
    if missing:
        raise DevCharError(f"missing device major(s) {', '.join(missing)} in /proc/devices")
    if gpus == 0:
        return []
    assert gpu_major is not None
    uvm = majors[UVM_MAJOR]
    caps = majors.get(CAPS_MAJOR, 0)
    mig = mig or {}

    def node(path: str, major: int, minor: int) -> DeviceNode:
        return DeviceNode(_join(dev_root, path), major, minor)

    nodes = [
        node("/dev/nvidia-modeset", gpu_major, 254),
        node("/dev/nvidiactl", gpu_major, 255),
        node("/dev/nvidia-uvm", uvm, 0),
        node("/dev/nvidia-uvm-tools", uvm, 1),
    ]
    nodes += [node(_cap_path(mig[c]), caps, mig[c]) for c in ("config", "monitor") if c in mig]
    for gpu in range(gpus):
        nodes.append(node(f"/dev/nvidia{gpu}", gpu_major, gpu))
        gi = 0
        while (gi_minor := mig.get(f"gpu{gpu}/gi{gi}/access")) is not None:
            nodes.append(node(_cap_path(gi_minor), caps, gi_minor))
            ci = 0
            while (ci_minor := mig.get(f"gpu{gpu}/gi{gi}/ci{ci}/access")) is not None:
                nodes.append(node(_cap_path(ci_minor), caps, ci_minor))
                ci += 1
            gi += 1
    return nodes


def control_nodes(majors: dict[str, int]) -> list[tuple[str, int, int]]:
    """(name, major, minor) of the control nodes created where missing."""
    gpu_major = next((majors[n] for n in GPU_MAJOR_NAMES if n in majors), None)
    uvm = majors.get(UVM_MAJOR)
    out: list[tuple[str, int, int]] = []
    if gpu_major is not None:
        out += [("nvidiactl", gpu_major, 255), ("nvidia-modeset", gpu_major, 254)]
    if uvm is not None:
        out += [("nvidia-uvm", uvm, 0), ("nvidia-uvm-tools", uvm, 1)]
    return out


Runner = Callable[[Sequence[str]], None]


def _run(argv: Sequence[str]) -> None:
    subprocess.run(list(argv), check=True, capture_output=True, timeout=120)


@dataclass
class DevCharLinker:
    """Makes the links for one node; see the module docstring for the paths."""

    fs_root: Path = Path("/")
    dev_char: Path = DEFAULT_DEV_CHAR
    run: Runner = field(default=_run)

    def _read(self, path: str) -> str | None:
        try:
            return (self.fs_root / path.lstrip("/")).read_text()
        except FileNotFoundError:
            return None

    def _load_modules(self, driver_root_here: Path) -> None:
        prefix = [] if driver_root_here == Path("/") else ["chroot", str(driver_root_here)]
        for module in KERNEL_MODULES:
            try:
                self.run([*prefix, "/sbin/modprobe", module])
            except (OSError, subprocess.SubprocessError) as exc:
                raise DevCharError(f"cannot load kernel module {module}: {exc}") from exc

    def _create_control_nodes(self, majors: dict[str, int], dev_root: str) -> None:
        # Where upstream creates them: the dev root's path in this container (for a
        # host driver, this container's own /dev). A custom host root has no such path
        # here: nothing to create then, the links are made all the same.
        dev = self.fs_root / dev_root.lstrip("/") / "dev"
        if not dev.is_dir():
            log.info("no device directory to create control nodes in", path=str(dev))
            return
        for name, major, minor in control_nodes(majors):
            path = dev / name
            if os.path.lexists(path):
                continue
            try:
                os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
            except OSError as exc:
                raise DevCharError(f"cannot create device node {path}: {exc}") from exc

    def link(self, info: DriverInfo, driver_root_here: Path) -> list[DeviceNode]:
        """Load modules if none is, create missing control nodes, link every node."""
        loaded = (self.fs_root / "sys/module/nvidia/refcnt").exists()
        # modprobe runs in the driver's root, which must then hold the device nodes too.
        if not loaded and (info.is_host_driver or info.dev_root == info.driver_root):
            self._load_modules(driver_root_here)
        majors = parse_majors(self._read("/proc/devices") or "")
        self._create_control_nodes(majors, info.dev_root)
        mig_text = self._read("/proc/driver/nvidia-caps/mig-minors")
        mig = parse_mig_minors(mig_text) if mig_text is not None else None
        pci = self.fs_root / "sys/bus/pci/devices"  # a privileged container's is the host's
        nodes = possible_nodes(majors, mig, count_gpus(pci), info.dev_root)
        if nodes:
            self.dev_char.mkdir(parents=True, exist_ok=True)
        for node in nodes:
            try:
                (self.dev_char / node.link_name).symlink_to(node.path)
            except FileExistsError:
                pass  # made by an earlier run (or the driver): the numbers are the same
            except OSError as exc:
                log.warning("cannot link", link=node.link_name, target=node.path, reason=str(exc))
        return nodes
