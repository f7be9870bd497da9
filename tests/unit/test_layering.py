"""The pure packages stay pure: they never import the shell (`gpuop`) or a client, and
depend on each other in one direction only (statemachine -> components -> crd)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHELL = {"gpuop", "kubernetes_asyncio", "kubernetes", "aiohttp", "prometheus_client", "structlog"}
#: What each pure package may import of the others.
ALLOWED = {
    "crd": set(),
    "components": {"crd"},
    "statemachine": {"crd", "components"},
}


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_pure_packages_import_no_shell_and_only_lower_layers(package: str) -> None:
    others = set(ALLOWED) - {package}
    for path in sorted((ROOT / package).rglob("*.py")):
        imported = _imports(path)
        assert not imported & SHELL, f"{path.relative_to(ROOT)} imports {imported & SHELL}"
        wrong = (imported & others) - ALLOWED[package]
        assert not wrong, f"{path.relative_to(ROOT)} imports {wrong}"
