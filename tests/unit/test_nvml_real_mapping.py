"""The real binding's error mapping and library lookup, which need no GPU."""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest

from gpuop.nodeagent.nvml import (
    DriverNotLoaded,
    GpuLost,
    LibraryNotFound,
    NotSupported,
    NvmlError,
    Unknown,
)
from gpuop.nodeagent.nvml.real import PynvmlNvml, library_candidates, load_library, translate_error
from gpuop.nodeagent.nvml.types import CudaVersion


@pytest.mark.parametrize(
    ("code", "ours"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, LibraryNotFound),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, DriverNotLoaded),
        (pynvml.NVML_ERROR_GPU_IS_LOST, GpuLost),
        (pynvml.NVML_ERROR_RESET_REQUIRED, GpuLost),
        (pynvml.NVML_ERROR_NOT_SUPPORTED, NotSupported),
        (pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, NotSupported),
        (pynvml.NVML_ERROR_NO_PERMISSION, Unknown),
        (pynvml.NVML_ERROR_UNKNOWN, Unknown),
    ],
)
def test_translate_error(code: int, ours: type[NvmlError]) -> None:
    theirs = pynvml.NVMLError(code)
    assert type(theirs) is not pynvml.NVMLError  # pynvml picked its subclass
    mapped = translate_error(theirs)
    assert type(mapped) is ours
    assert mapped.code == code


def test_library_candidates_are_under_the_root() -> None:
    paths = library_candidates(Path("/run/nvidia/driver"))
    assert Path("/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1") in paths
    assert all(str(p).startswith("/run/nvidia/driver/") for p in paths)


@pytest.fixture
def no_library(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pretend no NVML library is loaded yet (a GPU test may have loaded one)."""
    monkeypatch.setattr(pynvml, "nvmlLib", None)


@pytest.mark.usefixtures("no_library")
def test_missing_library_under_root(tmp_path: Path) -> None:
    with pytest.raises(LibraryNotFound, match="not found under"):
        PynvmlNvml(tmp_path).init()


@pytest.mark.usefixtures("no_library")
def test_broken_library_under_root(tmp_path: Path) -> None:
    lib = tmp_path / "usr/lib64/libnvidia-ml.so.1"
    lib.parent.mkdir(parents=True)
    lib.write_text("not an ELF file")
    with pytest.raises(LibraryNotFound, match="usr/lib64"):
        load_library(tmp_path)
    assert pynvml.nvmlLib is None


def test_cuda_version_from_nvml() -> None:
    assert CudaVersion.from_nvml(12040) == CudaVersion(12, 4)
    assert str(CudaVersion.from_nvml(13000)) == "13.0"
