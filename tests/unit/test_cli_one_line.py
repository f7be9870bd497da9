"""Every CLI error is one `gpuop: error: ...` line and exit status 2, as a user sees it.

Run as real processes with HOME an empty directory and no KUBECONFIG, so neither a
kubeconfig nor a local cluster is found: the commands that need a cluster must say so
in one line, not end in a Python traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from gpuop.cli_errors import describe


def _gpuop(home: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "GPUOP_CLUSTER_DIR")
    }
    env["HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-m", "gpuop", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("gpuop: error: "), result.stderr
    return lines[0]


@pytest.mark.parametrize("command", [["upgrade", "status"], ["upgrade", "plan"]])
def test_no_cluster_to_read_is_one_line(tmp_path: Path, command: list[str]) -> None:
    line = _one_error_line(_gpuop(tmp_path, *command))
    assert "no cluster" in line
    assert "--kubeconfig" in line


def test_a_bad_set_value_is_one_line_naming_it(tmp_path: Path) -> None:
    line = _one_error_line(_gpuop(tmp_path, "upgrade", "plan", "--set", "driver.version=["))
    assert "--set driver.version" in line


def test_a_missing_kubeconfig_file_is_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    line = _one_error_line(_gpuop(tmp_path, "upgrade", "status", "--kubeconfig", str(missing)))
    assert str(missing) in line


def test_an_unreachable_api_server_is_one_line(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
    )
    line = _one_error_line(_gpuop(tmp_path, "upgrade", "plan", "--kubeconfig", str(kubeconfig)))
    assert "127.0.0.1:1" in line


def test_a_usage_error_is_one_line(tmp_path: Path) -> None:
    line = _one_error_line(_gpuop(tmp_path, "upgrade", "status", "--output", "yaml"))
    assert "--output" in line


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--workload", "gpu-node-0001=vmx"], "gpu-node-0001=vmx: expected NODE=WORKLOAD"),
        (["--workload", "gpu-node-0007=vm-vgpu"], "gpu-node-0007=vm-vgpu: not a GPU node"),
    ],
)
def test_a_bad_workload_is_one_line_naming_it(tmp_path: Path, argv: list[str], words: str) -> None:
    line = _one_error_line(_gpuop(tmp_path, "cluster", "up", "--dir", str(tmp_path / "c"), *argv))
    assert words in line
    assert not (tmp_path / "c").exists()  # refused before anything was started


def test_an_api_refusal_is_named_by_status_and_message() -> None:
    err = ApiException(status=403, reason="Forbidden")
    err.body = b'{"kind":"Status","message":"nodes is forbidden:\\n user \\"x\\" cannot list"}'
    assert (
        describe(err)
        == 'the API server answered 403 Forbidden: nodes is forbidden: user "x" cannot list'
    )
