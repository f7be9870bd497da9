"""The alert rules (components/data/gpu-operator.rules.yaml) as Prometheus reads them:
`promtool check rules`, `promtool test rules` over tests/unit/data/alert_rules_test.yaml
(input series -> expected alerts), and checks that every alert is tested both firing and
silent and queries only metrics the operator or the node agent serves.

promtool is built once from the Go module proxy into the cache (`gpuop cluster build`
does it before the tests in tox); without Go these tests fail rather than skip.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric

from components.monitoring import RULES_FILE, data_text, rule_groups
from gpuop.cluster._build import ensure_promtool
from gpuop.metrics import OperatorMetrics
from gpuop.nodeagent.collector import _Families

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "components" / "data" / RULES_FILE
TESTS = Path(__file__).resolve().parent / "data" / "alert_rules_test.yaml"
METRIC = re.compile(r"\bgpu_operator_[a-z0-9_]+\b")


@pytest.fixture(scope="module")
def promtool() -> Path:
    return ensure_promtool()


def _run(promtool: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(promtool), *args], capture_output=True, text=True, check=False, timeout=300
    )


def _alerts() -> dict[str, dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {r["alert"]: r for g in groups for r in g["rules"]}


def test_promtool_checks_the_rules(promtool: Path) -> None:
    proc = _run(promtool, "check", "rules", str(RULES))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(_alerts())} rules found" in proc.stdout


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
    alerts = set(_alerts())
    assert alerts - firing == set(), "alerts never tested firing"
    assert alerts - silent == set(), "alerts never tested staying silent"
    assert (firing | silent) <= alerts, "tests name alerts that do not exist"


def _served(families: list[Metric]) -> set[str]:
    names: set[str] = set()
    for family in families:
        names.add(family.name)
        if family.type == "counter":
            names.add(f"{family.name}_total")
    return names


def test_rules_query_only_metrics_the_operator_or_node_agent_serves() -> None:
    registry: CollectorRegistry = OperatorMetrics().registry
    operator = _served(list(registry.collect()))
    node = _served(_Families().all())
    for name, rule in _alerts().items():
        used = set(METRIC.findall(rule["expr"]))
        assert used, name
        assert used <= operator | node, f"{name} queries {sorted(used - operator - node)}"
    # The node exporter's PrometheusRule carries the node groups, the operator's the rest.
    for group in rule_groups(node=True):
        for rule in group["rules"]:
            assert set(METRIC.findall(rule["expr"])) <= node, rule["alert"]
    for group in rule_groups(node=False):
        for rule in group["rules"]:
            assert set(METRIC.findall(rule["expr"])) <= operator, rule["alert"]


def test_the_chart_ships_the_same_rules_file() -> None:
    """The chart reads the rules through a link into components/data: one source."""
    shipped = ROOT / "deploy" / "helm" / "gpu-operator" / "files" / RULES_FILE
    assert shipped.is_symlink()
    assert shipped.resolve() == RULES.resolve()
    assert yaml.safe_load(data_text(RULES_FILE)) == yaml.safe_load(RULES.read_text())
