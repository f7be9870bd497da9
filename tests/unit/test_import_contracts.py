"""The import contracts in pyproject.toml (`lint-imports`, run by `tox -e lint`) hold on
this tree, and break when a module imports against them: a copy of the packages with one
wrong import added is refused, naming the contract (tests/unit/import_contracts.py holds
the machinery by contract id; tests/unit/test_wing_contracts.py uses it)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gpuop", "statemachine", "components", "crd")


def _lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    script = "import sys; from importlinter.cli import lint_imports_command; lint_imports_command()"
    return subprocess.run(
        [sys.executable, "-c", script, "--no-cache"],
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of our packages and the contracts, to add a wrong import to."""
    for name in PACKAGES:
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_tree_keeps_every_contract(tree: Path) -> None:
    result = _lint_imports(tree)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "wrong", "contract"),
    [
        ("crd/_common.py", "import gpuop.kube.rest", "packages depend one way"),
        ("components/_k8s.py", "import aiohttp", "the pure core imports no client"),
        ("gpuop/kube/rest.py", "import gpuop.cli", "inside the shell"),
        # paths come from the kinds the REST layer is handed, not from the operand registry
        ("gpuop/kube/rest.py", "import components.registry", "the REST layer knows no kinds"),
        # the operator imports _active (through the cluster pass): back again is a circle
        (
            "gpuop/operator/controller/views/active_policy.py",
            "import gpuop.operator.controller.wiring.operator",
            "no import cycle",
        ),
        # the DRA simulator belongs to the local cluster, never to the operator
        (
            "gpuop/operator/controller/writers/apply.py",
            "import gpuop.devcluster._dra",
            "never import the local",
        ),
        # the node agent runs in the image, which has no NVML fake
        (
            "gpuop/nodeagent/validate.py",
            "import gpuop.devcluster.nvml_fake",
            "never import the local",
        ),
    ],
)
def test_a_wrong_import_breaks_its_contract(
    tree: Path, module: str, wrong: str, contract: str
) -> None:
    path = tree / module
    path.write_text(path.read_text() + f"\n{wrong}  # noqa: E402\n")
    result = _lint_imports(tree)
    assert result.returncode != 0, result.stdout
    broken = result.stdout.split("Broken contracts", 1)[-1]
    assert contract in broken, result.stdout
