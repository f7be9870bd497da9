"""The sandbox validator's checks (`gpuop node-agent validate-sandbox`) over a scratch
sysfs tree: which node workload they apply to, what they wait for, and which status
file each writes (the names the sandbox device plugins' init containers wait on)."""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

import pytest

from components import sandbox_validator
from gpuop.nodeagent.cli import add_subcommands
from gpuop.nodeagent.sandbox import (
    COMPONENTS,
    SandboxPaths,
    attempt,
    node_workload,
    validate_sandbox,
)

WORKLOAD = "nvidia.com/gpu.workload.config"


def gpu(sysfs: Path, address: str, driver: str | None, *, klass: str = "0x030200") -> Path:
    device = sysfs / "bus" / "pci" / "devices" / address
    device.mkdir(parents=True)
    (device / "vendor").write_text("0x10de\n")
    (device / "class").write_text(f"{klass}\n")
    if driver:
        target = sysfs / "bus" / "pci" / "drivers" / driver
        target.mkdir(parents=True, exist_ok=True)
        os.symlink(target, device / "driver")
    return device


def paths(tmp_path: Path) -> SandboxPaths:
    return SandboxPaths(
        validations=tmp_path / "validations",
        sysfs=tmp_path / "sys",
        host_root=tmp_path / "host",
        driver_root=tmp_path / "driver",
    )


def files(p: SandboxPaths) -> dict[str, str]:
    if not p.validations.is_dir():
        return {}
    return {f.name: f.read_text() for f in p.validations.iterdir() if not f.name.startswith(".")}


def test_the_validator_runs_every_check_the_agent_knows() -> None:
    assert sandbox_validator.CHECKS == COMPONENTS


@pytest.mark.parametrize(
    ("labels", "default", "expected"),
    [
        ({WORKLOAD: "vm-passthrough"}, "container", "vm-passthrough"),
        ({}, "vm-vgpu", "vm-vgpu"),
        ({WORKLOAD: "bogus"}, "vm-vgpu", "vm-vgpu"),
        ({}, "", "container"),
    ],
)
def test_node_workload(labels: dict[str, str], default: str, expected: str) -> None:
    assert node_workload(labels, default) == expected


def test_vfio_pci_waits_until_every_gpu_is_bound_to_vfio(tmp_path: Path) -> None:
    p = paths(tmp_path)
    gpu(p.sysfs, "0000:01:00.0", "vfio-pci")
    second = gpu(p.sysfs, "0000:02:00.0", "nvidia")
    audio = gpu(p.sysfs, "0000:02:00.1", "snd_hda_intel", klass="0x040300")
    labels = {WORKLOAD: "vm-passthrough"}
    outcome = attempt("vfio-pci", labels, "container", p)
    assert not outcome.passed
    assert "0000:02:00.0" in outcome.reason
    assert files(p) == {"workload-type": "vm-passthrough\n"}
    os.unlink(second / "driver")
    os.symlink(p.sysfs / "bus" / "pci" / "drivers" / "vfio-pci", second / "driver")
    assert audio.is_dir()  # not a GPU: its driver does not matter
    assert attempt("vfio-pci", labels, "container", p).passed


@pytest.mark.parametrize("component", ["vfio-pci", "vgpu-manager", "vgpu-devices"])
def test_a_check_for_another_workload_passes_without_a_status_file(
    tmp_path: Path, component: str
) -> None:
    p = paths(tmp_path)
    gpu(p.sysfs, "0000:01:00.0", "nvidia")
    assert asyncio.run(validate_sandbox(component, _labels({}), "container", p, wait=False))
    assert files(p) == {"workload-type": "container\n"}


def test_vgpu_manager_needs_the_driver_and_its_parent_devices(tmp_path: Path) -> None:
    p = paths(tmp_path)
    device = gpu(p.sysfs, "0000:01:00.0", "nvidia")
    labels = {WORKLOAD: "vm-vgpu"}
    commands: list[list[str]] = []

    def answers(command: list[str]) -> bool:
        commands.append(command)
        return True

    assert not attempt("vgpu-manager", labels, "container", p, answers).passed
    assert commands[-1] == ["chroot", str(p.driver_root), "nvidia-smi"]
    (device / "sriov_totalvfs").write_text("16\n")
    (device / "sriov_numvfs").write_text("8\n")
    assert not attempt("vgpu-manager", labels, "container", p, answers).passed
    (device / "sriov_numvfs").write_text("16\n")
    ours = attempt("vgpu-manager", labels, "container", p, answers)
    assert ours.passed
    assert ours.ready_file == "vgpu-manager-ready"
    assert not attempt("vgpu-manager", labels, "container", p, lambda _: False).passed
    # A vGPU manager installed on the host: its own nvidia-smi, its own status file.
    (p.host_root / "usr" / "bin").mkdir(parents=True)
    (p.host_root / "usr" / "bin" / "nvidia-smi").write_text("")
    host = attempt("vgpu-manager", labels, "container", p, answers)
    assert host.ready_file == "host-vgpu-manager-ready"
    assert commands[-1] == ["chroot", str(p.host_root), "/usr/bin/nvidia-smi"]


