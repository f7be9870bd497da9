"""The operator image installs gpuop without the local cluster and the NVML fake
(.dockerignore): the operator, node agent and CLI still start there, and a command that
needs the local cluster says so in one line (exit 2) instead of a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LEFT_OUT = ("gpuop.devcluster", "gpuop.devcluster.nvml_fake")

#: Runs before the code under test: every module the image leaves out cannot be imported.
BLOCK = f"""
import sys
from importlib.abc import MetaPathFinder

class LeftOut(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == m or name.startswith(m + ".") for m in {LEFT_OUT!r}):
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, LeftOut())
"""


def _run(code: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCK + code, *argv],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"},
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def _gpuop(*argv: str) -> subprocess.CompletedProcess[str]:
    return _run("from gpuop.cli import main; sys.exit(main(sys.argv[1:]))", *argv)


def test_the_operator_and_node_agent_import_without_the_simulator() -> None:
    modules = [
        "gpuop.operator.app",
        "gpuop.operator.controller",
        "gpuop.nodeagent.cli",
        "gpuop.nodeagent.validate",
    ]
    result = _run(
        "import importlib\n" + "".join(f"importlib.import_module({m!r})\n" for m in modules)
    )
    assert result.returncode == 0, result.stderr


def test_cli_commands_run_without_the_simulator() -> None:
    version = _gpuop("version")
    assert version.returncode == 0, version.stderr
    assert version.stdout.startswith("gpuop ")
    assert _gpuop("node-agent", "--help").returncode == 0


def test_a_local_cluster_command_names_its_absence_in_one_line() -> None:
    for argv in (("cluster", "status"), ("cluster", "build"), ("run", "--local")):
        result = _gpuop(*argv)
        assert result.returncode == 2, (argv, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert lines[0].startswith("gpuop: error: the local cluster is not part of this install")


def test_upgrade_status_without_a_kubeconfig_asks_for_one() -> None:
    result = _gpuop("upgrade", "status")
    assert result.returncode == 2, result.stderr
    assert "pass --kubeconfig or set $KUBECONFIG" in result.stderr
