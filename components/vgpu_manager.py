"""vgpu-manager: the NVIDIA vGPU host driver on vm-vgpu nodes, one pod per node.

Driver-like: the image (built by the user from NVIDIA's licensed vGPU host driver, so
there is no default) is tagged with the nodes' OS as the driver's is, and the driver
manager init container first unloads a data-centre driver the node may still run. Its
pods see `/dev/vfio` and the cgroup tree (vGPUs are VFIO devices handed to VMs), and
get 120 s to unload the host driver when stopped. A `kernelModuleConfig` ConfigMap's
files (module parameters) are mounted into /drivers as the driver's are; while that
ConfigMap does not exist the manager starts with the default parameters.
"""

from __future__ import annotations

from typing import Any

from components._accounts import CLUSTER_VERSION_RULE, SCC_RULE
from components._host_paths import RUN_NVIDIA, host_path, mount
from components._k8s import pull_secrets
from components._sandbox import (
    Operand,
    driver_manager_init_container,
    operand_container,
    operand_objects,
    sandbox_enabled,
)
from components.component import VGPU_ONLY, Component, Permissions
from components.context import Manifest, RenderContext
from components.driver_config import kernel_module_mounts
from components.driver_sidecars import with_os_tag
from components.keys import DEPLOY_VGPU_MANAGER_LABEL
from components.kinds import CLUSTER_RBAC, DAEMONSET, NAMESPACED_RBAC
from crd import ClusterPolicySpec, component_image

NAME = "vgpu-manager"
DAEMONSET_NAME = "nvidia-vgpu-manager-daemonset"
SERVICE_ACCOUNT = "nvidia-vgpu-manager"
CONTAINER_NAME = "nvidia-vgpu-manager-ctr"
GRACE_PERIOD = 120

_CLUSTER_RULES = [
    CLUSTER_VERSION_RULE,
    {
        "apiGroups": [""],
        "resources": ["nodes"],
        "verbs": ["get", "list", "patch", "watch"],
    },
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
    {"apiGroups": ["apps"], "resources": ["daemonsets"], "verbs": ["get"]},
]
"""The driver manager labels its node and may evict GPU pods before an unload."""


def enabled(spec: ClusterPolicySpec) -> bool:
    return sandbox_enabled(spec) and spec.vgpu_manager.enabled


def image(spec: ClusterPolicySpec, ctx: RenderContext) -> str:
    """The vGPU manager image for the GPU nodes' OS (`595.91.07-ubuntu22.04`)."""
    return with_os_tag(component_image(spec, "vgpuManager"), ctx.os_tag)


_OPERAND = Operand(
    NAME, DAEMONSET_NAME, SERVICE_ACCOUNT, DEPLOY_VGPU_MANAGER_LABEL, [SCC_RULE], _CLUSTER_RULES
)


def render(spec: ClusterPolicySpec, ctx: RenderContext) -> list[Manifest]:
    manager = spec.vgpu_manager
    mounts = [
        mount("run-nvidia", RUN_NVIDIA, propagation="Bidirectional"),
        mount("host-os-release", "/host-etc/os-release"),
        mount("vfio", "/dev/vfio"),
        mount("cgroup", "/sys/fs/cgroup"),
        mount("var-log", "/var/log"),
        mount("dev-log", "/dev/log"),
        mount("firmware-search-path", "/sys/module/firmware_class/parameters/path"),
        mount("nv-firmware", "/lib/firmware"),
    ]
    volumes = [
        host_path("run-nvidia", RUN_NVIDIA, "DirectoryOrCreate"),
        host_path("host-os-release", "/etc/os-release"),
        host_path("cgroup", "/sys/fs/cgroup", "Directory"),
        host_path("vfio", "/dev/vfio", "Directory"),
        host_path("host-root", spec.host_paths.root_fs),
        host_path("host-sys", "/sys", "Directory"),
        host_path("var-log", "/var/log", "Directory"),
        host_path("dev-log", "/dev/log"),
        host_path("firmware-search-path", "/sys/module/firmware_class/parameters/path"),
        host_path("nv-firmware", "/run/nvidia/driver/lib/firmware", "DirectoryOrCreate"),
    ]
    modules = manager.kernel_module_config
    module_mounts, module_volume = kernel_module_mounts(modules.name if modules else None, ctx)
    mounts += module_mounts
    if module_volume is not None:
        volumes.append(module_volume)
    main = operand_container(
        CONTAINER_NAME,
        image(spec, ctx),
        manager,
        command=["nvidia-driver"],
        args=["init"],
        mounts=mounts,
        selinux_s0=True,
    )
    pod: dict[str, Any] = {
        "hostPID": True,
        "hostIPC": True,
        "initContainers": [
            driver_manager_init_container(
                spec, "vgpuManager.driverManager", manager.driver_manager, manager
            )
        ],
        "containers": [main],
        "imagePullSecrets": pull_secrets(
            manager.image_pull_secrets,
            manager.driver_manager.image_pull_secrets if manager.driver_manager else None,
        ),
        "volumes": volumes,
    }
    return operand_objects(
        spec,
        ctx,
        manager,
        pod,
        _OPERAND,
        pod_annotations={"kubectl.kubernetes.io/default-container": CONTAINER_NAME},
        grace_period=GRACE_PERIOD,
    )


COMPONENT = Component(
    name=NAME,
    deploy_label=DEPLOY_VGPU_MANAGER_LABEL,
    is_enabled=enabled,
    render=render,
    kinds=(*NAMESPACED_RBAC, *CLUSTER_RBAC, DAEMONSET),
    permissions=Permissions(role=(SCC_RULE,), cluster=tuple(_CLUSTER_RULES)),
    placement=VGPU_ONLY,
)
