"""The node file contract: what the node agent leaves in /run/nvidia/validations and
/dev/char for each driver mode equals what upstream's validator (v26.7) leaves there.

NVIDIA's toolkit, device plugin and MIG manager entrypoints source ``driver-ready``; the
keys and values per mode below are upstream's (its ``createStatusFile``), not ours to
choose. Each case renders the validator's command from a policy, parses it with the
node agent's own CLI, points its container paths into a scratch node (fake NVML, fake
/proc, /sys, device nodes and driver roots), and runs the checks once.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import crd
from components import RenderContext, validator
from gpuop.devcluster.nvml_fake import A100_SXM4_80GB, TESLA_T4, FakeNvml, make_gpus
from gpuop.nodeagent import cli, commands
from gpuop.nodeagent.devchar import DevCharError, DevCharLinker, possible_nodes
from gpuop.nodeagent.driver_root import DriverInfo, container_driver, host_driver
from gpuop.nodeagent.kube_memory import InMemoryKube
from gpuop.nodeagent.nvml import Nvml
from gpuop.nodeagent.status import StatusFiles
from gpuop.nodeagent.validate import Validator

NODE = "gpu-node-0000"
GPU_MAJOR, UVM_MAJOR, CAPS_MAJOR = 195, 510, 235
PROC_DEVICES = f"""Character devices:
  1 mem
{GPU_MAJOR} nvidia-frontend
{CAPS_MAJOR} nvidia-caps
{UVM_MAJOR} nvidia-uvm

Block devices:
  8 sd