def test_host_vgpu_manager_behind_an_absolute_host_symlink(tmp_path: Path) -> None:
    """Issue 43, item 7: the host's nvidia-smi links to an absolute host path; it is
    followed under the host root, not in this container."""
    p = paths(tmp_path)
    gpu(p.sysfs, "0000:01:00.0", "nvidia")
    (p.sysfs / "class" / "mdev_bus" / "0000:01:00.0").mkdir(parents=True)
    real = p.host_root / "opt" / "vgpu" / "bin" / "nvidia-smi"
    real.parent.mkdir(parents=True)
    real.write_text("#!/bin/sh\n")
    (p.host_root / "usr" / "bin").mkdir(parents=True)
    (p.host_root / "usr" / "bin" / "nvidia-smi").symlink_to("/opt/vgpu/bin/nvidia-smi")
    commands: list[list[str]] = []

    def answers(command: list[str]) -> bool:
        commands.append(command)
        return True

    host = attempt("vgpu-manager", {WORKLOAD: "vm-vgpu"}, "", p, answers)
    assert host.ready_file == "host-vgpu-manager-ready"
    assert commands[-1] == ["chroot", str(p.host_root), "/usr/bin/nvidia-smi"]


def test_vgpu_manager_accepts_mdev_parents_without_sriov(tmp_path: Path) -> None:
    p = paths(tmp_path)
    gpu(p.sysfs, "0000:01:00.0", "nvidia")
    (p.sysfs / "class" / "mdev_bus" / "0000:01:00.0").mkdir(parents=True)
    assert attempt("vgpu-manager", {WORKLOAD: "vm-vgpu"}, "", p, lambda _: True).passed


def test_vgpu_devices_waits_for_a_vgpu(tmp_path: Path) -> None:
    p = paths(tmp_path)
    assert not attempt("vgpu-devices", {}, "vm-vgpu", p).passed
    (p.sysfs / "bus" / "mdev" / "devices" / "c0b7a2f4").mkdir(parents=True)
    assert attempt("vgpu-devices", {}, "vm-vgpu", p).passed


def test_cc_manager_waits_on_cc_capable_nodes_only(tmp_path: Path) -> None:
    p = paths(tmp_path)
    assert attempt("cc-manager", {}, "container", p).passed
    capable = {"nvidia.com/cc.capable": "true"}
    assert not attempt("cc-manager", capable, "container", p).passed
    p.validations.mkdir(parents=True, exist_ok=True)
    (p.validations / ".cc-manager-ctr-ready").write_text("")
    assert attempt("cc-manager", capable, "container", p).passed


def _labels(labels: Mapping[str, str]) -> Callable[[], Awaitable[Mapping[str, str]]]:
    async def read() -> Mapping[str, str]:
        return labels

    return read


def test_waiting_writes_the_status_file_only_once_passed(tmp_path: Path) -> None:
    """A stale file from an earlier run goes first: nothing may start on it."""
    p = paths(tmp_path)
    device = gpu(p.sysfs, "0000:01:00.0", "nvidia")
    p.validations.mkdir(parents=True)
    (p.validations / "vfio-pci-ready").write_text("")
    labels = {WORKLOAD: "vm-passthrough"}

    async def scenario() -> bool:
        task = asyncio.create_task(
            validate_sandbox("vfio-pci", _labels(labels), "", p, wait=True, retry_s=0.001)
        )
        await asyncio.sleep(0.01)
        assert "vfio-pci-ready" not in files(p)
        vfio = p.sysfs / "bus" / "pci" / "drivers" / "vfio-pci"
        vfio.mkdir(parents=True)
        os.unlink(device / "driver")
        os.symlink(vfio, device / "driver")
        return await asyncio.wait_for(task, 5)

    assert asyncio.run(scenario())
    assert files(p) == {"workload-type": "vm-passthrough\n", "vfio-pci-ready": ""}


def test_cli_reads_upstreams_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rendered init containers set COMPONENT, WITH_WAIT and the default workload
    in the environment (upstream's names); the command line needs nothing else."""
    for name, value in {
        "COMPONENT": "vgpu-devices",
        "WITH_WAIT": "true",
        "DEFAULT_GPU_WORKLOAD_CONFIG": "vm-vgpu",
        "NODE_NAME": "gpu-node-0001",
    }.items():
        monkeypatch.setenv(name, value)
    parser = argparse.ArgumentParser()
    add_subcommands(parser.add_subparsers())
    args = parser.parse_args(sandbox_validator.COMMAND[1:])
    assert (args.component, args.wait, args.default_workload, args.node_name) == (
        "vgpu-devices",
        True,
        "vm-vgpu",
        "gpu-node-0001",
    )
