"""operator-metrics: the Service Prometheus scrapes the operator's own metrics through,
and, where the Prometheus Operator's CRDs are served, its ServiceMonitor (always, as
upstream: `operator.metrics.serviceMonitor` only tunes it) and the operator's alert rules."""

from __future__ import annotations

from components._k8s import service
from components.component import Component, always
from components.context import Manifest, RenderContext
from components.kinds import PROMETHEUS_RULE, SERVICE, SERVICE_MONITOR
from components.monitoring import monitoring_objects
from crd import ClusterPolicySpec

NAME = "operator-metrics"
SERVICE_NAME = "gpu-operator"
SERVICE_MONITOR_NAME = "gpu-operator"
PROMETHEUS_RULE_NAME = "nvidia-gpu-operator-metrics"
"""Upstream's name for its operator alerts (it creates them on OpenShift only)."""
OPERATOR_APP = "gpu-operator"
"""`app` label of the operator's own pods (set by the chart) and of its metrics Service."""
METRICS_PORT = 8080
METRICS_PORT_NAME = "gpu-operator-metrics"
JOB_LABEL = "operator"


def _service(spec: ClusterPolicySpec, ctx: RenderContext) -> Manifest:
    return service(
        SERVICE_NAME,
        NAME,
        spec,
        ctx,
        app=OPERATOR_APP,  # the label the chart gives the operator's pods
        port_name=METRICS_PORT_NAME,
        port=METRICS_PORT,
        scrape=True,
    )


def render(spec: ClusterPolicySpec, ctx: RenderContext) -> list[Manifest]:
    settings = spec.operator.metrics.service_monitor if spec.operator.metrics else None
    return [
        _service(spec, ctx),
        *monitoring_objects(
            NAME,
            spec,
            ctx,
            app=OPERATOR_APP,
            monitor_name=SERVICE_MONITOR_NAME,
            port=METRICS_PORT_NAME,
            job_label=JOB_LABEL,
            rule_name=PROMETHEUS_RULE_NAME,
            node=False,
            settings=settings,
        ),
    ]


COMPONENT = Component(
    name=NAME,
    deploy_label=None,
    is_enabled=always,
    render=render,
    kinds=(SERVICE, SERVICE_MONITOR, PROMETHEUS_RULE),
)
