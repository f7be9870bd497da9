"""The toolkit check runs ``nvidia-smi`` as upstream's toolkit-validation does, and looks
for the toolkit's files only when no ``nvidia-smi`` can be run; ``toolkit-ready`` says
which check passed. A fake ``nvidia-smi`` script stands in for the one the runtime
injects."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuop.nodeagent import toolkit
from gpuop.nodeagent.status import StatusFiles
from gpuop.nodeagent.toolkit import ToolkitCheck
from gpuop.nodeagent.validate import Validator

SMI_OK = """#!/bin/sh
echo "+------------------------------------------------------------------------------+"
echo "| NVIDIA-SMI 580.65.06        Driver Version: 580.65.06      CUDA Version: 13.0 |"
echo "+------------------------------------------------------------------------------+"
"""
SMI_MISMATCH = """#!/bin/sh
echo "Failed to initialize NVML: Driver/library version mismatch" >&2
exit 18
"""


def fake_smi(directory: Path, script: str, mode: int = 0o755) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    smi = directory / "nvidia-smi"
    smi.write_text(script)
    smi.chmod(mode)
    return smi


def install_files(host: Path) -> None:
    """A host package: runtime in /usr/bin, config in /etc."""
    binary = host / "usr/bin/nvidia-container-runtime"
    binary.parent.mkdir(parents=True, exist_ok=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    config = host / "etc/nvidia-container-runtime/config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text("[nvidia-container-cli]\n")


@pytest.fixture
def path_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory that is this process's whole PATH; nothing is injected elsewhere."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setattr(toolkit, "INJECTED_DIRS", ())
    return bin_dir


async def test_nvidia_smi_on_path_passes(tmp_path: Path, path_dir: Path) -> None:
    smi = fake_smi(path_dir, SMI_OK)
    result = await ToolkitCheck(tmp_path / "host").run()  # no toolkit files on the host
    assert result.ok, result.reason
    assert dict(result.fields) == {"TOOLKIT_CHECK": "nvidia-smi"}
    assert result.facts == {"NVIDIA_SMI": str(smi), "DRIVER_VERSION": "580.65.06"}


async def test_nvidia_smi_failing_fails_without_falling_back(
    tmp_path: Path, path_dir: Path
) -> None:
    """nvidia-smi is there but fails: the runtime injected a broken driver. The files
    being there does not make the toolkit work."""
    fake_smi(path_dir, SMI_MISMATCH)
    install_files(tmp_path / "host")
    result = await ToolkitCheck(tmp_path / "host").run()
    assert not result.ok
    assert "exited with status 18" in result.reason
    assert "Driver/library version mismatch" in result.reason


async def test_nvidia_smi_missing_falls_back_to_files(tmp_path: Path, path_dir: Path) -> None:
    install_files(tmp_path / "host")
    result = await ToolkitCheck(tmp_path / "host").run()
    assert result.ok, result.reason
    assert dict(result.fields) == {"TOOLKIT_CHECK": "files"}
    assert result.facts["RUNTIME"] == "/usr/bin/nvidia-container-runtime"


async def test_nvidia_smi_missing_and_no_files_fails(tmp_path: Path, path_dir: Path) -> None:
    result = await ToolkitCheck(tmp_path / "host").run()
    assert not result.ok
    assert result.reason.startswith("no nvidia-smi to run here;")
    assert "nvidia-container-runtime not found" in result.reason


@pytest.mark.parametrize(
    ("script", "mode"),
    [
        pytest.param(SMI_OK, 0o644, id="not-executable"),
        pytest.param("\x7fELF garbage\n", 0o755, id="cannot-exec"),
    ],
)
async def test_nvidia_smi_that_cannot_run_falls_back_to_files(
    tmp_path: Path, path_dir: Path, script: str, mode: int
) -> None:
    fake_smi(path_dir, script, mode)
    install_files(tmp_path / "host")
    result = await ToolkitCheck(tmp_path / "host").run()
    assert result.ok, result.reason
    assert dict(result.fields) == {"TOOLKIT_CHECK": "files"}


async def test_nvidia_smi_hanging_times_out(tmp_path: Path, path_dir: Path) -> None:
    fake_smi(path_dir, "#!/bin/sh\nwhile :; do :; done\n")  # only builtins on PATH
    result = await ToolkitCheck(tmp_path / "host", timeout_s=0.3).run()
    assert not result.ok
    assert "did not finish within 0.3s" in result.reason


async def test_nvidia_smi_at_the_injected_path_under_fs_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not on PATH but where the runtime injects it; looked up under this container's /."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    root = tmp_path / "root"
    smi = fake_smi(root / "usr/bin", SMI_OK)
    result = await ToolkitCheck(tmp_path / "host", fs_root=root).run()
    assert result.ok, result.reason
    assert result.facts["NVIDIA_SMI"] == str(smi)


def test_search_order_is_path_then_injected_dirs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", os.pathsep.join(["/opt/bin", "", "/usr/bin", "/bin"]))
    assert toolkit.smi_dirs() == ("/opt/bin", "/usr/bin", "/bin")
    monkeypatch.setenv("PATH", "relative/bin")
    assert toolkit.find_nvidia_smi(["relative/bin"]) is None


async def test_status_file_names_the_check_that_ran(tmp_path: Path, path_dir: Path) -> None:
    files = StatusFiles(tmp_path / "validations")
    install_files(tmp_path / "host")
    validator = Validator([ToolkitCheck(tmp_path / "host")], files)

    assert await validator.run_once()
    assert files.path("toolkit").read_text() == "TOOLKIT_CHECK=files\n"

    smi = fake_smi(path_dir, SMI_OK)
    assert await validator.run_once()
    assert files.path("toolkit").read_text() == "TOOLKIT_CHECK=nvidia-smi\n"

    smi.write_text(SMI_MISMATCH)
    assert not await validator.run_once()
    assert not files.is_ready("toolkit")
