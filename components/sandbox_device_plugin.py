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
from components._k8s import field_env
from components._sandbox import (
    VGPU_DEVICES_READY,
    operand_container,
    sandbox_switch,
    vfio_pci_wait,
    workload_wait,
)
from components.component import VM_HOSTS, Placement, rule
from components.context import RenderContext
from components.keys import DEPLOY_SANDBOX_DEVICE_PLUGIN_LABEL, KUBEVIRT_MODE
from components.operand import Operand, Pod
from crd import ClusterPolicySpec

NAME = "sandbox-device-plugin"
DAEMONSET_NAME = "nvidia-sandbox-device-plugin-daemonset"
SECTION = "sandboxDevicePlugin"
CONTAINER_NAME = "nvidia-sandbox-device-plugin-ctr"
KUBELET_PLUGINS_DIR = "/var/lib/kubelet/device-plugins"
CDI_ROOT = "/var/run/cdi"

ROLE_RULES = (
    SCC_RULE,
    rule("", "pods", "create get list watch delete"),
    rule("nfd.k8s-sigs.io", "nodefeatures", "create get list watch update"),
)
"""Both sandbox device plugins publish their devices as NFD NodeFeatures."""
CLUSTER_RULES = (
    CLUSTER_VERSION_RULE,
    rule("", "nodes pods", "get"),
)


def pod(spec: ClusterPolicySpec, ctx: RenderContext) -> Pod:
    main = operand_container(
        CONTAINER_NAME,
        spec,
        SECTION,
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
    waits = [vfio_pci_wait(ctx), vgpu_wait]
    return plugin_pod(spec, main, waits, [host_path("vfio", "/dev/vfio")])


def plugin_pod(
    spec: ClusterPolicySpec,
    main: dict[str, Any],
    waits: list[dict[str, Any]],
    devices: Sequence[dict[str, Any]] = (),
) -> Pod:
    """The pod of a sandbox device plugin (this one or Kata's): `main` once `waits` have
    seen the node's GPUs ready for VMs, with the kubelet's device plugin socket folder,
    the validations' status files, the host's `devices` and its CDI specs mounted (the
    waits run the operator image: `daemonset` adds their pull keys)."""
    volumes = [
        host_path("device-plugin", kubelet_path(spec, "device-plugins")),
        validations_volume(),
        *devices,
        host_path("cdi-root", CDI_ROOT, "DirectoryOrCreate"),
    ]
    return Pod(containers=[main], init=waits, volumes=volumes)


OPERAND = Operand(
    name=NAME,
    section=SECTION,
    daemonset=DAEMONSET_NAME,
    deploy_label=DEPLOY_SANDBOX_DEVICE_PLUGIN_LABEL,
    pod=pod,
    enabled=sandbox_switch(SECTION, KUBEVIRT_MODE),
    # Every vm-vgpu node; vm-passthrough nodes only in mode kubevirt (Kata has its own).
    placement=Placement(VM_HOSTS.workloads, passthrough_mode=KUBEVIRT_MODE),
    role=ROLE_RULES,
    cluster=CLUSTER_RULES,
)
COMPONENT = OPERAND.component()
