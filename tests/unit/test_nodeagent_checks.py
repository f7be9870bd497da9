"""The driver and toolkit checks over the NVML fake and a fake host tree."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from gpuop.devcluster.nvml_fake import A100_SXM4_80GB, H100_80GB_HBM3, TESLA_T4, FakeNvml, make_gpus
from gpuop.nodeagent.driver import DriverCheck, DriverLayout
from gpuop.nodeagent.nvml import Unknown
from gpuop.nodeagent.toolkit import ToolkitCheck, find_toolkit


def layout(tmp_path: Path) -> DriverLayout:
    """No driver on the host (an empty tree): the driver container's install dir."""
    return DriverLayout(
        host_root_here=tmp_path / "host",
        driver_root_here=tmp_path / "driver",
        validations_here=tmp_path / "validations",
    )


def check(nvml: FakeNvml, tmp_path: Path) -> DriverCheck:
    return DriverCheck(lambda _root: nvml, layout(tmp_path))


async def test_driver_passes_with_upstreams_keys(tmp_path: Path) -> None:
    nvml = FakeNvml(make_gpus(A100_SXM4_80GB, H100_80GB_HBM3, TESLA_T4))
    result = await check(nvml, tmp_path).run()
    assert result.ok, result.reason
    assert result.fields == {
        "IS_HOST_DRIVER": "false",
        "NVIDIA_DRIVER_ROOT": "/run/nvidia/driver",
        "DRIVER_ROOT_CTR_PATH": "/driver-root",
        "NVIDIA_DEV_ROOT": "/",
        "DEV_ROOT_CTR_PATH": "/host",
    }
    assert threading.get_ident() not in nvml.threads  # NVML ran off the event loop
    assert not nvml.initialized


async def test_driver_on_the_host_wins(tmp_path: Path) -> None:
    smi = tmp_path / "host/usr/bin/nvidia-smi"
    smi.parent.mkdir(parents=True)
    smi.write_text("#!/bin/sh\n")
    smi.chmod(0o755)
    roots: list[Path] = []

    def nvml_for(root: Path) -> FakeNvml:
        roots.append(root)
        return FakeNvml(make_gpus(TESLA_T4))

    result = await DriverCheck(nvml_for, layout(tmp_path)).run()
    assert result.fields["IS_HOST_DRIVER"] == "true"
    assert result.fields["NVIDIA_DRIVER_ROOT"] == "/"
    assert roots == [tmp_path / "host"]


@pytest.mark.parametrize(
    ("nvml", "reason"),
    [
        (FakeNvml.library_not_found(), "NVML library not found"),
        (FakeNvml.driver_not_loaded(), "NVIDIA driver not loaded"),
        (FakeNvml(init_error=Unknown("Insufficient Permissions", 4)), "Insufficient Permissions"),
        (FakeNvml(), "sees no GPU"),
    ],
)
async def test_driver_failures(nvml: FakeNvml, reason: str, tmp_path: Path) -> None:
    result = await check(nvml, tmp_path).run()
    assert not result.ok
    assert reason in result.reason
    assert "\n" not in result.reason


async def test_driver_gpu_lost(tmp_path: Path) -> None:
    nvml = FakeNvml(make_gpus(A100_SXM4_80GB, A100_SXM4_80GB))
    nvml.lose_gpu(1)
    result = await check(nvml, tmp_path).run()
    assert not result.ok
    assert result.reason.startswith("GPU lost")


