"""Prometheus Operator objects: ServiceMonitors for our metrics Services and the
PrometheusRules carrying our alert rules.

Both kinds exist only where the Prometheus Operator's CRDs are installed (the API server
refuses objects of an unknown kind), so each is rendered only when the context says its
API is served. The alert rules live in one file, ``components/data/gpu-operator.rules.yaml``:
the operator renders it here, the chart ships the same file (a link to it) as a ConfigMap
for a Prometheus without the operator, and promtool checks and unit-tests it in CI.
"""

from __future__ import annotations

import copy
import functools
from importlib import resources
from typing import Any

import yaml

from components._k8s import APP_LABEL, metadata
from components.context import Manifest, RenderContext
from crd import ClusterPolicySpec, ServiceMonitorSpec

MONITORING_API = "monitoring.coreos.com/v1"
RULES_FILE = "gpu-operator.rules.yaml"
"""The alert rules (a Prometheus rule file) in ``components/data``."""
DOWN_RULES_FILE = "gpu-operator-down.rules.yaml"
"""The rules for an operator or exporter that is not scraped (``absent``/``up == 0``), in
``components/data``: shipped by the chart, not rendered here (a dead operator renders
nothing)."""
DASHBOARD_FILE = "gpu-operator-dashboard.json"
"""The Grafana dashboard in ``components/data`` (shipped by the chart, not rendered)."""
NODE_GROUP_PREFIX = "gpu-operator-node"
"""Rule groups over the node status exporter's metrics go with that exporter's
PrometheusRule (as upstream splits them); every other group with the operator's."""


def data_text(name: str) -> str:
    """A file of ``components/data`` (package data, read-only)."""
    return resources.files("components").joinpath("data", name).read_text(encoding="utf-8")


@functools.cache
def _rule_groups() -> tuple[dict[str, Any], ...]:
    loaded = yaml.safe_load(data_text(RULES_FILE))
    return tuple(loaded["groups"])


def rule_groups(*, node: bool) -> list[dict[str, Any]]:
    """The node exporter's groups (``node=True``) or the operator's, as fresh copies."""
    return [
        copy.deepcopy(g)
        for g in _rule_groups()
        if str(g["name"]).startswith(NODE_GROUP_PREFIX) is node
    ]


def endpoint(
    port: str, settings: ServiceMonitorSpec | None, *, always_honor_labels: bool = False
) -> dict[str, Any]:
    """One ServiceMonitor endpoint tuned by ``settings``. ``always_honor_labels``: write
    `honorLabels` even when false, as upstream's DRA exporter manifest does."""
    out: dict[str, Any] = {"port": port, "path": "/metrics"}
    if settings is None:
        return out
    if settings.honor_labels or always_honor_labels:
        # Only when set, as upstream's: the Prometheus Operator's Endpoint omits a false
        # honorLabels (`omitempty`), which is also its default.
        out["honorLabels"] = settings.honor_labels
    if settings.interval:
        out["interval"] = settings.interval
    if settings.scrape_timeout:
        out["scrapeTimeout"] = settings.scrape_timeout
    if settings.relabelings:
        out["relabelings"] = settings.relabelings
    return out


def service_monitor(
    name: str,
    component: str,
    spec: ClusterPolicySpec,
    ctx: RenderContext,
    *,
    app: str,
    port: str,
    job_label: str,
    settings: ServiceMonitorSpec | None = None,
) -> Manifest:
    """A ServiceMonitor selecting the Service labelled ``app``, in our namespace only;
    ``settings`` (the policy's) add labels and tune the one endpoint, as upstream."""
    meta = metadata(name, component, spec, ctx)
    extra = (settings.additional_labels if settings else None) or {}
    meta["labels"] = {**extra, APP_LABEL: app, **meta["labels"]}
    return {
        "apiVersion": MONITORING_API,
        "kind": "ServiceMonitor",
        "metadata": meta,
        "spec": {
            "jobLabel": job_label,
            "selector": {"matchLabels": {APP_LABEL: app}},
            "namespaceSelector": {"matchNames": [ctx.namespace]},
            "endpoints": [endpoint(port, settings)],
        },
    }


def prometheus_rule(
    name: str,
    component: str,
    spec: ClusterPolicySpec,
    ctx: RenderContext,
    *,
    app: str,
    node: bool,
    labels: dict[str, str] | None = None,
) -> Manifest:
    """A PrometheusRule with the operator's or the node exporter's alert groups;
    ``labels`` (its ServiceMonitor's additional labels) match a Prometheus's rule
    selector (kube-prometheus-stack's: ``release``)."""
    meta = metadata(name, component, spec, ctx)
    meta["labels"] = {**(labels or {}), APP_LABEL: app, **meta["labels"]}
    return {
        "apiVersion": MONITORING_API,
        "kind": "PrometheusRule",
        "metadata": meta,
        "spec": {"groups": rule_groups(node=node)},
    }


def monitoring_objects(
    component: str,
    spec: ClusterPolicySpec,
    ctx: RenderContext,
    *,
    app: str,
    monitor_name: str,
    port: str,
    job_label: str,
    rule_name: str,
    node: bool,
    settings: ServiceMonitorSpec | None = None,
) -> list[Manifest]:
    """The ServiceMonitor and the PrometheusRule of one metrics Service, each only where
    its API is served: what the operator's and the node status exporter's metrics get.
    ``settings``' additional labels label both (a Prometheus selects each kind by label)."""
    objects: list[Manifest] = []
    if ctx.service_monitor_crd:
        objects.append(
            service_monitor(
                monitor_name,
                component,
                spec,
                ctx,
                app=app,
                port=port,
                job_label=job_label,
                settings=settings,
            )
        )
    if ctx.prometheus_rule_crd:
        labels = settings.additional_labels if settings else None
        objects.append(
            prometheus_rule(rule_name, component, spec, ctx, app=app, node=node, labels=labels)
        )
    return objects
