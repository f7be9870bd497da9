"""One wing per program (issue 45): gpuop.operator, gpuop.nodeagent (with its NVML),
gpuop.devcluster (the local development cluster, with the NVML fake) and gpuop.kube (the
Kubernetes client the others share), beside the CLI's own modules at the top. The import
contracts in pyproject.toml keep the wings apart; each breaks on a wrong import, and every
module of gpuop belongs to a wing the contracts name."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.import_contracts import ROOT, assert_breaks, contract, copy_tree

#: The programs' wings and the shared client.
WINGS = {"kube", "operator", "nodeagent", "devcluster"}
#: The CLI's own modules: they import the development wing lazily, where the install has it.
CLI = {"__main__", "cli", "cli_errors", "_local", "admin_cli", "upgrades_cli"}
#: Leaves every program uses, which import no wing.
SHARED = {"log", "progress"}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return copy_tree(tmp_path)


@pytest.mark.parametrize(
    ("module", "wrong", "contract_id"),
    [
        # the operator and the node agent are separate programs
        ("gpuop/operator/app.py", "import gpuop.nodeagent.status", "programs-independent"),
        ("gpuop/nodeagent/cli.py", "import gpuop.operator.metrics", "programs-independent"),
        # the image has no development wing
        ("gpuop/operator/server.py", "import gpuop.devcluster", "programs-without-devcluster"),
        (
            "gpuop/nodeagent/validate.py",
            "import gpuop.devcluster.nvml_fake",
            "programs-without-devcluster",
        ),
        ("gpuop/log.py", "import gpuop.devcluster", "programs-without-devcluster"),
        # the shared client is below every program
        ("gpuop/kube/rest.py", "import gpuop.operator.metrics", "kube-client-knows-no-program"),
        ("gpuop/kube/backoff.py", "import gpuop.nodeagent.timing", "kube-client-knows-no-program"),
        ("gpuop/kube/informer.py", "import gpuop.devcluster", "kube-client-knows-no-program"),
        ("gpuop/kube/kinds.py", "import gpuop.cli", "kube-client-knows-no-program"),
    ],
)
def test_a_wrong_import_breaks_its_wing_contract(
    tree: Path, module: str, wrong: str, contract_id: str
) -> None:
    assert_breaks(tree, module, wrong, contract_id)


def _children() -> set[str]:
    """The modules and packages directly inside gpuop."""
    return {
        p.stem if p.is_file() else p.name
        for p in (ROOT / "gpuop").iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()
    }


def test_every_module_of_gpuop_is_in_a_wing_or_the_cli() -> None:
    """A new top-level module is a decision: put it in a wing, or list it here."""
    assert _children() == WINGS | CLI | SHARED


def test_everything_but_the_cli_is_kept_from_the_development_wing() -> None:
    kept = set(contract("programs-without-devcluster")["source_modules"])
    assert kept == {f"gpuop.{name}" for name in (WINGS - {"devcluster"}) | SHARED}
    assert contract("programs-without-devcluster")["forbidden_modules"] == ["gpuop.devcluster"]


def test_the_client_is_kept_from_every_program() -> None:
    forbidden = set(contract("kube-client-knows-no-program")["forbidden_modules"])
    assert forbidden == {f"gpuop.{name}" for name in (WINGS - {"kube"}) | CLI}
