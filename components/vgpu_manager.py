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

from components._accounts import CLUSTER_VERSION_RULE
from components._host_paths import RUN_NVIDIA, host_path, host_root_volume, mount
from components._sandbox import (
    DRIVER_MANAGER_RULES,
    driver_manager_init_container,
    driver_manager_secrets,
    operand_container,
    sandbox_switch,
)
from components.component import VGPU_ONLY, rule
from components.context import RenderContext
from components.driver_config import kernel_module_mounts
from components.driver_sidecars import with_os_tag
from components.keys import DEPLOY_VGPU_MANAGER_LABEL
from components.operand import Operand, Pod
from crd import ClusterPolicySpec, component_image

NAME = "vgpu-manager"
DAEMONSET_NAME = "nvidia-vgpu-manager-daemonset"
SECTION = "vgpuManager"
CONTAINER_NAME = "nvidia-vgpu-manager-ctr"
GRACE_PERIOD = 120


def image(spec: ClusterPolicySpec, ctx: RenderContext) -> str:
    """The vGPU manager image for the GPU nodes' OS (`595.91.07-ubuntu22.04`)."""
    return with_os_tag(component_image(spec, SECTION), ctx.os_tag)


def pod(spec: ClusterPolicySpec, ctx: RenderContext) -> Pod:
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
        host_root_volume(spec),
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
        spec,
        SECTION,
        image=image(spec, ctx),
        command=["nvidia-driver"],
        args=["init"],
        mounts=mounts,
        selinux_s0=True,
    )
    return Pod(
        containers=[main],
        init=[driver_manager_init_container(spec, f"{SECTION}.driverManager", manager)],
        volumes=volumes,
        fields={"hostPID": True, "hostIPC": True},
        annotations={"kubectl.kubernetes.io/default-container": CONTAINER_NAME},
        pull_secrets=driver_manager_secrets(manager),
    )


OPERAND = Operand(
    name=NAME,
    section=SECTION,
    daemonset=DAEMONSET_NAME,
    deploy_label=DEPLOY_VGPU_MANAGER_LABEL,
    pod=pod,
    enabled=sandbox_switch(SECTION),
    placement=VGPU_ONLY,
    cluster=(
        CLUSTER_VERSION_RULE,
        *DRIVER_MANAGER_RULES,
        rule("apps", "daemonsets", "get"),
    ),
    grace_period=GRACE_PERIOD,
)
COMPONENT = OPERAND.component()
