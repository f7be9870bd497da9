"""mig-manager: repartitions MIG GPUs when a node's `nvidia.com/mig.config` label changes.

Rendered only while some node is MIG-capable (the context says so); its deploy label goes
only on MIG-capable nodes. It edits node labels (pausing operands while it works), hence
its cluster role.
"""

from __future__ import annotations

from typing import Any

from components._k8s import (
    HOST_ROOT_MOUNT,
    VALIDATIONS_DIR,
    cluster_role_and_binding,
    config_map_volume,
    container,
    daemonset,
    env,
    field_env,
    host_path,
    mount,
    pull_secrets,
    service_account,
    validations_volume,
    wait_for_file,
)
from components.component import Component
from components.context import Manifest, RenderContext
from components.keys import DEPLOY_MIG_MANAGER_LABEL, TRUE
from crd import ClusterPolicySpec, component_image

NAME = "mig-manager"
DAEMONSET_NAME = "nvidia-mig-manager"
SERVICE_ACCOUNT = "nvidia-mig-manager"
CONTAINER_NAME = "nvidia-mig-manager"
DEFAULT_CONFIG_MAP = "default-mig-parted-config"
DEFAULT_CLIENTS_CONFIG_MAP = "default-gpu-clients"

_RULES = [
    {
        "apiGroups": [""],
        "resources": ["nodes"],
        "verbs": ["get", "list", "watch", "patch", "update"],
    },
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "delete"]},
    {"apiGroups": ["apps"], "resources": ["daemonsets"], "verbs": ["get", "list", "watch"]},
]


def enabled(spec: ClusterPolicySpec) -> bool:
    return spec.mig_manager.enabled


def render(spec: ClusterPolicySpec, ctx: RenderContext) -> list[Manifest]:
    if not ctx.mig_capable:
        return []
    mig = spec.mig_manager
    config_name = mig.config.name if mig.config and mig.config.name else None
    default_config = mig.config.default if mig.config else "all-disabled"
    clients = mig.gpu_clients_config
    clients_name = clients.name if clients and clients.name else None
    main = container(
        CONTAINER_NAME,
        component_image(spec, "migManager"),
        mig,
        env_vars=[
            field_env("NODE_NAME", "spec.nodeName"),
            env("CONFIG_FILE", "/mig-parted-config/config.yaml"),
            env("GPU_CLIENTS_FILE", "/gpu-clients/clients.yaml"),
            env("DEFAULT_GPU_CLIENTS_NAMESPACE", ctx.namespace),
            env("DEFAULT_MIG_CONFIG", default_config),
            env("HOST_ROOT_MOUNT", HOST_ROOT_MOUNT),
            env("HOST_NVIDIA_DIR", spec.toolkit.install_dir),
            env("CDI_ENABLED", str(spec.cdi.enabled).lower()),
            env("WITH_REBOOT", "false"),
        ],
        mounts=[
            mount("host-root", HOST_ROOT_MOUNT, propagation="HostToContainer"),
            mount("host-sys", "/sys"),
            mount("mig-parted-config", "/mig-parted-config", read_only=True),
            mount("gpu-clients", "/gpu-clients", read_only=True),
            mount("run-nvidia-validations", VALIDATIONS_DIR),
        ],
        privileged=True,
    )
    pod: dict[str, Any] = {
        "serviceAccountName": SERVICE_ACCOUNT,
        "runtimeClassName": spec.operator.runtime_class,
        "hostPID": True,
        "hostIPC": True,
        "initContainers": [
            wait_for_file(ctx, "toolkit-validation", f"{VALIDATIONS_DIR}/toolkit-ready")
        ],
        "containers": [main],
        "imagePullSecrets": pull_secrets(mig.image_pull_secrets, ctx.operator_image_pull_secrets),
        "volumes": [
            host_path("host-root", spec.host_paths.root_fs),
            host_path("host-sys", "/sys"),
            # The defaults are optional: a missing ConfigMap must not keep the pod pending.
            config_map_volume(
                "mig-parted-config", config_name or DEFAULT_CONFIG_MAP, optional=not config_name
            ),
            config_map_volume(
                "gpu-clients",
                clients_name or DEFAULT_CLIENTS_CONFIG_MAP,
                optional=not clients_name,
            ),
            validations_volume(),
        ],
    }
    return [
        service_account(SERVICE_ACCOUNT, NAME, spec, ctx),
        *cluster_role_and_binding(SERVICE_ACCOUNT, NAME, spec, ctx, _RULES),
        daemonset(
            DAEMONSET_NAME, NAME, spec, ctx, pod, node_selector={DEPLOY_MIG_MANAGER_LABEL: TRUE}
        ),
    ]


COMPONENT = Component(
    name=NAME, deploy_label=DEPLOY_MIG_MANAGER_LABEL, is_enabled=enabled, render=render
)
