"""kata-device-plugin: advertises a vm-passthrough node's GPUs to Kata containers (mode
`kata`), once every GPU is bound to vfio-pci; with CDI specs in /var/run/cdi.
"""

from __future__ import annotations

from components._host_paths import mount
from components._k8s import field_env
from components._sandbox import (
    Operand,
    operand_container,
    operand_objects,
    sandbox_enabled,
    vfio_pci_wait,
)
from components.component import PASSTHROUGH_ONLY, Component, Permissions, Placement
from components.context import Manifest, RenderContext
from components.keys import DEPLOY_KATA_DEVICE_PLUGIN_LABEL, KATA_MODE
from components.kinds import CLUSTER_RBAC, DAEMONSET, NAMESPACED_RBAC
from components.sandbox_device_plugin import (
    CDI_ROOT,
    CLUSTER_RULES,
    KUBELET_PLUGINS_DIR,
    ROLE_RULES,
    plugin_pod,
)
from crd import ClusterPolicySpec, component_image

NAME = "kata-device-plugin"
DAEMONSET_NAME = "nvidia-kata-sandbox-device-plugin-daemonset"
SERVICE_ACCOUNT = "nvidia-kata-sandbox-device-plugin"
CONTAINER_NAME = "nvidia-kata-sandbox-device-plugin-ctr"

PLACEMENT = Placement(PASSTHROUGH_ONLY.workloads, passthrough_mode=KATA_MODE)


def enabled(spec: ClusterPolicySpec) -> bool:
    return (
        sandbox_enabled(spec)
        and spec.kata_sandbox_device_plugin.enabled
        and spec.sandbox_workloads.mode == KATA_MODE
    )


_OPERAND = Operand(
    NAME,
    DAEMONSET_NAME,
    SERVICE_ACCOUNT,
    DEPLOY_KATA_DEVICE_PLUGIN_LABEL,
    ROLE_RULES,
    CLUSTER_RULES,
)


def render(spec: ClusterPolicySpec, ctx: RenderContext) -> list[Manifest]:
    plugin = spec.kata_sandbox_device_plugin
    main = operand_container(
        CONTAINER_NAME,
        component_image(spec, "kataSandboxDevicePlugin"),
        plugin,
        env_vars=[
            field_env("NODE_NAME", "spec.nodeName"),
            field_env("POD_NAMESPACE", "metadata.namespace"),
            field_env("POD_SERVICE_ACCOUNT", "spec.serviceAccountName"),
        ],
        mounts=[mount("device-plugin", KUBELET_PLUGINS_DIR), mount("cdi-root", CDI_ROOT)],
    )
    pod = plugin_pod(spec, plugin, main, [vfio_pci_wait(ctx, skip="kata not needed")])
    return operand_objects(spec, ctx, plugin, pod, _OPERAND)


COMPONENT = Component(
    name=NAME,
    deploy_label=DEPLOY_KATA_DEVICE_PLUGIN_LABEL,
    is_enabled=enabled,
    render=render,
    kinds=(*NAMESPACED_RBAC, *CLUSTER_RBAC, DAEMONSET),
    permissions=Permissions(role=tuple(ROLE_RULES), cluster=tuple(CLUSTER_RULES)),
    placement=PLACEMENT,
)