"""
#: Two GPUs, an NVIDIA audio function, a virtual function and another vendor's card.
PCI = {
    "0000:3b:00.0": ("0x10de", "0x030200", False),
    "0000:3b:00.1": ("0x10de", "0x040300", False),
    "0000:86:00.0": ("0x10de", "0x030000", False),
    "0000:86:00.4": ("0x10de", "0x030200", True),
    "0000:af:00.0": ("0x8086", "0x030000", False),
}
MIG_MINORS = "config 1\nmonitor 2\ngpu0/gi0/access 21\ngpu0/gi0/ci0/access 22\n"
CONTROL = ("nvidiactl", "nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools")


@dataclass
class Node:
    """A scratch node: ``root`` is the validator container's /, the host's root is
    mounted at ``root/host``, the driver install directory at ``root/run/nvidia/driver``."""

    root: Path
    nvml_roots: list[Path] = field(default_factory=list)

    def here(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def write(self, path: str, text: str, mode: int = 0o644) -> None:
        target = self.here(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        target.chmod(mode)

    def host_driver(self) -> None:
        self.write("/host/usr/bin/nvidia-smi", "#!/bin/sh\n", 0o755)

    def driver_container(self, flags: Mapping[str, bool] | None = None) -> None:
        """What a driver container leaves: its root, with /dev, and .driver-ctr-ready."""
        self.write("/run/nvidia/driver/usr/bin/nvidia-smi", "#!/bin/sh\n", 0o755)
        self.here("/run/nvidia/driver/dev").mkdir(parents=True, exist_ok=True)
        self.driver_ctr_ready(flags or {})

    def driver_ctr_ready(self, flags: Mapping[str, bool]) -> None:
        all_flags = {"GDRCOPY_ENABLED": False, "GDS_ENABLED": False}
        all_flags |= {"GPU_DIRECT_RDMA_ENABLED": False, **flags}
        text = "".join(f"{k}: {str(v).lower()}\n" for k, v in all_flags.items())
        self.write("/run/nvidia/validations/.driver-ctr-ready", text)

    def kernel(self, dev_root: str, *, mig: bool = False, modules: str = "") -> None:
        """The loaded driver's /proc and /sys, the GPUs on the PCI bus and existing
        control device nodes in the dev root."""
        self.write("/proc/devices", PROC_DEVICES)
        self.write("/proc/modules", f"nvidia 1 0 - Live 0x0\n{modules}")
        self.write("/sys/module/nvidia/refcnt", "4\n")
        if mig:
            self.write("/proc/driver/nvidia-caps/mig-minors", MIG_MINORS)
        for address, (vendor, klass, vf) in PCI.items():
            device = f"/sys/bus/pci/devices/{address}"
            self.write(f"{device}/vendor", vendor + "\n")
            self.write(f"{device}/class", klass + "\n")
            if vf:
                self.here(f"{device}/physfn").mkdir(exist_ok=True)
        for name in CONTROL:
            self.write(f"{dev_root.rstrip('/')}/dev/{name}", "")

    def toolkit(self) -> None:
        toolkit = "/host/usr/local/nvidia/toolkit"
        self.write(f"{toolkit}/nvidia-container-runtime", "#!/bin/sh\n", 0o755)
        self.write(f"{toolkit}/.config/nvidia-container-runtime/config.toml", "[nvidia]\n")

    def nvml_at(self, driver_root: str) -> Callable[[Path], Nvml]:
        """NVML loads only from the driver root the node really has."""

        def nvml_for(root: Path) -> Nvml:
            self.nvml_roots.append(root)
            if root == self.here(driver_root):
                return FakeNvml(make_gpus(A100_SXM4_80GB, TESLA_T4))
            return FakeNvml.library_not_found()

        return nvml_for

    def files(self) -> dict[str, str]:
        directory = self.here("/run/nvidia/validations")
        return {p.name: p.read_text() for p in sorted(directory.iterdir()) if p.is_file()}

    def links(self) -> dict[str, str]:
        directory = self.here("/host-dev-char")
        if not directory.exists():
            return {}
        return {p.name: os.readlink(p) for p in sorted(directory.iterdir())}


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_subcommands(parser.add_subparsers())
    return parser.parse_args(argv)


async def validate(node: Node, policy: dict[str, Any], nvml_root: str) -> bool:
    """The validator pod's rendered steps for `policy` (driver-validation's check,
    toolkit-validation's, the main container's), each run once on `node`, in order."""
    spec = crd.ClusterPolicySpec.model_validate(policy)
    kube = InMemoryKube(allocatable={NODE: {"nvidia.com/gpu": "2"}})
    for step in validator.steps(spec):
        args = parse([*step[1:], "--node-name", NODE])  # without the program name
        for name in ("driver_root", "host_root", "validations_dir", "dev_char_dir"):
            setattr(args, name, node.here(str(getattr(args, name))))
        nvml = node.nvml_at(nvml_root)
        checks = commands.build_checks(args, kube, nvml_for=nvml, fs_root=node.root)
        for check in checks:  # no waiting between pod polls in a unit test
            if hasattr(check, "poll_s"):
                setattr(check, "poll_s", 0)  # noqa: B010
        if not await Validator(checks, StatusFiles(args.validations_dir)).run_once():
            return False
    return True


def driver_ready(info: Mapping[str, str]) -> str:
    return "".join(f"{k}={v}\n" for k, v in info.items())


CONTAINER = {
    "IS_HOST_DRIVER": "false",
    "NVIDIA_DRIVER_ROOT": "/run/nvidia/driver",
    "DRIVER_ROOT_CTR_PATH": "/driver-root",
    "NVIDIA_DEV_ROOT": "/run/nvidia/driver",
    "DEV_ROOT_CTR_PATH": "/driver-root",
}
HOST = {
    "IS_HOST_DRIVER": "true",
    "NVIDIA_DRIVER_ROOT": "/",
    "DRIVER_ROOT_CTR_PATH": "/host",
    "NVIDIA_DEV_ROOT": "/",
    "DEV_ROOT_CTR_PATH": "/host",
}
#: Upstream's toolkit-ready is empty; ours names the check that passed (its readers only
#: test that it exists). No nvidia-smi in the scratch container: the file checks ran.
EMPTY_STATUS = {"toolkit-ready": "TOOLKIT_CHECK=files\n", "cuda-ready": "", "plugin-ready": ""}


def links_for(dev_root: str, *, mig: bool = False) -> dict[str, str]:
    """Upstream's links for two GPUs: control nodes, each GPU, MIG capabilities."""
    dev = f"{dev_root.rstrip('/')}/dev"
    links = {
        f"{GPU_MAJOR}:254": f"{dev}/nvidia-modeset",
        f"{GPU_MAJOR}:255": f"{dev}/nvidiactl",
        f"{UVM_MAJOR}:0": f"{dev}/nvidia-uvm",
        f"{UVM_MAJOR}:1": f"{dev}/nvidia-uvm-tools",
        f"{GPU_MAJOR}:0": f"{dev}/nvidia0",
        f"{GPU_MAJOR}:1": f"{dev}/nvidia1",
    }
    if mig:
        for minor in (1, 2, 21, 22):
            links[f"{CAPS_MAJOR}:{minor}"] = f"{dev}/nvidia-caps/nvidia-cap{minor}"
    return links


async def test_driver_container(tmp_path: Path) -> None:
    """Default policy, the driver DaemonSet's container installed the driver."""
    node = Node(tmp_path)
    node.kernel("/run/nvidia/driver", mig=True)
    node.toolkit()
    node.driver_container()
    assert await validate(node, {}, "/run/nvidia/driver")
    assert node.files() == {
        ".driver-ctr-ready": (
            "GDRCOPY_ENABLED: false\nGDS_ENABLED: false\nGPU_DIRECT_RDMA_ENABLED: false\n"
        ),
        "driver-ready": driver_ready(CONTAINER),
        **EMPTY_STATUS,
    }
    assert node.links() == links_for("/run/nvidia/driver", mig=True)
    assert set(node.nvml_roots) == {node.here("/run/nvidia/driver")}


