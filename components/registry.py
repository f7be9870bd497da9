"""All components in upstream rollout order, and the policy-wide views over them."""

from __future__ import annotations

from components import (
    dcgm,
    dcgm_exporter,
    device_plugin,
    driver,
    gfd,
    mig_manager,
    mps,
    node_status_exporter,
    operator_metrics,
    prerequisites,
    toolkit,
    validator,
)
from components.component import Component
from components.context import Manifest, RenderContext
from crd import ClusterPolicySpec

COMPONENTS: tuple[Component, ...] = (
    prerequisites.COMPONENT,
    operator_metrics.COMPONENT,
    driver.COMPONENT,
    toolkit.COMPONENT,
    validator.COMPONENT,
    device_plugin.COMPONENT,
    mps.COMPONENT,
    dcgm.COMPONENT,
    dcgm_exporter.COMPONENT,
    gfd.COMPONENT,
    mig_manager.COMPONENT,
    node_status_exporter.COMPONENT,
)
"""Rollout order: a component rolls out once every earlier gating one is ready."""

_BY_NAME = {c.name: c for c in COMPONENTS}


def component_by_name(name: str) -> Component:
    """The component for a rollout state name; KeyError for unknown names."""
    return _BY_NAME[name]


def enabled_components(spec: ClusterPolicySpec) -> list[str]:
    """Names of the components the policy switches on, in rollout order."""
    return [c.name for c in COMPONENTS if c.enabled(spec)]


def desired_objects(spec: ClusterPolicySpec, ctx: RenderContext) -> dict[str, list[Manifest]]:
    """Every component's desired objects, keyed by name in rollout order (empty lists for
    disabled components, whose leftover objects the controller deletes)."""
    return {c.name: c.objects(spec, ctx) for c in COMPONENTS}
