"""The import contracts in pyproject.toml (`lint-imports`, run by `tox -e lint`) hold on
this tree, and break when a module imports against them: a copy of the packages with one
wrong import added is refused, naming the contract."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
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
        ("crd/_common.py", "import gpuop.rest", "packages depend one way"),
        ("components/_k8s.py", "import aiohttp", "the pure core imports no client"),
        ("gpuop/rest.py", "import gpuop.cli", "inside the shell"),
        # paths come from the kinds the REST layer is handed, not from the operand registry
        ("gpuop/rest.py", "import components.registry", "the REST layer knows no kinds"),
        # the operator imports _active (through the cluster pass): back again is a circle
        (
            "gpuop/controller/views/active_policy.py",
            "import gpuop.controller.wiring.operator",
            "no import cycle",
        ),
        # the DRA simulator belongs to the local cluster, never to the operator
        (
            "gpuop/controller/writers/apply.py",
            "import gpuop.cluster._dra",
            "never import the local",
        ),
        # the node agent runs in the image, which has no NVML fake
        ("gpuop/nodeagent/validate.py", "import gpuop.nvml.fake", "never import the local"),
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


#: The CLI's own modules: they import the local cluster lazily, where the install has it.
CLI_MODULES = {
    "gpuop.cli",
    "gpuop.cli_errors",
    "gpuop._local",
    "gpuop.upgrades_cli",
    "gpuop.admin_cli",
    "gpuop.__main__",
}


def test_every_product_module_is_kept_from_the_simulator() -> None:
    """A new module of gpuop falls under the contract unless it is the CLI's."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = (c for c in config["contracts"] if c["id"] == "operator-without-simulator")
    forbidden = set(contract["forbidden_modules"])
    modules = set()
    for path in (ROOT / "gpuop").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        modules.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    covered = {
        m
        for m in modules
        if any(m == s or m.startswith(s + ".") for s in (*contract["source_modules"], *CLI_MODULES))
        or any(m == f or m.startswith(f + ".") for f in forbidden)
    }
    assert modules - covered <= {"gpuop", "gpuop.nvml"}, sorted(modules - covered - {"gpuop"})
