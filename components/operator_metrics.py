"""operator-metrics: the Service Prometheus scrapes the operator's own metrics through."""

from __future__ import annotations

from components._k8s import metadata
from components.component import Component, always
from components.context import Manifest, RenderContext
from components.kinds import SERVICE
from crd import ClusterPolicySpec

NAME = "operator-metrics"
SERVICE_NAME = "gpu-operator"
OPERATOR_APP = "gpu-operator"
"""`app` label of the operator's own pods (set by the chart)."""
METRICS_PORT = 8080
METRICS_PORT_NAME = "gpu-operator-metrics"


def render(spec: ClusterPolicySpec, ctx: RenderContext) -> list[Manifest]:
    return [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": metadata(SERVICE_NAME, NAME, spec, ctx),
            "spec": {
                "selector": {"app": OPERATOR_APP},
                "ports": [
                    {
                        "name": METRICS_PORT_NAME,
                        "port": METRICS_PORT,
                        "targetPort": METRICS_PORT,
                        "protocol": "TCP",
                    }
                ],
            },
        }
    ]


COMPONENT = Component(
    name=NAME, deploy_label=None, is_enabled=always, render=render, kinds=(SERVICE,)
)
