"""The alert rules (components/data/gpu-operator.rules.yaml, and the chart's
gpu-operator-down.rules.yaml) as Prometheus reads them: `promtool check rules`,
`promtool test rules` over tests/unit/data/alert_rules_test.yaml (input series ->
expected alerts), and checks that every alert is tested both firing and silent, that
every alert links an existing section of docs/runbooks.md, and that the rules and the
Grafana dashboard query only metrics the operator or the node agent defines
(tests/integration/test_monitoring_scrape.py: serves).

promtool is built once from the Go module proxy into the cache (`gpuop cluster build`
does it before the tests in tox); without Go these tests fail rather than skip.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from components.monitoring import (
    DASHBOARD_FILE,
    DOWN_RULES_FILE,
    RULES_FILE,
    data_text,
    rule_groups,
)
from gpuop.devcluster._build import ensure_promtool
from gpuop.nodeagent.collector import _Families
from gpuop.operator.metrics import OperatorMetrics
from tests.monitoring_queries import alert_rules, metrics_in, queried, served

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "components" / "data" / RULES_FILE
DOWN_RULES = ROOT / "components" / "data" / DOWN_RULES_FILE
TESTS = Path(__file__).resolve().parent / "data" / "alert_rules_test.yaml"
RUNBOOKS = ROOT / "docs" / "runbooks.md"
RUNBOOK_URL = "https://github.com/gpuop/gpuop/blob/main/docs/runbooks.md"


def _every_alert() -> dict[str, dict[str, Any]]:
    """Alert name -> rule, over both rule files (the operator's and the chart's)."""
    rules: dict[str, dict[str, Any]] = {}
    for path in (RULES, DOWN_RULES):
        for group in yaml.safe_load(path.read_text())["groups"]:
            rules.update((r["alert"], r) for r in group["rules"])
    return rules


@pytest.fixture(scope="module")
def promtool() -> Path:
    return ensure_promtool()


def _run(promtool: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(promtool), *args], capture_output=True, text=True, check=False, timeout=300
    )


def test_promtool_checks_the_rules(promtool: Path) -> None:
    proc = _run(promtool, "check", "rules", str(RULES), str(DOWN_RULES))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in proc.stdout
    assert f"SUCCESS: {len(_every_alert()) - len(alert_rules())} rules found" in proc.stdout


def test_promtool_unit_tests_pass(promtool: Path) -> None:
    proc = _run(promtool, "test", "rules", str(TESTS))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_promtool_test_fails_on_a_wrong_expectation(promtool: Path, tmp_path: Path) -> None:
    """The promtool run above can fail: the same tests with one expected value changed."""
    tests = yaml.safe_load(TESTS.read_text())
    tests["rule_files"] = [str(RULES), str(DOWN_RULES)]
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
    alerts = set(_every_alert())
    assert alerts - firing == set(), "alerts never tested firing"
    assert alerts - silent == set(), "alerts never tested staying silent"
    assert (firing | silent) <= alerts, "tests name alerts that do not exist"


def _github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation but `-` and
    `_` dropped, spaces to `-`."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _runbook_anchors(markdown: str) -> set[str]:
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    in_code = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        match = None if in_code else re.match(r"#{1,6} (.+)", line)
        if match:
            anchor = _github_anchor(match.group(1))
            count = seen.get(anchor, 0)
            seen[anchor] = count + 1
            anchors.add(anchor if count == 0 else f"{anchor}-{count}")
    return anchors


def test_every_alert_links_its_runbook_section() -> None:
    anchors = _runbook_anchors(RUNBOOKS.read_text())
    for name, rule in _every_alert().items():
        url = urlsplit(rule["annotations"].get("runbook_url", ""))
        assert f"{url.scheme}://{url.netloc}{url.path}" == RUNBOOK_URL, name
        assert url.fragment in anchors, f"{name}: no section #{url.fragment} in {RUNBOOKS}"
        assert url.fragment == _github_anchor(name), name  # its own section


def test_the_runbook_anchor_check_catches_a_missing_section() -> None:
    anchors = _runbook_anchors("# Runbooks\n\n## GPUOperatorDown\n```sh\n# not a heading\n```\n")
    assert anchors == {"runbooks", "gpuoperatordown"}
    assert _github_anchor("The GPU (lost), again") == "the-gpu-lost-again"


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


@pytest.mark.parametrize("name", [RULES_FILE, DOWN_RULES_FILE, DASHBOARD_FILE])
def test_the_chart_and_deploy_ship_the_same_files(name: str) -> None:
    """One source, components/data: deploy/monitoring links to it; the chart holds
    copies (Helm warns about every link in a chart), regenerated by
    `python -m tests.integration.helm_chart` and kept equal here."""
    source = ROOT / "components" / "data" / name
    linked = ROOT / "deploy" / "monitoring" / name
    assert linked.is_symlink(), linked
    assert linked.resolve() == source.resolve()
    copied = ROOT / "deploy" / "helm" / "gpu-operator" / "files" / name
    assert not copied.is_symlink(), copied
    assert copied.read_bytes() == source.read_bytes(), (
        f"{copied} differs from {source}: regenerate with `python -m tests.integration.helm_chart`"
    )
    assert data_text(name) == source.read_text()
