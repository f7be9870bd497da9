"""mig-manager: repartitions MIG GPUs when a node's `nvidia.com/mig.config` label changes.

Rendered only while some node is MIG-capable (the context says so); its deploy label goes
only on MIG-capable nodes. With it come the default layouts (`default-mig-parted-config`,
the names `nvidia.com/mig.config` may take) and the host services to stop while GPUs are
repartitioned (`default-gpu-clients`), unless the policy names its own ConfigMaps. It
edits node labels (pausing operands while it works), hence its cluster role.
"""

from __future__ import annotations

from typing import Any

from components import mig_layouts
from components._accounts import (
    SCC_RULE,
    operand_account,
)
from components._entrypoint_operand import (
    cdi_mount,
    cdi_volume,
    driver_root_mount,
    driver_root_volume,
    entrypoint_config_map,
    entrypoint_container,
    entrypoint_script,
    entrypoint_volume,
    host_root_mount,
    host_root_volume,
)
from components._host_paths import VALIDATIONS_DIR, host_path, mount, validations_volume
from components._k8s import (
    TOOLKIT_READY,
    daemonset,
    env,
    field_env,
    gpu_access,
    metadata,
    pull_secrets,
    wait_for_file,
)
from components.component import Component, Permissions
from components.context import Manifest, RenderContext
from components.device_plugin import cdi_hook_path
from components.keys import DEPLOY_MIG_MANAGER_LABEL, TRUE, is_mig_capable
from components.kinds import CLUSTER_RBAC, CONFIG_MAP, DAEMONSET, NAMESPACED_RBAC
from crd import ClusterPolicySpec, component_image

NAME = "mig-manager"
DAEMONSET_NAME = "nvidia-mig-manager"
SERVICE_ACCOUNT = "nvidia-mig-manager"
CONTAINER_NAME = "nvidia-mig-manager"
ENTRYPOINT = "nvidia-mig-manager-entrypoint"
DEFAULT_CONFIG_MAP = "default-mig-parted-config"
DEFAULT_CLIENTS_CONFIG_MAP = "default-gpu-clients"
CONFIG_DIR = "/mig-parted-config"

_ROLE_RULES = [
    SCC_RULE,
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "delete"]},
    {
        "apiGroups": [""],
        "resources": ["configmaps"],
        "verbs": ["create", "get", "list", "update", "patch"],
    },
]
"""Restarts operand pods on its node; records layout state in ConfigMaps."""
_CLUSTER_RULES = [
    {
        "apiGroups": [""],
        "resources": ["nodes"],
        "verbs": ["get", "list", "watch", "update", "patch"],
    },
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
]


def enabled(spec: ClusterPolicySpec) -> bool:
    return spec.mig_manager.enabled


def _config_map(
    name: str, key: str, data: str, spec: ClusterPolicySpec, ctx: RenderContext
) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(name, NAME, spec, ctx),
        "data": {key: data},
    }


