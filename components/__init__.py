"""Pure operand definitions: target nodes, desired objects, readiness. No I/O.

Each operand is a `Component` listed once in `COMPONENTS` (components/registry.py); the
rollout order, deploy labels, owned kinds and operand permissions are derived from that
list. The controller asks this package what each operand should have (`Component.objects`),
which labels a node should carry (`node_label_changes`, for the workload `node_workload`
reads), whether an object must be written (`needs_apply` on `with_hash` output) and
whether a component is rolled out (`daemonset_ready`, `component_ready`).
"""

from components._k8s import (
    APP_LABEL,
    COMPONENT_LABEL,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    PART_OF,
    PART_OF_LABEL,
)
from components.component import Component, ObjectKind, Permissions
from components.context import Manifest, NodeFacts, RenderContext, node_facts
from components.hashing import (
    HASH_ANNOTATION,
    applied_hash,
    manifest_hash,
    needs_apply,
    with_hash,
)
from components.keys import (
    DEPLOY_DCGM_EXPORTER_LABEL,
    DEPLOY_DCGM_LABEL,
    DEPLOY_DEVICE_PLUGIN_LABEL,
    DEPLOY_DRIVER_LABEL,
    DEPLOY_GFD_LABEL,
    DEPLOY_LABEL_PREFIX,
    DEPLOY_MIG_MANAGER_LABEL,
    DEPLOY_NODE_STATUS_EXPORTER_LABEL,
    DEPLOY_OPERANDS_LABEL,
    DEPLOY_TOOLKIT_LABEL,
    DEPLOY_VALIDATOR_LABEL,
    DEVICE_PLUGIN_CONFIG_LABEL,
    GPU_PRESENT_LABEL,
    MIG_CAPABLE_LABEL,
    MPS_CAPABLE_LABEL,
    NFD_GPU_LABELS,
    PAUSED_PREFIX,
    WORKLOAD_CONFIG_LABEL,
    WORKLOADS,
)
from components.labels import (
    LabelChanges,
    NodeWorkload,
    any_mig_capable,
    apply_label_changes,
    is_gpu_node,
    is_mig_capable,
    nfd_labels_away,
    node_label_changes,
    node_workload,
    wanted_deploy_labels,
)
from components.readiness import component_ready, daemonset_ready
from components.registry import (
    COMPONENTS,
    DEPLOY_LABELS,
    OWNED_KINDS,
    ROLLOUT_ORDER,
    component_by_name,
    desired_objects,
    enabled_components,
)

__all__ = [
    "APP_LABEL",
    "COMPONENTS",
    "COMPONENT_LABEL",
    "DEPLOY_DCGM_EXPORTER_LABEL",
    "DEPLOY_DCGM_LABEL",
    "DEPLOY_DEVICE_PLUGIN_LABEL",
    "DEPLOY_DRIVER_LABEL",
    "DEPLOY_GFD_LABEL",
    "DEPLOY_LABELS",
    "DEPLOY_LABEL_PREFIX",
    "DEPLOY_MIG_MANAGER_LABEL",
    "DEPLOY_NODE_STATUS_EXPORTER_LABEL",
    "DEPLOY_OPERANDS_LABEL",
    "DEPLOY_TOOLKIT_LABEL",
    "DEPLOY_VALIDATOR_LABEL",
    "DEVICE_PLUGIN_CONFIG_LABEL",
    "GPU_PRESENT_LABEL",
    "HASH_ANNOTATION",
    "MANAGED_BY",
    "MANAGED_BY_LABEL",
    "MIG_CAPABLE_LABEL",
    "MPS_CAPABLE_LABEL",
    "NFD_GPU_LABELS",
    "OWNED_KINDS",
    "PART_OF",
    "PART_OF_LABEL",
    "PAUSED_PREFIX",
    "ROLLOUT_ORDER",
    "WORKLOADS",
    "WORKLOAD_CONFIG_LABEL",
    "Component",
    "LabelChanges",
    "Manifest",
    "NodeFacts",
    "NodeWorkload",
    "ObjectKind",
    "Permissions",
    "RenderContext",
    "any_mig_capable",
    "applied_hash",
    "apply_label_changes",
    "component_by_name",
    "component_ready",
    "daemonset_ready",
    "desired_objects",
    "enabled_components",
    "is_gpu_node",
    "is_mig_capable",
    "manifest_hash",
    "needs_apply",
    "nfd_labels_away",
    "node_facts",
    "node_label_changes",
    "node_workload",
    "wanted_deploy_labels",
    "with_hash",
]
