"""vgpu-device-manager: creates the vGPU devices of vm-vgpu nodes once the vGPU manager
(ours or a host-installed one) is up.

Which layout a node gets is its `nvidia.com/vgpu.config` label, else
`vgpuDeviceManager.config.default`; the layouts come from the policy's ConfigMap
(`vgpuDeviceManager.config.name`) or our `default-vgpu-devices-config`, rendered only
where the policy names none. It reads and updates its Node (the label, its state).
"""

from __future__ import annotations

from typing import Any

from components import vgpu_layouts
from components._accounts import CLUSTER_VERSION_RULE, SCC_RULE
from components._host_paths import (
    HOST_ROOT_MOUNT,
    VALIDATIONS_DIR,
    host_path,
    mount,
    validations_volume,
)
from components._k8s import (
    env,
    field_env,
    metadata,
    pull_secrets,
)
from components._sandbox import (
    Operand,
    operand_container,
    operand_objects,
    sandbox_enabled,
    validations_container,
)
from components.component import VGPU_ONLY, Component, Permissions
from components.context import Manifest, RenderContext
from components.keys import DEPLOY_VGPU_DEVICE_MANAGER_LABEL
from components.kinds import CLUSTER_RBAC, CONFIG_MAP, DAEMONSET, NAMESPACED_RBAC
from crd import ClusterPolicySpec, component_image

NAME = "vgpu-device-manager"
DAEMONSET_NAME = "nvidia-vgpu-device-manager"
SERVICE_ACCOUNT = "nvidia-vgpu-device-manager"
CONTAINER_NAME = "nvidia-vgpu-device-manager"
DEFAULT_CONFIG_MAP = "default-vgpu-devices-config"
CONFIG_DIR = "/vgpu-config"
VGPU_MANAGER_READY = f"{VALIDATIONS_DIR}/vgpu-manager-ready"
HOST_VGPU_MANAGER_READY = f"{VALIDATIONS_DIR}/host-vgpu-manager-ready"
"""The sandbox validator's: the vGPU manager runs (ours, or one installed on the host)."""

_ROLE_RULES = [
    SCC_RULE,
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
]
_CLUSTER_RULES = [
    CLUSTER_VERSION_RULE,
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "update"]},
]
"""It watches its node's `nvidia.com/vgpu.config` and records its state on the node."""


def enabled(spec: ClusterPolicySpec) -> bool:
    return sandbox_enabled(spec) and spec.vgpu_device_manager.enabled


def config_map_name(spec: ClusterPolicySpec) -> str | None:
    """The policy's own layouts ConfigMap; None: ours (`default-vgpu-devices-config`)."""
    config = spec.vgpu_device_manager.config
    return config.name if config and config.name else None


def default_layout(spec: ClusterPolicySpec) -> str:
    config = spec.vgpu_device_manager.config
    return config.default if config and config.default else vgpu_layouts.DEFAULT_LAYOUT


def _wait_for_vgpu_manager(ctx: RenderContext) -> dict[str, Any]:
    script = (
        f"until [ -f {VGPU_MANAGER_READY} ] || [ -f {HOST_VGPU_MANAGER_READY} ]; do echo"
        " waiting for NVIDIA vGPU Manager to be setup; sleep 5; done"
    )
    return validations_container(
        ctx, "vgpu-manager-validation", script, propagation="Bidirectional"
    )


_OPERAND = Operand(
    NAME,
    DAEMONSET_NAME,
    SERVICE_ACCOUNT,
    DEPLOY_VGPU_DEVICE_MANAGER_LABEL,
    _ROLE_RULES,
    _CLUSTER_RULES,
)


def render(spec: ClusterPolicySpec, ctx: RenderContext) -> list[Manifest]:
    manager = spec.vgpu_device_manager
    main = operand_container(
        CONTAINER_NAME,
        component_image(spec, "vgpuDeviceManager"),
        manager,
        env_vars=[
            field_env("NAMESPACE", "metadata.namespace"),
            field_env("NODE_NAME", "spec.nodeName"),
            env("CONFIG_FILE", f"{CONFIG_DIR}/config.yaml"),
            env("DEFAULT_VGPU_CONFIG", default_layout(spec)),
        ],
        mounts=[
            mount("vgpu-config", CONFIG_DIR),
            mount("host-sys", "/sys"),
            mount("host-root", HOST_ROOT_MOUNT, propagation="HostToContainer"),
            mount("driver-install-dir", "/driver-root", propagation="HostToContainer"),
        ],
    )
    pod: dict[str, Any] = {
        "initContainers": [_wait_for_vgpu_manager(ctx)],
        "containers": [main],
        "imagePullSecrets": pull_secrets(manager.image_pull_secrets),
        "volumes": [
            {
                "name": "vgpu-config",
                "configMap": {"name": config_map_name(spec) or DEFAULT_CONFIG_MAP},
            },
            host_path("host-sys", "/sys", "Directory"),
            host_path("host-root", spec.host_paths.root_fs),
            host_path(
                "driver-install-dir", spec.host_paths.driver_install_dir, "DirectoryOrCreate"
            ),
            validations_volume(),
        ],
    }
    defaults: list[Manifest] = []
    if config_map_name(spec) is None:
        defaults.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": metadata(DEFAULT_CONFIG_MAP, NAME, spec, ctx),
                "data": {"config.yaml": _LAYOUTS},
            }
        )
    return operand_objects(spec, ctx, manager, pod, _OPERAND, extra=defaults)


_LAYOUTS = vgpu_layouts.config_yaml()

COMPONENT = Component(
    name=NAME,
    deploy_label=DEPLOY_VGPU_DEVICE_MANAGER_LABEL,
    is_enabled=enabled,
    render=render,
    kinds=(*NAMESPACED_RBAC, *CLUSTER_RBAC, CONFIG_MAP, DAEMONSET),
    permissions=Permissions(role=tuple(_ROLE_RULES), cluster=tuple(_CLUSTER_RULES)),
    placement=VGPU_ONLY,
)