async def test_driver_container_not_ready_yet(tmp_path: Path) -> None:
    """With a driver DaemonSet and no host driver, nothing before `.driver-ctr-ready`:
    a driver half installed in /run/nvidia/driver must not count."""
    node = Node(tmp_path)
    node.kernel("/run/nvidia/driver")
    node.toolkit()
    node.driver_container()
    node.here("/run/nvidia/validations/.driver-ctr-ready").unlink()
    assert not await validate(node, {}, "/run/nvidia/driver")
    assert node.files() == {}
    assert node.links() == {}
    assert node.nvml_roots == []


async def test_precompiled_driver_with_gpudirect(tmp_path: Path) -> None:
    """A precompiled driver container is a driver container to the validator; the
    GPUDirect modules its `.driver-ctr-ready` enables each get a `*-ready` file once
    loaded."""
    policy = {
        "driver": {"usePrecompiled": True, "rdma": {"enabled": True}},
        "gds": {"enabled": True},
        "gdrcopy": {"enabled": True},
    }
    flags = {"GDRCOPY_ENABLED": True, "GDS_ENABLED": True, "GPU_DIRECT_RDMA_ENABLED": True}
    node = Node(tmp_path)
    node.kernel("/run/nvidia/driver", modules="gdrdrv 1 0 - Live 0x0\n")
    node.toolkit()
    node.driver_container(flags)
    assert not await validate(node, policy, "/run/nvidia/driver")  # nvidia_fs not loaded
    assert node.files().keys() == {".driver-ctr-ready"}
    node.kernel(
        "/run/nvidia/driver",
        modules="gdrdrv 1 0 - Live 0x0\nnvidia_fs 1 0 - Live 0x0\nnvidia_peermem 1 0 - Live 0\n",
    )
    assert await validate(node, policy, "/run/nvidia/driver")
    files = node.files()
    assert files.pop(".driver-ctr-ready")
    assert files == {
        "driver-ready": driver_ready(CONTAINER),
        "gdrcopy-ready": "",
        "nvidia-fs-ready": "",
        "nvidia-peermem-ready": "",
        **EMPTY_STATUS,
    }
    assert node.links() == links_for("/run/nvidia/driver")


async def test_host_driver_wins_over_the_driver_container(tmp_path: Path) -> None:
    """A driver installed on the host is used even where the policy runs a driver
    DaemonSet (whose container then stays out of the way), without waiting for it."""
    node = Node(tmp_path)
    node.kernel("/")
    node.toolkit()
    node.host_driver()
    assert await validate(node, {}, "/host")
    assert node.files() == {"driver-ready": driver_ready(HOST), **EMPTY_STATUS}
    assert node.links() == links_for("/")
    assert set(node.nvml_roots) == {node.here("/host")}


async def test_driver_disabled_host_driver(tmp_path: Path) -> None:
    """`driver.enabled: false` with the driver on the host (upstream's host-driver-cdi
    scenario), and a custom host root: NVIDIA_DRIVER_ROOT is the host path."""
    policy = {"driver": {"enabled": False}, "cdi": {"enabled": True}}
    node = Node(tmp_path)
    node.kernel("/")
    node.toolkit()
    node.host_driver()
    assert await validate(node, policy, "/host")
    assert node.files() == {"driver-ready": driver_ready(HOST), **EMPTY_STATUS}
    node.here("/run/nvidia/validations/driver-ready").unlink()
    custom = {**policy, "hostPaths": {"rootFS": "/sysroot"}}
    assert await validate(node, custom, "/host")
    assert node.files()["driver-ready"] == driver_ready(
        {**HOST, "NVIDIA_DRIVER_ROOT": "/sysroot", "NVIDIA_DEV_ROOT": "/sysroot"}
    )


async def test_driver_disabled_driver_installed_elsewhere(tmp_path: Path) -> None:
    """`driver.enabled: false`, no host driver: a driver someone else put in the install
    directory is used without any `.driver-ctr-ready`; without a /dev of its own, its
    device nodes are the host's."""
    node = Node(tmp_path)
    node.kernel("/")
    node.toolkit()
    node.write("/run/nvidia/driver/usr/bin/nvidia-smi", "#!/bin/sh\n", 0o755)
    assert await validate(node, {"driver": {"enabled": False}}, "/run/nvidia/driver")
    expected = {**CONTAINER, "NVIDIA_DEV_ROOT": "/", "DEV_ROOT_CTR_PATH": "/host"}
    assert node.files() == {"driver-ready": driver_ready(expected), **EMPTY_STATUS}
    assert node.links() == links_for("/")


