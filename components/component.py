"""The common shape of an operand: its rollout state, switch, objects and deploy label."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from components.context import Manifest, RenderContext
from crd import ClusterPolicySpec

Render = Callable[[ClusterPolicySpec, RenderContext], list[Manifest]]


@dataclass(frozen=True)
class Component:
    """One rollout state of the operator.

    `objects` is empty when the component is disabled, or when it is enabled but has
    nothing to run yet (the MIG manager with no MIG-capable node); either way the
    controller deletes whatever of the component is left and does not wait on it.
    """

    name: str
    """Rollout state name (upstream's), also the `app.kubernetes.io/component` label."""
    deploy_label: str | None
    """Node label that selects the nodes its DaemonSet runs on, if it owns one."""
    is_enabled: Callable[[ClusterPolicySpec], bool]
    render: Render
    gates_rollout: bool = True
    """Later states wait for this one to be ready. False for operator-validation: its
    pods only turn Ready once the device plugin (a later state) advertises GPUs."""

    def enabled(self, spec: ClusterPolicySpec) -> bool:
        """Whether the policy switches this component on."""
        return self.is_enabled(spec)

    def objects(self, spec: ClusterPolicySpec, ctx: RenderContext) -> list[Manifest]:
        """Desired objects; empty when the component is disabled."""
        return self.render(spec, ctx) if self.enabled(spec) else []


def always(_spec: ClusterPolicySpec) -> bool:
    """For the states every policy has (pre-requisites, operator metrics)."""
    return True
