"""The Grafana dashboard (components/data/gpu-operator-dashboard.json): the committed file
is the generator's output (components/dashboard.py), its variables are all defined and
used, every selector is scoped to them, every panel says what it shows, the GPU panels
are there, and promtool parses every query. That every metric it queries is one the
operator or the node agent defines is checked with the alert rules
(test_alert_rules.py), against a live scrape in
tests/integration/test_monitoring_scrape.py.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from components import dashboard as generator
from components.monitoring import DASHBOARD_FILE, data_text
from gpuop.devcluster._build import ensure_promtool
from gpuop.nodeagent.collector import _Families
from gpuop.operator.metrics import OperatorMetrics
from tests.monitoring_queries import (
    METRIC,
    dashboard,
    metrics_in,
    panel_queries,
    served,
    variable_queries,
)

VARIABLE_USE = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))")
"""``$name``, ``${name}`` or ``${name:format}``; Grafana's own start with ``__``."""
SELECTOR = re.compile(r"\b(gpu_operator_[a-z0-9_]+)(\{[^}]*\})?")


def _panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def _variables() -> list[dict[str, Any]]:
    variables: list[dict[str, Any]] = dashboard()["templating"]["list"]
    return variables


def _uses(value: Any) -> Iterator[str]:
    """Every variable named anywhere in a JSON value, strings and keys alike."""
    if isinstance(value, str):
        for braced, bare in VARIABLE_USE.findall(value):
            name = braced or bare
            if not name.startswith("__"):
                yield name
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _uses(key)
            yield from _uses(item)
    elif isinstance(value, list):
        for item in value:
            yield from _uses(item)


def _exprs() -> list[str]:
    return [e for exprs in panel_queries().values() for e in exprs]


def test_the_committed_dashboard_is_the_generators_output() -> None:
    assert data_text(DASHBOARD_FILE) == generator.render(), (
        f"components/data/{DASHBOARD_FILE} is out of date: regenerate with"
        " `python -m tests.dashboard_file`"
    )


def test_the_variables_are_datasource_cluster_namespace_node() -> None:
    variables = _variables()
    assert [v["name"] for v in variables] == ["datasource", "cluster", "namespace", "node"]
    assert variables[0]["type"] == "datasource"
    assert variables[0]["query"] == "prometheus"
    for var in variables[1:]:
        assert var["type"] == "query", var["name"]
        assert var["datasource"] == generator.DATASOURCE
        assert var["query"].startswith("label_values("), var["name"]
        assert var["query"].endswith(f", {var['name']})"), var["name"]
        # "All" matches any value and a missing label too: a Prometheus of one cluster
        # sets no `cluster` label, and the queries must still return data there.
        assert var["includeAll"] is True
        assert var["allValue"] == ".*"
        assert re.fullmatch(var["allValue"], "")


def test_every_variable_is_defined_before_it_is_used_and_every_one_is_used() -> None:
    board = dashboard()
    defined = [v["name"] for v in _variables()]
    for i, var in enumerate(_variables()):
        used = set(_uses({k: v for k, v in var.items() if k != "name"}))
        assert used <= set(defined[:i]), f"${var['name']} uses {sorted(used)}"
    in_panels = set(_uses(board["panels"]))
    in_board = set(_uses({k: v for k, v in board.items() if k != "templating"}))
    assert in_board <= set(defined), f"undefined: {sorted(in_board - set(defined))}"
    in_variables = {u for v in _variables() for u in _uses(v["query"])}
    unused = set(defined) - in_panels - in_variables
    assert unused == set(), f"defined, never used: {sorted(unused)}"


def test_the_checks_see_variables() -> None:
    assert set(_uses('up{a=~"$cluster", b="${node}", c="${namespace:regex}"}')) == {
        "cluster",
        "node",
        "namespace",
    }
    assert list(_uses("rate(x[$__rate_interval])")) == []


def test_every_selector_is_scoped_to_the_variables() -> None:
    """Every metric of every panel in the chosen clusters and namespaces; the node
    agent's (which carry a `node` label) on the chosen nodes too."""
    node = served(_Families().all())
    scope = set(generator.SCOPE)
    for expr in _exprs():
        found = SELECTOR.findall(expr)
        assert found, expr
        for metric, selector in found:
            matchers = {m.strip() for m in selector.strip("{}").split(",")}
            assert scope <= matchers, f"{metric} in {expr!r}"
            assert (metric in node) is ('node=~"$node"' in matchers), f"{metric} in {expr!r}"


def test_the_variables_narrow_each_other() -> None:
    """namespace within the chosen clusters, node within the chosen namespaces, from a
    metric every node agent serves."""
    queries = variable_queries()
    assert set(_uses(queries["namespace"])) == {"cluster"}
    assert set(_uses(queries["node"])) == {"cluster", "namespace"}
    node = served(_Families().all())
    assert metrics_in(queries["node"]) <= node


