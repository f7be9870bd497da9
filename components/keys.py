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

DEPLOY_VGPU_MANAGER_LABEL = "nvidia.com/gpu.deploy.vgpu-manager"
DEPLOY_VGPU_DEVICE_MANAGER_LABEL = "nvidia.com/gpu.deploy.vgpu-device-manager"
DEPLOY_VFIO_MANAGER_LABEL = "nvidia.com/gpu.deploy.vfio-manager"
DEPLOY_SANDBOX_VALIDATOR_LABEL = "nvidia.com/gpu.deploy.sandbox-validator"
DEPLOY_SANDBOX_DEVICE_PLUGIN_LABEL = "nvidia.com/gpu.deploy.sandbox-device-plugin"
DEPLOY_KATA_DEVICE_PLUGIN_LABEL = "nvidia.com/gpu.deploy.kata-sandbox-device-plugin"
DEPLOY_CC_MANAGER_LABEL = "nvidia.com/gpu.deploy.cc-manager"
DEPLOY_KATA_MANAGER_LABEL = "nvidia.com/gpu.deploy.kata-manager"
"""Set on vm-passthrough nodes as upstream does, though upstream deploys no Kata manager
any more (deprecated) and neither do we: Kata runtime classes may still select on it."""

WORKLOAD_CONFIG_LABEL = "nvidia.com/gpu.workload.config"
"""The user's (with `sandboxWorkloads.enabled`): what a GPU node's GPUs serve."""
CONTAINER_WORKLOAD = "container"
"""Containers on the node's own driver: the driver, toolkit, device plugin, ... stack."""
VM_PASSTHROUGH_WORKLOAD = "vm-passthrough"
"""Whole GPUs bound to vfio-pci and handed to virtual machines (KubeVirt or Kata)."""
VM_VGPU_WORKLOAD = "vm-vgpu"
"""GPUs split into vGPUs by the vGPU host driver, handed to virtual machines."""
WORKLOADS: tuple[str, ...] = (CONTAINER_WORKLOAD, VM_PASSTHROUGH_WORKLOAD, VM_VGPU_WORKLOAD)
KUBEVIRT_MODE = "kubevirt"
KATA_MODE = "kata"
"""`sandboxWorkloads.mode`: which runtime gets vm-passthrough GPUs (its device plugin)."""

VGPU_CONFIG_LABEL = "nvidia.com/vgpu.config"
"""The user's: which vGPU layout (`vgpuDeviceManager.config`) a vm-vgpu node gets; the
vGPU device manager applies `vgpuDeviceManager.config.default` where it is missing."""
CC_MODE_LABEL = "nvidia.com/cc.mode"
"""The user's: a node's confidential-computing mode; the CC manager applies
`ccManager.defaultMode` where it is missing."""

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


NFD_LABEL_PREFIX = "feature.node.kubernetes.io/"
"""Every label NFD's worker publishes for a node (kernel, OS release, PCI devices...)."""


def nfd_labels_away(labels: Mapping[str, str]) -> bool:
    """The node is ours as a GPU node (`nvidia.com/gpu.present=true`) but carries no NFD
    label at all: NFD is not labelling it just now (its uninstall's prune stripped them,
    or a new NFD has not labelled it yet), which says nothing about its GPUs.

    A node NFD does label always carries some of its labels (kernel and OS release are
    on by default), so a node NFD labels without an NVIDIA PCI device is not this: that
    is NFD saying the GPU is gone. While NFD's labels are away the node stays a GPU node
    and keeps the deploy labels it has (`components.labels.node_label_changes`), for as
    long as they stay away: nothing about a running node's GPUs changed, and taking its
    driver away would stop its GPU workloads for nothing."""
    return labels.get(GPU_PRESENT_LABEL) == TRUE and not any(
        key.startswith(NFD_LABEL_PREFIX) for key in labels
    )


def is_gpu_node(labels: Mapping[str, str]) -> bool:
    """NFD found an NVIDIA PCI device on the node, or the node was found so and NFD's
    labels are away for now (:func:`nfd_labels_away`)."""
    return any(labels.get(key) == TRUE for key in NFD_GPU_LABELS) or nfd_labels_away(labels)


def is_mig_capable(labels: Mapping[str, str]) -> bool:
    """GPU feature discovery reported MIG support; while NFD's labels are away (GFD's
    labels go through NFD and its prune strips them too), the MIG manager's deploy label
    we gave the node says it was."""
    if labels.get(MIG_CAPABLE_LABEL) == TRUE:
        return True
    return nfd_labels_away(labels) and labels.get(DEPLOY_MIG_MANAGER_LABEL) == TRUE