async def test_dev_char_links_can_be_turned_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Upstream's DISABLE_DEV_CHAR_SYMLINK_CREATION, set in validator.driver.env, reaches
    the agent and keeps it from linking."""
    env = [{"name": "DISABLE_DEV_CHAR_SYMLINK_CREATION", "value": "true"}]
    spec = crd.ClusterPolicySpec.model_validate({"validator": {"driver": {"env": env}}})
    ctx = RenderContext(namespace="gpu-operator", operator_image="gpuop:test")
    ds = next(o for o in validator.COMPONENT.render(spec, ctx) if o["kind"] == "DaemonSet")
    init = ds["spec"]["template"]["spec"]["initContainers"][0]
    assert init["name"] == validator.DRIVER_VALIDATION
    assert {"name": "DISABLE_DEV_CHAR_SYMLINK_CREATION", "value": "true"} in init["env"]
    monkeypatch.setenv("DISABLE_DEV_CHAR_SYMLINK_CREATION", "true")
    node = Node(tmp_path)
    node.kernel("/run/nvidia/driver")
    node.toolkit()
    node.driver_container()
    assert await validate(node, {}, "/run/nvidia/driver")
    assert node.files()["driver-ready"] == driver_ready(CONTAINER)
    assert node.links() == {}


def test_driver_info_per_mode(tmp_path: Path) -> None:
    assert host_driver("/") == DriverInfo(True, "/", "/host", "/", "/host")
    assert container_driver("/", "/run/nvidia/driver", tmp_path) == DriverInfo(
        False, "/run/nvidia/driver", "/driver-root", "/", "/host"
    )
    (tmp_path / "dev").mkdir()
    assert container_driver("/", "/run/nvidia/driver", tmp_path) == DriverInfo(
        False, "/run/nvidia/driver", "/driver-root", "/run/nvidia/driver", "/driver-root"
    )


def test_links_need_the_gpu_and_uvm_majors() -> None:
    with pytest.raises(DevCharError, match="nvidia-uvm"):
        possible_nodes({"nvidia": GPU_MAJOR}, None, 1, "/")
    with pytest.raises(DevCharError, match="nvidia-caps"):
        possible_nodes({"nvidia": GPU_MAJOR, "nvidia-uvm": UVM_MAJOR}, {}, 1, "/")
    assert possible_nodes({"nvidia": GPU_MAJOR, "nvidia-uvm": UVM_MAJOR}, None, 0, "/") == []


def test_modules_loaded_in_the_driver_root_when_none_is(tmp_path: Path) -> None:
    """As upstream: only when the nvidia module is not loaded, and only where modprobe
    can run in the driver's root (a host driver, or device nodes in the driver root)."""
    node = Node(tmp_path)
    node.kernel("/run/nvidia/driver")
    node.here("/sys/module/nvidia/refcnt").unlink()
    ran: list[list[str]] = []
    linker = DevCharLinker(
        fs_root=tmp_path, dev_char=tmp_path / "dev-char", run=lambda a: ran.append(list(a))
    )
    info = container_driver("/", "/run/nvidia/driver", node.here("/run/nvidia/driver"))
    linker.link(info, Path("/run/nvidia/driver"))
    assert ran == [
        ["chroot", "/run/nvidia/driver", "/sbin/modprobe", m]
        for m in ("nvidia", "nvidia-uvm", "nvidia-modeset")
    ]
    ran.clear()
    split = DriverInfo(False, "/run/nvidia/driver", "/driver-root", "/", "/host")
    node.kernel("/")
    node.here("/sys/module/nvidia/refcnt").unlink()
    linker.link(split, Path("/run/nvidia/driver"))
    assert ran == []


@pytest.mark.skipif(os.geteuid() != 0, reason="creating device nodes needs root")
def test_missing_control_nodes_are_created(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.kernel("/")
    for name in CONTROL:
        node.here(f"/dev/{name}").unlink()
    linker = DevCharLinker(fs_root=tmp_path, dev_char=tmp_path / "dev-char")
    try:
        linker.link(host_driver("/"), tmp_path / "host")
    except DevCharError as exc:  # a container without CAP_MKNOD
        pytest.skip(str(exc))
    ctl = os.stat(node.here("/dev/nvidiactl"))
    assert (os.major(ctl.st_rdev), os.minor(ctl.st_rdev)) == (GPU_MAJOR, 255)
    uvm_tools = os.stat(node.here("/dev/nvidia-uvm-tools"))
    assert (os.major(uvm_tools.st_rdev), os.minor(uvm_tools.st_rdev)) == (UVM_MAJOR, 1)
