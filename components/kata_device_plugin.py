"""kata-device-plugin: advertises a vm-passthrough node's GPUs to Kata containers (mode
`kata`), once every GPU is bound to vfio-pci; with CDI specs in /var/run/cdi.
"""

from __future__ import annotations

from components._host_paths import mount
from components._k8s import field_env
from components._sandbox import operand_container, sandbox_switch, vfio_pci_wait
from components.component import PASSTHROUGH_ONLY, Placement
from components.context import RenderContext
from components.keys import DEPLOY_KATA_DEVICE_PLUGIN_LABEL, KATA_MODE
from components.operand import Operand, Pod
from components.sandbox_device_plugin import (
    CDI_ROOT,
    CLUSTER_RULES,
    KUBELET_PLUGINS_DIR,
    ROLE_RULES,
    plugin_pod,
)
from crd import ClusterPolicySpec

NAME = "kata-device-plugin"
DAEMONSET_NAME = "nvidia-kata-sandbox-device-plugin-daemonset"
SECTION = "kataSandboxDevicePlugin"
CONTAINER_NAME = "nvidia-kata-sandbox-device-plugin-ctr"


def pod(spec: ClusterPolicySpec, ctx: RenderContext) -> Pod:
    main = operand_container(
        CONTAINER_NAME,
        spec,
        SECTION,
        env_vars=[
            field_env("NODE_NAME", "spec.nodeName"),
            field_env("POD_NAMESPACE", "metadata.namespace"),
            field_env("POD_SERVICE_ACCOUNT", "spec.serviceAccountName"),
        ],
        mounts=[mount("device-plugin", KUBELET_PLUGINS_DIR), mount("cdi-root", CDI_ROOT)],
    )
    return plugin_pod(spec, main, [vfio_pci_wait(ctx, skip="kata not needed")])


OPERAND = Operand(
    name=NAME,
    section=SECTION,
    daemonset=DAEMONSET_NAME,
    deploy_label=DEPLOY_KATA_DEVICE_PLUGIN_LABEL,
    pod=pod,
    enabled=sandbox_switch(SECTION, KATA_MODE),
    placement=Placement(PASSTHROUGH_ONLY.workloads, passthrough_mode=KATA_MODE),
    role=ROLE_RULES,
    cluster=CLUSTER_RULES,
)
COMPONENT = OPERAND.component()
