"""What the shipped alert rules and Grafana dashboard query, and what the operator and
the node agent serve: shared by the unit tests (against their metric definitions) and
the integration test (against live scrapes)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

import yaml
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from components.monitoring import DASHBOARD_FILE, RULES_FILE, data_text

METRIC = re.compile(r"\bgpu_operator_[a-z0-9_]+\b")
"""Every metric of ours is named gpu_operator_*; no label or function is."""


def alert_rules() -> dict[str, dict[str, Any]]:
    """Alert name -> rule, from the one rules file."""
    groups = yaml.safe_load(data_text(RULES_FILE))["groups"]
    return {r["alert"]: r for g in groups for r in g["rules"]}


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(data_text(DASHBOARD_FILE))
    return loaded


def panel_queries() -> dict[str, list[str]]:
    """Panel title -> its PromQL expressions (rows have none)."""
    return {
        p["title"]: [t["expr"] for t in p["targets"]]
        for p in dashboard()["panels"]
        if p.get("targets")
    }


def variable_queries() -> dict[str, str]:
    """Query variable name -> its query (``label_values(selector, label)``)."""
    return {
        v["name"]: v["query"] for v in dashboard()["templating"]["list"] if v["type"] == "query"
    }


def metrics_in(expr: str) -> set[str]:
    return set(METRIC.findall(expr))


def queried() -> dict[str, set[str]]:
    """Each alert, panel and dashboard variable -> the metrics it queries."""
    out = {f"alert {name}": metrics_in(rule["expr"]) for name, rule in alert_rules().items()}
    for title, exprs in panel_queries().items():
        out[f"panel {title!r}"] = set().union(*(metrics_in(e) for e in exprs))
    for name, query in variable_queries().items():
        out[f"variable ${name}"] = metrics_in(query)
    return out


def served(families: Iterable[Metric]) -> set[str]:
    """The names a scrape of ``families`` can hold (a counter's with ``_total``)."""
    names: set[str] = set()
    for family in families:
        names.add(family.name)
        if family.type == "counter":
            names.add(f"{family.name}_total")
        if family.type == "histogram":
            names |= {f"{family.name}_{part}" for part in ("bucket", "sum", "count")}
    return names


def served_in_text(text: str) -> set[str]:
    """The names an exposition (a scrape's body) declares, samples or not."""
    return served(text_string_to_metric_families(text))
