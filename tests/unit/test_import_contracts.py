"""The import contracts in pyproject.toml (`lint-imports`, run by `tox -e lint`) hold on
this tree, and break when a module imports against them: a copy of the packages with one
wrong import added is refused, naming the contract (the machinery is
tests/unit/import_contracts.py; the wings' and the controller floors' cases are in
test_wing_contracts.py and test_controller_floors.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.import_contracts import assert_breaks, copy_tree, lint_imports


def test_the_tree_keeps_every_contract(tmp_path: Path) -> None:
    result = lint_imports(copy_tree(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "wrong", "contract_id"),
    [
        ("crd/_common.py", "import gpuop.kube.rest", "packages"),
        ("components/_k8s.py", "import aiohttp", "pure-core"),
        ("gpuop/kube/rest.py", "import gpuop.cli", "shell-layers"),
        # paths come from the kinds the REST layer is handed, not from the operand registry
        ("gpuop/kube/rest.py", "import components.registry", "rest-knows-no-kinds"),
        # the operator imports the active policy's view (through the cluster pass): back
        # again is a circle
        (
            "gpuop/operator/controller/views/active_policy.py",
            "import gpuop.operator.controller.wiring.operator",
            "acyclic",
        ),
        # the DRA simulator belongs to the local cluster, never to the operator
        (
            "gpuop/operator/controller/writers/apply.py",
            "import gpuop.devcluster._dra",
            "programs-without-devcluster",
        ),
        # the node agent runs in the image, which has no NVML fake
        (
            "gpuop/nodeagent/validate.py",
            "import gpuop.devcluster.nvml_fake",
            "programs-without-devcluster",
        ),
    ],
)
def test_a_wrong_import_breaks_its_contract(
    tmp_path: Path, module: str, wrong: str, contract_id: str
) -> None:
    assert_breaks(copy_tree(tmp_path), module, wrong, contract_id)
