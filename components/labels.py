"""Node labelling as a pure function: which of our labels a node should gain or lose.

Ownership is read from values, so nothing needs remembering between passes: `true` on
`nvidia.com/gpu.present` or a deploy label is ours; `false` is the user's (never touched);
`paused-for-*` belongs to another component that stopped an operand for a while (left
alone). Only our own values are ever removed, and the result is a fixed point: applying
it and asking again yields no change.

As upstream, every GPU node gets every operand's deploy label whether or not the policy
enables that operand (the DaemonSet decides what runs), where the operand is eligible
(`Component.eligible`: the MIG manager's only on MIG-capable nodes), and a MIG-capable node without
`nvidia.com/mig.config` gets the policy's default layout. That label is a request, not
a mark of ours: once set, it is never changed or removed (uninstall included).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from components.keys import (
    DEPLOY_OPERANDS_LABEL,
    FALSE,
    GPU_PRESENT_LABEL,
    MIG_CONFIG_LABEL,
    PAUSED_PREFIX,
    TRUE,
)
from components.keys import is_gpu_node as is_gpu_node
from components.keys import is_mig_capable as is_mig_capable
from components.registry import DEPLOY_LABELS, eligible_deploy_labels
from crd import ClusterPolicySpec

LabelChanges = dict[str, str | None]
"""Label key to new value, or None to remove it."""


def wanted_deploy_labels(labels: Mapping[str, str], spec: ClusterPolicySpec | None) -> set[str]:
    """Deploy labels that should be `true` on this node (before respecting user values):
    on a GPU node those of every operand it is eligible for, none elsewhere."""
    if spec is None or not is_gpu_node(labels) or labels.get(DEPLOY_OPERANDS_LABEL) == FALSE:
        return set()
    return eligible_deploy_labels(labels)


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
