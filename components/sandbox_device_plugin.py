"""sandbox-device-plugin: advertises a VM host's GPUs to KubeVirt (mode `kubevirt`).

On vm-passthrough nodes it offers the vfio-pci-bound GPUs, on vm-vgpu nodes the vGPU
devices; its init containers hold it until the sandbox validator has found them ready
(the check for the other workload is skipped). Its CDI specs go to /var/run/cdi.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from components._accounts import CLUSTER_VERSION_RULE, SCC_RULE
from components._host_paths import host_path, kubelet_path, mount, validations_volume
from components._k8s import field_env, pull_secrets
from components._sandbox import (
    VGPU_DEVICES_READY,
    Operand,
    operand_container,
    operand_objects,
    sandbox_enabled,
    vfio_pci_wait,
    workload_wait,
)
from components.component import VM_HOSTS, Component, Permissions, Placement
from components.context import Manifest, RenderContext
from components.keys import DEPLOY_SANDBOX_DEVICE_PLUGIN_LABEL, KUBEVIRT_MODE
from components.kinds import CLUSTER_RBAC, DAEMONSET, NAMESPACED_RBAC
from crd import ClusterPolicySpec, ComponentSpec, component_image

NAME = "sandbox-device-plugin"
DAEMONSET_NAME = "nvidia-sandbox-device-plugin-daemonset"
SERVICE_ACCOUNT = "nvidia-sandbox-device-plugin"
CONTAINER_NAME = "nvidia-sandbox-device-plugin-ctr"
KUBELET_PLUGINS_DIR = "/var/lib/kubelet/device-plugins"
CDI_ROOT = "/var/run/cdi"

ROLE_RULES = [
    SCC_RULE,
    {
        "apiGroups": [""],
        "resources": ["pods"],
        "verbs": ["create", "get", "list", "watch", "delete"],
    },
    {
        "apiGroups": ["nfd.k8s-sigs.io"],
        "resources": ["nodefeatures"],
        "verbs": ["create", "get", "list", "watch", "update"],
    },
]
"""Both sandbox device plugins publish their devices as NFD NodeFeatures."""
CLUSTER_RULES = [
    CLUSTER_VERSION_RULE,
    {"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["get"]},
]

PLACEMENT = Placement(VM_HOSTS.workloads, passthrough_mode=KUBEVIRT_MODE)
"""Every vm-vgpu node; vm-passthrough nodes only in mode kubevirt (Kata has its own)."""


def enabled(spec: ClusterPolicySpec) -> bool:
    return (
        sandbox_enabled(spec)
        and spec.sandbox_device_plugin.enabled
        and spec.sandbox_workloads.mode == KUBEVIRT_MODE
    )


_OPERAND = Operand(
    NAME,
    DAEMONSET_NAME,
    SERVICE_ACCOUNT,
    DEPLOY_SANDBOX_DEVICE_PLUGIN_LABEL,
    ROLE_RULES,
    CLUSTER_RULES,
)


def render(spec: ClusterPolicySpec, ctx: RenderContext) -> list[Manifest]:
    plugin = spec.sandbox_device_plugin
    main = operand_container(
        CONTAINER_NAME,
        component_image(spec, "sandboxDevicePlugin"),
        plugin,
        env_vars=[
            field_env("NODE_NAME", "spec.nodeName"),
            field_env("POD_NAMESPACE", "metadata.namespace"),
        ],
        mounts=[
            mount("device-plugin", KUBELET_PLUGINS_DIR),
            mount("vfio", "/dev/vfio"),
            mount("cdi-root", CDI_ROOT),
        ],
    )
    vgpu_wait = workload_wait(
        ctx,
        "vgpu-devices-validation",
        "vm-vgpu",
        VGPU_DEVICES_READY,
        "vgpu-devices not needed",
        "waiting for vGPU devices...",
    )
    pod = plugin_pod(
        spec, plugin, main, [vfio_pci_wait(ctx), vgpu_wait], [host_path("vfio", "/dev/vfio")]
    )
    return operand_objects(spec, ctx, plugin, pod, _OPERAND)


def plugin_pod(
    spec: ClusterPolicySpec,
    plugin: ComponentSpec,
    main: dict[str, Any],
    waits: list[dict[str, Any]],
    devices: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """The pod of a sandbox device plugin (this one or Kata's): `main` once `waits` have
    seen the node's GPUs ready for VMs, with the kubelet's device plugin socket folder,
    the validations' status files, the host's `devices` and its CDI specs mounted (the
    waits run the operator image: `daemonset` adds their pull keys)."""
    return {
        "initContainers": waits,
        "containers": [main],
        "imagePullSecrets": pull_secrets(plugin.image_pull_secrets),
        "volumes": [
            host_path("device-plugin", kubelet_path(spec, "device-plugins")),
            validations_volume(),
            *devices,
            host_path("cdi-root", CDI_ROOT, "DirectoryOrCreate"),
        ],
    }


COMPONENT = Component(
    name=NAME,
    deploy_label=DEPLOY_SANDBOX_DEVICE_PLUGIN_LABEL,
    is_enabled=enabled,
    render=render,
    kinds=(*NAMESPACED_RBAC, *CLUSTER_RBAC, DAEMONSET),
    permissions=Permissions(role=tuple(ROLE_RULES), cluster=tuple(CLUSTER_RULES)),
    placement=PLACEMENT,
)
