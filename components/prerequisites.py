"""pre-requisites: the RuntimeClass GPU pods (and GPU operands) run with."""

from __future__ import annotations

from components._k8s import metadata
from components.component import Component
from components.context import Manifest, RenderContext
from components.kinds import RUNTIME_CLASS
from crd import ClusterPolicySpec

NAME = "pre-requisites"
RUNTIME_HANDLER = "nvidia"
"""The runtime the container toolkit registers with containerd/CRI-O."""


EXTRA_HANDLERS = ("nvidia-cdi", "nvidia-legacy")
"""The toolkit also registers these handlers (runtime modes pinned to CDI or legacy
injection); each gets a RuntimeClass of its name so pods can ask for one."""


def _runtime_class(
    name: str, handler: str, spec: ClusterPolicySpec, ctx: RenderContext
) -> Manifest:
    return {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": metadata(name, NAME, spec, ctx, namespaced=False),
        "handler": handler,
    }


def render(spec: ClusterPolicySpec, ctx: RenderContext) -> list[Manifest]:
    classes = [_runtime_class(spec.operator.runtime_class, RUNTIME_HANDLER, spec, ctx)]
    classes += [
        _runtime_class(h, h, spec, ctx) for h in EXTRA_HANDLERS if h != spec.operator.runtime_class
    ]
    return classes


def enabled(spec: ClusterPolicySpec) -> bool:
    """Off with the NRI plugin, as upstream's `isStateEnabled`: operands then get the
    GPUs from the plugin, no runtime handler is registered, and the classes go."""
    return not spec.cdi.nri_plugin_enabled


COMPONENT = Component(
    name=NAME, deploy_label=None, is_enabled=enabled, render=render, kinds=(RUNTIME_CLASS,)
)
