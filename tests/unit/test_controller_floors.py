"""The controller's floors (wiring -> passes -> writers -> read-only views -> base), the
passes' independence, the views' read-only rule and the controller's public surface are
import contracts: each breaks on one deliberately wrong import."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.import_contracts import assert_breaks, copy_tree

CTL = "gpuop/operator/controller"
CASES = [
    # a read-only view reaching up into a writer
    (
        f"{CTL}/views/routes.py",
        "import gpuop.operator.controller.writers.apply",
        "controller-floors",
    ),
    # a writer reaching up into a pass
    (
        f"{CTL}/writers/upgrade.py",
        "import gpuop.operator.controller.passes.cluster",
        "controller-floors",
    ),
    # the base reaching up into the wiring
    (f"{CTL}/base/keys.py", "import gpuop.operator.controller.wiring.router", "controller-floors"),
    # one pass importing another: they meet only in the wiring
    (
        f"{CTL}/passes/node.py",
        "import gpuop.operator.controller.passes.cluster",
        "passes-independent",
    ),
    (
        f"{CTL}/passes/remediation.py",
        "import gpuop.operator.controller.passes.gpucluster",
        "passes-independent",
    ),
    # views read caches: no REST client, work queue or Event recorder
    (f"{CTL}/views/routes.py", "import gpuop.kube.rest", "views-read-only"),
    (f"{CTL}/views/node_views.py", "import gpuop.kube.workqueue", "views-read-only"),
    (f"{CTL}/views/pod_records.py", "import gpuop.operator.events", "views-read-only"),
    # the CLIs use the controller's public names only
    (
        "gpuop/upgrades_cli/_snapshot.py",
        "import gpuop.operator.controller.writers.eviction",
        "controller-public",
    ),
    (
        "gpuop/admin_cli/validate.py",
        "import gpuop.operator.controller.passes.gpucluster",
        "controller-public",
    ),
]


@pytest.mark.parametrize(("module", "wrong", "contract_id"), CASES)
def test_a_wrong_import_breaks_its_floor_contract(
    tmp_path: Path, module: str, wrong: str, contract_id: str
) -> None:
    assert_breaks(copy_tree(tmp_path), module, wrong, contract_id)