def test_every_panel_has_a_description_a_unique_title_and_queries() -> None:
    panels = _panels()
    titles = [p["title"] for p in panels]
    assert len(titles) == len(set(titles))
    ids = [p["id"] for p in dashboard()["panels"]]
    assert len(ids) == len(set(ids))
    for panel in panels:
        assert panel.get("description", "").strip(), f"{panel['title']!r} has no description"
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}


def test_panels_fit_the_grid_without_overlapping() -> None:
    taken: set[tuple[int, int]] = set()
    for panel in dashboard()["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0, panel["title"]
        assert grid["x"] + grid["w"] <= generator.WIDTH, panel["title"]
        cells = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not cells & taken, f"{panel['title']!r} overlaps another panel"
        taken |= cells


# Each GPU fault or reading the node agent exports, and a panel that shows it.
GPU_FAMILIES = {
    "gpu_operator_node_gpu_up": "GPUs lost",
    "gpu_operator_node_gpu_ecc_errors_total": "Uncorrectable ECC errors",
    "gpu_operator_node_gpu_remapped_rows_failed": "Row remap failures",
    "gpu_operator_node_gpu_xid_errors_total": "XID errors (per hour), per node and XID",
    "gpu_operator_node_gpu_utilization_ratio": "GPU utilisation",
    "gpu_operator_node_gpu_memory_used_bytes": "GPU memory used",
    "gpu_operator_node_gpu_temperature_celsius": "GPU temperature",
    "gpu_operator_node_gpu_power_usage_watts": "GPU power draw, share of the limit",
    "gpu_operator_node_gpu_clock_throttle_active": "GPUs with clocks held down, by reason",
}


def test_the_gpu_panels_show_the_node_agents_gpu_metrics() -> None:
    queries = panel_queries()
    for metric, title in GPU_FAMILIES.items():
        assert title in queries, f"no panel {title!r}"
        assert metric in set().union(*(metrics_in(e) for e in queries[title])), title
    rows = [p["title"] for p in dashboard()["panels"] if p["type"] == "row"]
    assert "GPUs (node agent)" in rows


def test_every_gpu_family_the_node_agent_exports_is_on_the_dashboard() -> None:
    """Not only the ones above: every per-GPU family (gpu_operator_node_gpu_*) has a panel."""
    gpu = {n for n in served(_Families().all()) if n.startswith("gpu_operator_node_gpu_")}
    on_board = set().union(*(metrics_in(e) for e in _exprs()))
    counters = {n.removesuffix("_total") for n in gpu if n.endswith("_total")}
    missing = {n for n in gpu - on_board if n not in counters}
    assert missing == set()


def test_the_dashboard_links_to_nvidias_dcgm_exporter_dashboard() -> None:
    urls = [link["url"] for link in dashboard()["links"]]
    assert "https://grafana.com/grafana/dashboards/12239" in urls


def test_the_operator_panels_are_still_there() -> None:
    operator = served(OperatorMetrics().registry.collect())
    on_board = set().union(*(metrics_in(e) for e in _exprs()))
    assert {
        "gpu_operator_reconciliation_status",
        "gpu_operator_nodes_upgrades_failed",
        "gpu_operator_gpu_health_remediation_paused",
        "gpu_operator_reconcile_duration_seconds_bucket",
    } <= on_board & operator


@pytest.fixture(scope="module")
def promtool() -> Path:
    return ensure_promtool()


def test_promtool_parses_every_query(promtool: Path, tmp_path: Path) -> None:
    """Each panel query, and each variable's selector, as a recording rule, the variables
    at their "All" value: `promtool check rules` parses them all."""
    exprs = list(_exprs())
    for query in variable_queries().values():
        selector = query.removeprefix("label_values(").rsplit(",", 1)[0]
        assert METRIC.match(selector), query
        exprs.append(selector)

    def all_values(expr: str) -> str:
        return VARIABLE_USE.sub(".*", expr)

    rules = [{"record": f"dashboard:query{i}", "expr": all_values(e)} for i, e in enumerate(exprs)]
    path = tmp_path / "dashboard.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    proc = subprocess.run(
        [str(promtool), "check", "rules", str(path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(rules)} rules found" in proc.stdout

    broken = tmp_path / "broken.rules.yaml"
    broken.write_text(
        yaml.safe_dump({"groups": [{"name": "d", "rules": [{"record": "x:y", "expr": "sum("}]}]})
    )
    assert subprocess.run([str(promtool), "check", "rules", str(broken)], check=False).returncode
