"""User errors end in one clear line and a non-zero exit, never a traceback."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from gpuop.cli import main


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.err


def test_missing_go_is_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GPUOP_CACHE_DIR", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("GPUOP_GO", raising=False)
    code, err = _run(capsys, "cluster", "build")
    assert code == 2
    assert "`go` was not found on PATH" in err
    assert "Traceback" not in err


def test_port_in_use_is_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, err = _run(capsys, "cluster", "up", "--dir", str(tmp_path / "c"), "--port", str(port))
    assert code == 2
    assert f"port {port} on 127.0.0.1 is in use" in err


def test_bad_node_counts_are_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run(
        capsys, "cluster", "up", "--dir", str(tmp_path / "c"), "--nodes", "1", "--gpu-nodes", "2"
    )
    assert code == 2
    assert "--gpu-nodes (2) cannot exceed --nodes (1)" in err


def test_gpu_health_without_a_cluster(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cluster", "gpu-health", "gpu-node-0000", "--dir", str(tmp_path / "none")]) == 1
    assert "no cluster in" in capsys.readouterr().err


def test_status_without_a_cluster(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cluster", "status", "--dir", str(tmp_path / "none")]) == 1
    assert "no cluster in" in capsys.readouterr().out


def test_unknown_version_is_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Asks the Go module proxy for a release that does not exist (one small request)."""
    monkeypatch.setenv("GPUOP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("GPUOP_ETCD_VERSION", "v3.5.999")
    code, err = _run(capsys, "cluster", "build")
    assert code == 2
    assert "does not exist on the Go module proxy" in err
    assert "v3.5.999" in err
