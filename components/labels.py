"""Node labelling as a pure function: which of our labels a node should gain or lose.

Ownership is read from values, so nothing needs remembering between passes: `true` on
`nvidia.com/gpu.present` or a deploy label is ours; `false` is the user's (never touched);
`paused-for-*` belongs to another component that stopped an operand for a while (left
alone). Only our own values are ever removed, and the result is a fixed point: applying
it and asking again yields no change.

As upstream, every GPU node gets the deploy label of every operand of its workload
(`node_workload`: containers, or with `sandboxWorkloads` a VM host) whether or not the
policy enables that operand (the DaemonSet decides what runs), where the operand is
eligible (`Component.eligible`: the MIG manager's only on MIG-capable nodes), and a
MIG-capable node without `nvidia.com/mig.config` gets the policy's default layout. That
label is a request, not a mark of ours: once set, it is never changed or removed
(uninstall included). A node whose workload changes loses the other workload's labels
(ours) in the same patch that gives it the new ones.

A GPU node stays one while NFD's labels are away from it (`components.keys.
nfd_labels_away`: our `gpu.present=true` and no NFD label at all, as NFD's uninstall
prune leaves it): it keeps its deploy labels, the MIG manager's included, until NFD
labels it again and says otherwise.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from components.keys import (
    CONTAINER_WORKLOAD,
    DEPLOY_OPERANDS_LABEL,
    FALSE,
    GPU_PRESENT_LABEL,
    MIG_CONFIG_LABEL,
    PAUSED_PREFIX,
    TRUE,
    WORKLOAD_CONFIG_LABEL,
    WORKLOADS,
)
from components.keys import is_gpu_node as is_gpu_node
from components.keys import is_mig_capable as is_mig_capable
from components.keys import nfd_labels_away as nfd_labels_away
from components.registry import DEPLOY_LABELS, eligible_deploy_labels
from crd import ClusterPolicySpec

LabelChanges = dict[str, str | None]
"""Label key to new value, or None to remove it."""


@dataclass(frozen=True)
class NodeWorkload:
    """What a node's GPUs serve, as the labeller reads it (upstream's rules)."""

    name: str
    """`container`, `vm-passthrough` or `vm-vgpu`."""
    invalid_value: str | None = None
    """The node's `nvidia.com/gpu.workload.config` when it names no workload (the node
    then serves the policy's default): worth a Warning Event naming the node."""

    @property
    def problem(self) -> str | None:
        """What is wrong with the node's label, for the Event; None when nothing is."""
        if self.invalid_value is None:
            return None
        return (
            f"{WORKLOAD_CONFIG_LABEL}={self.invalid_value!r} is not one of "
            f"{', '.join(WORKLOADS)}: the node serves the default workload {self.name!r}"
        )


def node_workload(labels: Mapping[str, str], spec: ClusterPolicySpec | None) -> NodeWorkload:
    """A node's workload: `container` unless `sandboxWorkloads.enabled`; then its
    `nvidia.com/gpu.workload.config` label, or `sandboxWorkloads.defaultWorkload` where
    the label is missing or invalid (as upstream falls back; an invalid value is
    reported in `invalid_value`)."""
    if spec is None or not spec.sandbox_workloads.enabled:
        return NodeWorkload(CONTAINER_WORKLOAD)
    default = spec.sandbox_workloads.default_workload
    value = labels.get(WORKLOAD_CONFIG_LABEL)
    if value is None:
        return NodeWorkload(default)
    if value in WORKLOADS:
        return NodeWorkload(value)
    return NodeWorkload(default, invalid_value=value)


def wanted_deploy_labels(labels: Mapping[str, str], spec: ClusterPolicySpec | None) -> set[str]:
    """Deploy labels that should be `true` on this node (before respecting user values):
    on a GPU node those of every operand of its workload it is eligible for, none
    elsewhere."""
    if spec is None or not is_gpu_node(labels) or labels.get(DEPLOY_OPERANDS_LABEL) == FALSE:
        return set()
    workload = node_workload(labels, spec).name
    return eligible_deploy_labels(labels, workload, spec.sandbox_workloads.mode)


def _default_mig_config(labels: Mapping[str, str], spec: ClusterPolicySpec | None) -> str | None:
    """The layout a MIG-capable GPU node starts with when it has none."""
    if spec is None or not spec.mig_manager.enabled or not is_gpu_node(labels):
        return None
    if not is_mig_capable(labels) or labels.get(DEPLOY_OPERANDS_LABEL) == FALSE:
        return None
    config = spec.mig_manager.config
    return (config.default if config else "all-disabled") or None


def _not_ours(value: str | None) -> bool:
    return value == FALSE or (value is not None and value.startswith(PAUSED_PREFIX))


def node_label_changes(labels: Mapping[str, str], spec: ClusterPolicySpec | None) -> LabelChanges:
    """The label patch for one node; empty when the node is already as it should be.

    `spec` is None when no ClusterPolicy is active (deleted, or the operator being
    uninstalled): then nothing of ours stays on the node, `gpu.present` included, so
    an uninstall leaves nodes as they were found.
    """
    changes: LabelChanges = {}
    present = labels.get(GPU_PRESENT_LABEL)
    if spec is None:
        if present == TRUE:
            changes[GPU_PRESENT_LABEL] = None
    elif is_gpu_node(labels):
        if present != TRUE and not _not_ours(present):
            changes[GPU_PRESENT_LABEL] = TRUE
    elif present == TRUE:
        changes[GPU_PRESENT_LABEL] = None
    default_layout = _default_mig_config(labels, spec)
    if default_layout and MIG_CONFIG_LABEL not in labels:
        changes[MIG_CONFIG_LABEL] = default_layout
    wanted = wanted_deploy_labels(labels, spec)
    for key in DEPLOY_LABELS:
        value = labels.get(key)
        if _not_ours(value):
            continue
        if key in wanted and value != TRUE:
            changes[key] = TRUE
        elif key not in wanted and value == TRUE:
            changes[key] = None
    return changes


def apply_label_changes(
    labels: Mapping[str, str], changes: Mapping[str, str | None]
) -> dict[str, str]:
    """The labels after a patch (what the API server would store)."""
    result = dict(labels)
    for key, value in changes.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = value
    return result


def any_mig_capable(nodes: Iterable[Mapping[str, str]]) -> bool:
    """Whether some GPU node (given by its labels) is MIG-capable: RenderContext.mig_capable."""
    return any(is_gpu_node(labels) and is_mig_capable(labels) for labels in nodes)
