"""The alert rules (components/data/gpu-operator.rules.yaml) as Prometheus reads them:
`promtool check rules`, `promtool test rules` over tests/unit/data/alert_rules_test.yaml
(input series -> expected alerts), and checks that every alert is tested both firing and
silent, and that the rules and the Grafana dashboard query only metrics the operator or
the node agent defines (tests/integration/test_monitoring_scrape.py: serves).

promtool is built once from the Go module proxy into the cache (`gpuop cluster build`
does it before the tests in tox); without Go these tests fail rather than skip.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from components.monitoring import DASHBOARD_FILE, RULES_FILE, data_text, rule_groups
from gpuop.cluster._build import ensure_promtool
from gpuop.metrics import OperatorMetrics
from gpuop.nodeagent.collector import _Families
from tests.monitoring_queries import alert_rules, dashboard, metrics_in, queried, served

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "components" / "data" / RULES_FILE
TESTS = Path(__file__).resolve().parent / "data" / "alert_rules_test.yaml"


@pytest.fixture(scope="module")
def promtool() -> Path:
    return ensure_promtool()


def _run(promtool: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(promtool), *args], capture_output=True, text=True, check=False, timeout=300
    )


def test_promtool_checks_the_rules(promtool: Path) -> None:
    proc = _run(promtool, "check", "rules", str(RULES))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in proc.stdout


def test_promtool_unit_tests_pass(promtool: Path) -> None:
    proc = _run(promtool, "test", "rules", str(TESTS))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_promtool_test_fails_on_a_wrong_expectation(promtool: Path, tmp_path: Path) -> None:
    """The promtool run above can fail: the same tests with one expected value changed."""
    tests = yaml.safe_load(TESTS.read_text())
    tests["rule_files"] = [str(RULES)]
    case = tests["tests"][0]["alert_rule_test"][1]
    case["exp_alerts"][0]["exp_labels"]["severity"] = "critical"
    broken = tmp_path / "broken_test.yaml"
    broken.write_text(yaml.safe_dump(tests))
    proc = _run(promtool, "test", "rules", str(broken))
    assert proc.returncode != 0
    assert "GPUOperatorReconciliationFailed" in proc.stdout + proc.stderr


def test_every_alert_is_tested_firing_and_silent() -> None:
    firing: set[str] = set()
    silent: set[str] = set()
    for case in yaml.safe_load(TESTS.read_text())["tests"]:
        for check in case.get("alert_rule_test") or []:
            (firing if check.get("exp_alerts") else silent).add(check["alertname"])
    alerts = set(alert_rules())
    assert alerts - firing == set(), "alerts never tested firing"
    assert alerts - silent == set(), "alerts never tested staying silent"
    assert (firing | silent) <= alerts, "tests name alerts that do not exist"


def test_rules_and_dashboard_query_only_metrics_the_operator_or_node_agent_serves() -> None:
    operator = served(OperatorMetrics().registry.collect())
    node = served(_Families().all())
    for what, used in queried().items():
        assert used, what
        assert used <= operator | node, f"{what} queries {sorted(used - operator - node)}"
    # The node exporter's PrometheusRule carries the node groups, the operator's the rest.
    for group in rule_groups(node=True):
        for rule in group["rules"]:
            assert metrics_in(rule["expr"]) <= node, rule["alert"]
    for group in rule_groups(node=False):
        for rule in group["rules"]:
            assert metrics_in(rule["expr"]) <= operator, rule["alert"]


def test_the_check_catches_a_metric_nobody_serves() -> None:
    assert metrics_in("max(gpu_operator_nodes_upgrades_failed) > 0") == {
        "gpu_operator_nodes_upgrades_failed"
    }
    operator = served(OperatorMetrics().registry.collect())
    assert "gpu_operator_reconciliation_total" in operator  # a counter, as scraped
    assert "gpu_operator_node_device_plugin_devices_total" not in operator
    assert not metrics_in("up == 0")


@pytest.mark.parametrize("name", [RULES_FILE, DASHBOARD_FILE])
def test_the_chart_and_deploy_ship_the_same_files(name: str) -> None:
    """The chart and deploy/monitoring read components/data through links: one source."""
    source = ROOT / "components" / "data" / name
    for shipped in (
        ROOT / "deploy" / "helm" / "gpu-operator" / "files" / name,
        ROOT / "deploy" / "monitoring" / name,
    ):
        assert shipped.is_symlink(), shipped
        assert shipped.resolve() == source.resolve()
    assert data_text(name) == source.read_text()


def test_dashboard_panels_all_query_and_have_unique_ids() -> None:
    board = dashboard()
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    assert [v["name"] for v in board["templating"]["list"]] == ["datasource"]
