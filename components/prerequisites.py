"""pre-requisites: the RuntimeClass GPU pods (and GPU operands) run with."""

from __future__ import annotations

from components._k8s import metadata
from components.component import Component, always
from components.context import Manifest, RenderContext
from crd import ClusterPolicySpec

NAME = "pre-requisites"
RUNTIME_HANDLER = "nvidia"
"""The runtime the container toolkit registers with containerd/CRI-O."""


def render(spec: ClusterPolicySpec, ctx: RenderContext) -> list[Manifest]:
    return [
        {
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": metadata(spec.operator.runtime_class, NAME, spec, ctx, namespaced=False),
            "handler": RUNTIME_HANDLER,
        }
    ]


COMPONENT = Component(name=NAME, deploy_label=None, is_enabled=always, render=render)
