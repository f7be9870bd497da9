"""vfio-manager: binds every GPU of a vm-passthrough node to vfio-pci, for VMs.

Its driver manager init container first unloads the NVIDIA data-centre driver (nothing
may hold the GPUs when they change driver); the manager then binds them all and stays
up, and unbinds them when its pod stops (the node turning back to containers), so the
data-centre driver can take them again.
"""

from __future__ import annotations

from components._accounts import CLUSTER_VERSION_RULE
from components._host_paths import HOST_ROOT_MOUNT, RUN_NVIDIA, host_path, host_root_volume, mount
from components._k8s import env
from components._sandbox import (
    DRIVER_MANAGER_RULES,
    MANAGER_RESOURCES,
    driver_manager_init_container,
    driver_manager_secrets,
    operand_container,
    sandbox_switch,
)
from components.component import PASSTHROUGH_ONLY
from components.context import RenderContext
from components.keys import DEPLOY_VFIO_MANAGER_LABEL
from components.operand import Operand, Pod
from crd import ClusterPolicySpec

NAME = "vfio-manager"
DAEMONSET_NAME = "nvidia-vfio-manager"
SECTION = "vfioManager"
CONTAINER_NAME = "nvidia-vfio-manager"
BIND = "vfio-manage bind --all && while true; do sleep 86400; done"
UNBIND = "vfio-manage unbind --all"


def pod(spec: ClusterPolicySpec, _ctx: RenderContext) -> Pod:
    manager = spec.vfio_manager
    main = operand_container(
        CONTAINER_NAME,
        spec,
        SECTION,
        command=["/bin/sh", "-c"],
        args=[BIND],
        default_resources=MANAGER_RESOURCES,
        env_vars=[env("HOST_ROOT", HOST_ROOT_MOUNT)],
        mounts=[
            mount("host-sys", "/sys"),
            mount("host-lib-modules", "/lib/modules", read_only=True),
            mount("host-root", HOST_ROOT_MOUNT),
        ],
        selinux_s0=True,
        extra={"lifecycle": {"preStop": {"exec": {"command": ["/bin/sh", "-c", UNBIND]}}}},
    )
    init = driver_manager_init_container(spec, f"{SECTION}.driverManager", manager)
    return Pod(
        containers=[main],
        init=[init],
        volumes=[
            host_path("host-sys", "/sys", "Directory"),
            host_path("host-lib-modules", "/lib/modules", "Directory"),
            host_path("run-nvidia", RUN_NVIDIA, "DirectoryOrCreate"),
            host_root_volume(spec),
        ],
        pull_secrets=driver_manager_secrets(manager),
    )


OPERAND = Operand(
    name=NAME,
    section=SECTION,
    daemonset=DAEMONSET_NAME,
    deploy_label=DEPLOY_VFIO_MANAGER_LABEL,
    pod=pod,
    enabled=sandbox_switch(SECTION),
    placement=PASSTHROUGH_ONLY,
    # The driver manager labels its node and may evict GPU pods before the unload.
    cluster=(CLUSTER_VERSION_RULE, *DRIVER_MANAGER_RULES),
    selector_key="name",  # upstream's DaemonSet selects its pods by `name` (immutable)
)
COMPONENT = OPERAND.component()
