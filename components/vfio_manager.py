"""vfio-manager: binds every GPU of a vm-passthrough node to vfio-pci, for VMs.

Its driver manager init container first unloads the NVIDIA data-centre driver (nothing
may hold the GPUs when they change driver); the manager then binds them all and stays
up, and unbinds them when its pod stops (the node turning back to containers), so the
data-centre driver can take them again.
"""

from __future__ import annotations

from typing import Any

from components._accounts import CLUSTER_VERSION_RULE, SCC_RULE
from components._host_paths import HOST_ROOT_MOUNT, RUN_NVIDIA, host_path, mount
from components._k8s import env, pull_secrets
from components._sandbox import (
    MANAGER_RESOURCES,
    Operand,
    driver_manager_init_container,
    operand_container,
    operand_objects,
    sandbox_enabled,
)
from components.component import PASSTHROUGH_ONLY, Component, Permissions
from components.context import Manifest, RenderContext
from components.keys import DEPLOY_VFIO_MANAGER_LABEL
from components.kinds import CLUSTER_RBAC, DAEMONSET, NAMESPACED_RBAC
from crd import ClusterPolicySpec, component_image

NAME = "vfio-manager"
DAEMONSET_NAME = "nvidia-vfio-manager"
SERVICE_ACCOUNT = "nvidia-vfio-manager"
CONTAINER_NAME = "nvidia-vfio-manager"
SELECTOR_KEY = "name"
"""Upstream's DaemonSet selects its pods by `name` (selectors are immutable)."""
BIND = "vfio-manage bind --all && while true; do sleep 86400; done"
UNBIND = "vfio-manage unbind --all"

_CLUSTER_RULES = [
    CLUSTER_VERSION_RULE,
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch", "watch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
]
"""The driver manager labels its node and may evict GPU pods before the unload."""


def enabled(spec: ClusterPolicySpec) -> bool:
    return sandbox_enabled(spec) and spec.vfio_manager.enabled


_OPERAND = Operand(
    NAME, DAEMONSET_NAME, SERVICE_ACCOUNT, DEPLOY_VFIO_MANAGER_LABEL, [SCC_RULE], _CLUSTER_RULES
)


def render(spec: ClusterPolicySpec, ctx: RenderContext) -> list[Manifest]:
    manager = spec.vfio_manager
    main = operand_container(
        CONTAINER_NAME,
        component_image(spec, "vfioManager"),
        manager,
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
    pod: dict[str, Any] = {
        "initContainers": [
            driver_manager_init_container(
                spec, "vfioManager.driverManager", manager.driver_manager, manager
            )
        ],
        "containers": [main],
        "imagePullSecrets": pull_secrets(
            manager.image_pull_secrets,
            manager.driver_manager.image_pull_secrets if manager.driver_manager else None,
        ),
        "volumes": [
            host_path("host-sys", "/sys", "Directory"),
            host_path("host-lib-modules", "/lib/modules", "Directory"),
            host_path("run-nvidia", RUN_NVIDIA, "DirectoryOrCreate"),
            host_path("host-root", spec.host_paths.root_fs),
        ],
    }
    return operand_objects(spec, ctx, manager, pod, _OPERAND, selector_key=SELECTOR_KEY)


COMPONENT = Component(
    name=NAME,
    deploy_label=DEPLOY_VFIO_MANAGER_LABEL,
    is_enabled=enabled,
    render=render,
    kinds=(*NAMESPACED_RBAC, *CLUSTER_RBAC, DAEMONSET),
    permissions=Permissions(role=(SCC_RULE,), cluster=tuple(_CLUSTER_RULES)),
    placement=PASSTHROUGH_ONLY,
)