def render(spec: ClusterPolicySpec, ctx: RenderContext) -> list[Manifest]:
    if not ctx.mig_capable:
        return []
    mig = spec.mig_manager
    config_name = mig.config.name if mig.config and mig.config.name else None
    clients = mig.gpu_clients_config
    clients_name = clients.name if clients and clients.name else None
    env_vars = [
        field_env("NODE_NAME", "spec.nodeName"),
        field_env("POD_NAME", "metadata.name"),
        field_env("POD_NAMESPACE", "metadata.namespace"),
        env("GPU_CLIENTS_FILE", "/gpu-clients/clients.yaml"),
        field_env("DEFAULT_GPU_CLIENTS_NAMESPACE", "metadata.namespace"),
    ]
    if config_name:  # the user's layouts
        env_vars.append(env("CONFIG_FILE", f"{CONFIG_DIR}/config.yaml"))
        layouts_volume: dict[str, Any] = {
            "name": "mig-parted-config",
            "configMap": {"name": config_name},
        }
    else:
        env_vars.append(env("DEFAULT_CONFIG_FILE", f"{CONFIG_DIR}/config-default.yaml"))
        layouts_volume = {
            "name": "mig-parted-config",
            "configMap": {
                "name": DEFAULT_CONFIG_MAP,
                "items": [{"key": "config.yaml", "path": "config-default.yaml"}],
            },
        }
    if spec.cdi.enabled:
        env_vars.append(env("CDI_ENABLED", "true"))
        if spec.toolkit.enabled:
            env_vars.append(env("NVIDIA_CDI_HOOK_PATH", cdi_hook_path(spec)))
    main = entrypoint_container(
        CONTAINER_NAME,
        component_image(spec, "migManager"),
        mig,
        ENTRYPOINT,
        env_vars=env_vars,
        mounts=[
            mount("run-nvidia-validations", VALIDATIONS_DIR),
            mount("host-sys", "/sys"),
            host_root_mount(read_only=False),
            mount("gpu-clients", "/gpu-clients"),
            mount("mig-parted-config", CONFIG_DIR),
            driver_root_mount(),
            cdi_mount(),
        ],
    )
    runtime, nri = gpu_access(spec, CONTAINER_NAME)
    pod: dict[str, Any] = {
        "serviceAccountName": SERVICE_ACCOUNT,
        **runtime,
        "hostPID": True,
        "hostIPC": True,
        "initContainers": [
            wait_for_file(
                ctx,
                "toolkit-validation",
                TOOLKIT_READY,
                message="waiting for nvidia container toolkit to be setup",
            )
        ],
        "containers": [main],
        "imagePullSecrets": pull_secrets(mig.image_pull_secrets),
        "volumes": [
            entrypoint_volume(ENTRYPOINT),
            host_path("host-sys", "/sys", "Directory"),
            validations_volume(),
            driver_root_volume(spec),
            host_root_volume(spec),
            {
                "name": "gpu-clients",
                "configMap": {"name": clients_name or DEFAULT_CLIENTS_CONFIG_MAP},
            },
            layouts_volume,
            cdi_volume(),
        ],
    }
    return [
        *operand_account(SERVICE_ACCOUNT, NAME, spec, ctx, _ROLE_RULES, _CLUSTER_RULES),
        # The defaults only where the policy names no ConfigMap of its own.
        *(
            []
            if config_name
            else [_config_map(DEFAULT_CONFIG_MAP, "config.yaml", _LAYOUTS, spec, ctx)]
        ),
        *(
            []
            if clients_name
            else [_config_map(DEFAULT_CLIENTS_CONFIG_MAP, "clients.yaml", _CLIENTS, spec, ctx)]
        ),
        entrypoint_config_map(ENTRYPOINT, NAME, _SCRIPT, spec, ctx, app=DAEMONSET_NAME),
        daemonset(
            DAEMONSET_NAME,
            NAME,
            spec,
            ctx,
            pod,
            node_selector={DEPLOY_MIG_MANAGER_LABEL: TRUE},
            pod_annotations=nri,
            host_network=spec.mig_manager.host_network,
        ),
    ]


_LAYOUTS = mig_layouts.config_yaml()
_CLIENTS = mig_layouts.gpu_clients_yaml()
_SCRIPT = entrypoint_script(
    "nvidia-mig-manager",
    # With a host driver, host services holding the GPUs must stop during a change.
    extra='export WITH_SHUTDOWN_HOST_GPU_CLIENTS="$IS_HOST_DRIVER"\n',
)

COMPONENT = Component(
    name=NAME,
    deploy_label=DEPLOY_MIG_MANAGER_LABEL,
    is_enabled=enabled,
    render=render,
    kinds=(*NAMESPACED_RBAC, *CLUSTER_RBAC, CONFIG_MAP, DAEMONSET),
    permissions=Permissions(role=tuple(_ROLE_RULES), cluster=tuple(_CLUSTER_RULES)),
    eligible=is_mig_capable,
)
