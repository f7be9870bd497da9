"""`gpuop doctor` as a user runs it, without a cluster: a bundle read from an archive or
a directory, its exit status (0 clean, 1 a finding), and one error line (exit 2) for a
cluster or bundle it cannot read."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from gpuop.admin_cli.doctor import read_bundle

POLICY = {"metadata": {"name": "cluster-policy"}, "spec": {}, "status": {"state": "notReady"}}
NODES = [{"name": "cpu-node-0000", "labels": {}}]


def _gpuop(home: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "GPUOP_CLUSTER_DIR")
    }
    env["HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-m", "gpuop", "doctor", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _bundle(root: Path, nodes: list[dict[str, Any]]) -> Path:
    """A bundle directory as `gpuop support-bundle` writes it, under one top directory."""
    top = root / "gpuop-support-x"
    (top / "cluster").mkdir(parents=True)
    (top / "manifest.json").write_text(json.dumps({"namespace": "gpu-operator"}))
    (top / "cluster" / "clusterpolicies.json").write_text(json.dumps([POLICY]))
    (top / "nodes.json").write_text(json.dumps(nodes))
    return top


def test_a_finding_exits_1_with_its_line(tmp_path: Path) -> None:
    _bundle(tmp_path, NODES)
    result = _gpuop(tmp_path, "--bundle", str(tmp_path))
    assert result.returncode == 1, result.stderr
    (line,) = result.stdout.splitlines()
    assert line.startswith("nfd-labels-missing: ")
    assert "[clusterpolicy/cluster-policy]; fix: " in line


def test_a_clean_archive_exits_0(tmp_path: Path) -> None:
    labelled = [
        {"name": "gpu-1", "labels": {"feature.node.kubernetes.io/pci-10de.present": "true"}}
    ]
    top = _bundle(tmp_path / "src", labelled)
    archive = tmp_path / "bundle.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(top, arcname=top.name)
    assert set(read_bundle(archive)) == {
        "manifest.json",
        "cluster/clusterpolicies.json",
        "nodes.json",
    }
    result = _gpuop(tmp_path, "--bundle", str(archive))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "doctor: no known problem found\n"


@pytest.mark.parametrize("what", ["missing", "no-manifest", "not-an-archive", "no-cluster"])
def test_what_cannot_be_read_is_one_error_line(tmp_path: Path, what: str) -> None:
    argv = ["--bundle", str(tmp_path / "nope")]
    if what == "no-manifest":
        (tmp_path / "empty").mkdir()
        argv = ["--bundle", str(tmp_path / "empty")]
    elif what == "not-an-archive":
        (tmp_path / "b.tar.gz").write_bytes(io.BytesIO(b"plain text").getvalue())
        argv = ["--bundle", str(tmp_path / "b.tar.gz")]
    elif what == "no-cluster":
        argv = []
    result = _gpuop(tmp_path, *argv)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("gpuop: error: ")
    assert ("no cluster" if what == "no-cluster" else "--bundle") in lines[0]