def _install(
    host: Path, runtime_dir: str, config: str, toml: str = "[nvidia-container-cli]\n"
) -> None:
    binary = host / runtime_dir.lstrip("/") / "nvidia-container-runtime"
    binary.parent.mkdir(parents=True, exist_ok=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    cfg = host / config.lstrip("/")
    cfg.parent.mkdir(parents=True, exist_ok=True)
    cfg.write_text(toml)


async def test_toolkit_container_install(tmp_path: Path) -> None:
    _install(
        tmp_path,
        "/usr/local/nvidia/toolkit",
        "/usr/local/nvidia/toolkit/.config/nvidia-container-runtime/config.toml",
    )
    result = await ToolkitCheck(tmp_path, nvidia_smi_dirs=()).run()  # no nvidia-smi: files
    assert result.ok, result.reason
    assert result.facts["RUNTIME"] == "/usr/local/nvidia/toolkit/nvidia-container-runtime"


def test_toolkit_host_package(tmp_path: Path) -> None:
    _install(tmp_path, "/usr/bin", "/etc/nvidia-container-runtime/config.toml")
    result = find_toolkit(tmp_path)
    assert result.ok, result.reason
    assert result.facts == {
        "RUNTIME": "/usr/bin/nvidia-container-runtime",
        "RUNTIME_CONFIG": "/etc/nvidia-container-runtime/config.toml",
    }


def test_toolkit_missing_binary(tmp_path: Path) -> None:
    result = find_toolkit(tmp_path)
    assert not result.ok
    assert "nvidia-container-runtime not found" in result.reason


def test_toolkit_not_executable(tmp_path: Path) -> None:
    _install(tmp_path, "/usr/bin", "/etc/nvidia-container-runtime/config.toml")
    (tmp_path / "usr/bin/nvidia-container-runtime").chmod(0o644)
    result = find_toolkit(tmp_path)
    assert not result.ok
    assert "not executable" in result.reason


def test_toolkit_missing_config(tmp_path: Path) -> None:
    _install(tmp_path, "/usr/bin", "/etc/other.toml")
    result = find_toolkit(tmp_path)
    assert not result.ok
    assert "runtime config not found" in result.reason


def test_toolkit_bad_config(tmp_path: Path) -> None:
    _install(tmp_path, "/usr/bin", "/etc/nvidia-container-runtime/config.toml", "= broken")
    result = find_toolkit(tmp_path)
    assert not result.ok
    assert "not valid TOML" in result.reason


def test_toolkit_custom_paths(tmp_path: Path) -> None:
    _install(tmp_path, "/opt/nct/bin", "/opt/nct/config.toml")
    result = find_toolkit(tmp_path, ["/opt/nct/bin"], ["/opt/nct/config.toml"])
    assert result.ok, result.reason


def test_toolkit_unreadable_host_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Host paths are looked at component by component (links followed under the host
    # root): the first look inside the mount is refused, as a mode-000 root would be.
    real_lstat = Path.lstat

    def lstat(self: Path) -> os.stat_result:
        if str(self).startswith(f"{tmp_path}/"):
            raise PermissionError(13, "Permission denied", str(self))
        return real_lstat(self)

    monkeypatch.setattr(Path, "lstat", lstat)
    result = find_toolkit(tmp_path)
    assert not result.ok
    assert result.reason.startswith("cannot read")
    assert "Permission denied" in result.reason


def test_toolkit_behind_absolute_host_symlinks_is_found_through_the_host_root(
    tmp_path: Path,
) -> None:
    """Issue 43, item 7: a host package links its binary and config into /usr/bin and
    /etc with absolute targets. Those targets are the host's: followed inside this
    container they miss (or hit the container's own files); the check must follow them
    under the host root, as the driver check does."""
    _install(tmp_path, "/opt/nvidia/toolkit", "/opt/nvidia/toolkit/etc/config.toml")
    (tmp_path / "usr/bin").mkdir(parents=True)
    (tmp_path / "usr/bin/nvidia-container-runtime").symlink_to(
        "/opt/nvidia/toolkit/nvidia-container-runtime"
    )
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/nvidia-container-runtime").symlink_to("/opt/nvidia/toolkit/etc")
    (tmp_path / "opt/nvidia/toolkit/etc/config.toml").rename(
        tmp_path / "opt/nvidia/toolkit/etc/real.toml"
    )
    (tmp_path / "opt/nvidia/toolkit/etc/config.toml").symlink_to("real.toml")
    assert not Path("/opt/nvidia/toolkit/nvidia-container-runtime").exists()  # only via root
    result = find_toolkit(tmp_path)
    assert result.ok, result.reason
    assert result.facts == {
        "RUNTIME": "/usr/bin/nvidia-container-runtime",
        "RUNTIME_CONFIG": "/etc/nvidia-container-runtime/config.toml",
    }


def test_toolkit_dangling_host_symlink_is_not_found(tmp_path: Path) -> None:
    (tmp_path / "usr/bin").mkdir(parents=True)
    (tmp_path / "usr/bin/nvidia-container-runtime").symlink_to("/opt/gone/nvidia-container-runtime")
    result = find_toolkit(tmp_path)
    assert not result.ok
    assert "nvidia-container-runtime not found" in result.reason
