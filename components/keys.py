"""Node label keys and values shared by the labeller and the operand manifests.

They are upstream's spellings: users' node selectors, runbooks and other tools (MIG
manager pausing operands, GFD publishing capabilities) already rely on them.
"""

from __future__ import annotations

from collections.abc import Mapping

NFD_GPU_LABELS: tuple[str, ...] = (
    "feature.node.kubernetes.io/pci-10de.present",
    "feature.node.kubernetes.io/pci-0302_10de.present",
    "feature.node.kubernetes.io/pci-0300_10de.present",
)
"""Node Feature Discovery's PCI labels for an NVIDIA device (any class, 3D, VGA)."""

GPU_PRESENT_LABEL = "nvidia.com/gpu.present"
"""Ours: the node has an NVIDIA GPU."""

DEPLOY_LABEL_PREFIX = "nvidia.com/gpu.deploy."
"""Per-operand deploy labels: `nvidia.com/gpu.deploy.<operand>`."""

DEPLOY_OPERANDS_LABEL = "nvidia.com/gpu.deploy.operands"
"""The user's: `false` keeps every operand off the node."""

DEPLOY_DRIVER_LABEL = "nvidia.com/gpu.deploy.driver"
DEPLOY_TOOLKIT_LABEL = "nvidia.com/gpu.deploy.container-toolkit"
DEPLOY_DEVICE_PLUGIN_LABEL = "nvidia.com/gpu.deploy.device-plugin"
DEPLOY_DCGM_LABEL = "nvidia.com/gpu.deploy.dcgm"
DEPLOY_DCGM_EXPORTER_LABEL = "nvidia.com/gpu.deploy.dcgm-exporter"
DEPLOY_GFD_LABEL = "nvidia.com/gpu.deploy.gpu-feature-discovery"
DEPLOY_MIG_MANAGER_LABEL = "nvidia.com/gpu.deploy.mig-manager"
DEPLOY_NODE_STATUS_EXPORTER_LABEL = "nvidia.com/gpu.deploy.node-status-exporter"
DEPLOY_VALIDATOR_LABEL = "nvidia.com/gpu.deploy.operator-validator"
DEPLOY_CLIENT_LABEL = "nvidia.com/gpu.deploy.client"
"""Set with the operands' labels, as upstream does; selects GPU clients run on the node's
behalf. No operand of ours owns it (see `components.registry.DEPLOY_LABELS`)."""

MIG_CAPABLE_LABEL = "nvidia.com/mig.capable"
"""Set by GPU feature discovery: `true` on nodes whose GPUs support MIG."""

MIG_CONFIG_LABEL = "nvidia.com/mig.config"
"""The MIG layout a node should have; the MIG manager applies it. We set the policy's
default (`migManager.config.default`) where it is missing; any value present is kept."""

MPS_CAPABLE_LABEL = "nvidia.com/mps.capable"
"""Set by the device plugin when its configuration asks for MPS sharing."""

DEVICE_PLUGIN_CONFIG_LABEL = "nvidia.com/device-plugin.config"
"""The user's: which device plugin configuration (ConfigMap key) a node uses."""

TRUE = "true"
FALSE = "false"
PAUSED_PREFIX = "paused-for-"
"""Deploy label values another component set to stop an operand for a while."""

TAINT_KEY = "nvidia.com/gpu.health"
TAINT_VALUE = "unhealthy"
TAINT_EFFECT = "NoSchedule"
"""The taint a node quarantined by GPU health remediation carries (`key=value:effect`);
every operand tolerates it."""


def is_gpu_node(labels: Mapping[str, str]) -> bool:
    """NFD found an NVIDIA PCI device on the node."""
    return any(labels.get(key) == TRUE for key in NFD_GPU_LABELS)


def is_mig_capable(labels: Mapping[str, str]) -> bool:
    """GPU feature discovery reported MIG support."""
    return labels.get(MIG_CAPABLE_LABEL) == TRUE
