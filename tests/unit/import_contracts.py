"""Show an import contract breaking: copy the packages and pyproject.toml into a temporary
tree, add one wrong import to one module there, run `lint-imports` on the copy and read
which contracts it reports broken, by their ids in pyproject.toml.

A test of a new contract adds its (module, wrong import, contract id) to a parametrized
list and calls :func:`assert_breaks` (tests/unit/test_wing_contracts.py does so).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gpuop", "statemachine", "components", "crd")


def copy_tree(dest: Path) -> Path:
    """A copy of our packages and the contracts under `dest`, to add a wrong import to."""
    for name in PACKAGES:
        shutil.copytree(ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    return dest


def lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` run on `tree`, uncached, importing nothing from elsewhere."""
    script = "import sys; from importlinter.cli import lint_imports_command; lint_imports_command()"
    return subprocess.run(
        [sys.executable, "-c", script, "--no-cache"],
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )


def contracts(tree: Path = ROOT) -> list[dict[str, Any]]:
    """The contracts of `tree`'s pyproject.toml, as written there."""
    config = tomllib.loads((tree / "pyproject.toml").read_text())
    found: list[dict[str, Any]] = config["tool"]["importlinter"]["contracts"]
    return found


def contract(contract_id: str, tree: Path = ROOT) -> dict[str, Any]:
    (found,) = (c for c in contracts(tree) if c["id"] == contract_id)
    return found


def broken_contracts(tree: Path, result: subprocess.CompletedProcess[str]) -> set[str]:
    """The ids of the contracts `lint-imports` reported broken (it prints names, wrapped)."""
    report = " ".join(result.stdout.split())
    return {c["id"] for c in contracts(tree) if f"{' '.join(c['name'].split())} BROKEN" in report}


def add_import(tree: Path, module: str, wrong: str) -> None:
    """Append the import statement `wrong` to the file `module` (a path under the tree)."""
    path = tree / module
    assert path.is_file(), f"{module} is not in the tree: move the case with the module"
    path.write_text(path.read_text() + f"\n{wrong}  # noqa: E402\n")


def assert_breaks(tree: Path, module: str, wrong: str, contract_id: str) -> None:
    """With `wrong` added to `module`, `lint-imports` fails and names `contract_id`."""
    contract(contract_id, tree)  # the id is one of ours
    add_import(tree, module, wrong)
    result = lint_imports(tree)
    assert result.returncode != 0, result.stdout + result.stderr
    assert contract_id in broken_contracts(tree, result), result.stdout + result.stderr
