"""All operands in upstream rollout order, and every list derived from them.

This tuple is the one place an operand is registered. What used to be kept in parallel
lists is read from it: the rollout order (`statemachine.rollout`), the per-operand deploy
labels and which nodes get them (`components.labels`), the kinds the controller watches
and prunes (`gpuop.operator.controller`), the permissions the operator must hold to grant
operands their RBAC (checked against the chart by a unit test), and the ClusterRoles the
chart lets it write (its generated `files/operand-roles.yaml`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from components import (
    cc_manager,
    dcgm,
    dcgm_exporter,
    device_plugin,
    driver,
    gfd,
    kata_device_plugin,
    mig_manager,
    mps,
    node_status_exporter,
    operator_metrics,
    prerequisites,
    sandbox_device_plugin,
    sandbox_validator,
    toolkit,
    validator,
    vfio_manager,
    vgpu_device_manager,
    vgpu_manager,
)
from components.component import EVERY_WORKLOAD, PASSTHROUGH_ONLY, Component, ObjectKind, Placement
from components.context import Manifest, RenderContext
from components.keys import (
    CONTAINER_WORKLOAD,
    DEPLOY_CLIENT_LABEL,
    DEPLOY_KATA_MANAGER_LABEL,
    KUBEVIRT_MODE,
)
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
    # GPUs for VMs (sandboxWorkloads): upstream's order, but for the VFIO manager, which
    # comes before the sandbox validator here: the validator checks what it did.
    vgpu_manager.COMPONENT,
    vgpu_device_manager.COMPONENT,
    vfio_manager.COMPONENT,
    sandbox_validator.COMPONENT,
    sandbox_device_plugin.COMPONENT,
    kata_device_plugin.COMPONENT,
    cc_manager.COMPONENT,
)
"""Rollout order: every enabled component is applied in each pass, and each GPU node
    takes them in this order (its per-node machine, `statemachine.node_rollout`): on a
    VM host the vGPU or VFIO manager, the vGPU device manager, the validator, then the
    device plugin."""

EXTRA_DEPLOY_LABELS: tuple[tuple[str, Placement], ...] = (
    (DEPLOY_KATA_MANAGER_LABEL, PASSTHROUGH_ONLY),
    (DEPLOY_CLIENT_LABEL, EVERY_WORKLOAD),
)
"""Deploy labels set with the operands' though no operand of ours owns them (upstream's),
with the workloads whose nodes get them."""


def rollout_order(components: Iterable[Component]) -> tuple[str, ...]:
    """The rollout state names, in order."""
    return tuple(c.name for c in components)


def node_order(components: Iterable[Component]) -> tuple[str, ...]:
    """The components that run pods on nodes (they render a DaemonSet), in rollout order:
    the states of the per-node rollout machine."""
    return tuple(c.name for c in components if any(k.kind == "DaemonSet" for k in c.kinds))


def workload_node_order(
    workload: str, mode: str = KUBEVIRT_MODE, components: Iterable[Component] = COMPONENTS
) -> tuple[str, ...]:
    """The per-node states of a node serving `workload` under sandbox `mode`: the node
    components whose deploy label such a node carries (the MPS daemon, which has none,
    goes with the device plugin), in rollout order. A VM host's: the vGPU or VFIO
    manager, the vGPU device manager, the sandbox validator, then its device plugin."""
    order = node_order(components)
    return tuple(
        c.name for c in components if c.name in order and c.placement.applies(workload, mode)
    )


def deploy_labels(components: Iterable[Component]) -> tuple[str, ...]:
    """Every deploy label we manage: the operands' in rollout order, then the extras."""
    owned = (c.deploy_label for c in components if c.deploy_label)
    return tuple(dict.fromkeys((*owned, *(label for label, _ in EXTRA_DEPLOY_LABELS))))


def owned_kinds(components: Iterable[Component]) -> tuple[ObjectKind, ...]:
    """Every kind some operand renders, each once, in order of first appearance."""
    return tuple(dict.fromkeys(k for c in components for k in c.kinds))


def cluster_roles(components: Iterable[Component]) -> tuple[str, ...]:
    """The names of every ClusterRole (and binding) an operand may render, sorted: the
    only ones the chart lets the operator write (`components.rbac.chart_roles_yaml`)."""
    return tuple(sorted({name for c in components for name in c.cluster_roles}))


ROLLOUT_ORDER = rollout_order(COMPONENTS)
NODE_ORDER = node_order(COMPONENTS)
DEPLOY_LABELS = deploy_labels(COMPONENTS)
"""Like upstream, those of a node's workload are set on every GPU node whether or not the
policy enables that operand (but only where the operand is eligible: the MIG manager's
on MIG-capable nodes), so enabling an operand later needs no node relabelling and users'
node selectors see the same labels as with upstream."""
OWNED_KINDS = owned_kinds(COMPONENTS)
CLUSTER_ROLES = cluster_roles(COMPONENTS)

_BY_NAME = {c.name: c for c in COMPONENTS}


def component_by_name(name: str) -> Component:
    """The component for a rollout state name; KeyError for unknown names."""
    return _BY_NAME[name]


def enabled_components(spec: ClusterPolicySpec) -> list[str]:
    """Names of the components the policy switches on, in rollout order."""
    return [c.name for c in COMPONENTS if c.enabled(spec)]


def eligible_deploy_labels(
    labels: Mapping[str, str],
    workload: str = CONTAINER_WORKLOAD,
    mode: str = KUBEVIRT_MODE,
    components: Iterable[Component] = COMPONENTS,
) -> set[str]:
    """The deploy labels a GPU node with these labels, serving `workload`, should carry
    under sandbox `mode` (`sandboxWorkloads.mode`)."""
    owned = {
        c.deploy_label
        for c in components
        if c.deploy_label and c.placement.applies(workload, mode) and c.eligible(labels)
    }
    extras = {label for label, where in EXTRA_DEPLOY_LABELS if where.applies(workload, mode)}
    return owned | extras


def desired_objects(spec: ClusterPolicySpec, ctx: RenderContext) -> dict[str, list[Manifest]]:
    """Every component's desired objects, keyed by name in rollout order (empty lists for
    disabled components, whose leftover objects the controller deletes)."""
    return {c.name: c.objects(spec, ctx) for c in COMPONENTS}
