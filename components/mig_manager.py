"""mig-manager: repartitions MIG GPUs when a node's `nvidia.com/mig.config` label changes.

Rendered only while some node is MIG-capable (the context says so); its deploy label goes
only on MIG-capable nodes. With it come the default layouts (`default-mig-parted-config`,
the names `nvidia.com/mig.config` may take) and the host services to stop while GPUs are
repartitioned (`default-gpu-clients`), unless the policy names its own ConfigMaps. It
edits node labels (pausing operands while it works), hence its cluster role.
"""

from __future__ import annotations

from typing import Any

from components import _entrypoint_operand as entry
from components import mig_layouts
from components._accounts import SCC_RULE
from components._host_paths import (
    host_path,
    host_root_mount,
    host_root_volume,
    mount,
    validations_mount,
    validations_volume,
)
from components._k8s import TOOLKIT_READY, config_map, env, field_env, wait_for_file
from components.component import rule
from components.context import Manifest, RenderContext
from components.device_plugin import cdi_hook_path
from components.keys import DEPLOY_MIG_MANAGER_LABEL, is_mig_capable
from components.kinds import CONFIG_MAP
from components.operand import Operand, Pod
from crd import ClusterPolicySpec, component_image

NAME = "mig-manager"
SECTION = "migManager"
DAEMONSET_NAME = "nvidia-mig-manager"
CONTAINER_NAME = "nvidia-mig-manager"
ENTRYPOINT = "nvidia-mig-manager-entrypoint"
DEFAULT_CONFIG_MAP = "default-mig-parted-config"
DEFAULT_CLIENTS = "default-gpu-clients"
CONFIG_DIR = "/mig-parted-config"


def _config_name(spec: ClusterPolicySpec) -> str | None:
    """The policy's own layouts ConfigMap; None: ours (`default-mig-parted-config`)."""
    config = spec.mig_manager.config
    return config.name if config and config.name else None


def _clients_name(spec: ClusterPolicySpec) -> str | None:
    """The policy's own GPU clients ConfigMap; None: ours (`default-gpu-clients`)."""
    clients = spec.mig_manager.gpu_clients_config
    return clients.name if clients and clients.name else None


def pod(spec: ClusterPolicySpec, ctx: RenderContext) -> Pod | None:
    if not ctx.mig_capable:
        return None
    env_vars = [
        field_env("NODE_NAME", "spec.nodeName"),
        field_env("POD_NAME", "metadata.name"),
        field_env("POD_NAMESPACE", "metadata.namespace"),
        env("GPU_CLIENTS_FILE", "/gpu-clients/clients.yaml"),
        field_env("DEFAULT_GPU_CLIENTS_NAMESPACE", "metadata.namespace"),
    ]
    config_name = _config_name(spec)
    if config_name:  # the user's layouts
        env_vars.append(env("CONFIG_FILE", f"{CONFIG_DIR}/config.yaml"))
        layouts: dict[str, Any] = {"name": config_name}
    else:
        env_vars.append(env("DEFAULT_CONFIG_FILE", f"{CONFIG_DIR}/config-default.yaml"))
        layouts = {
            "name": DEFAULT_CONFIG_MAP,
            "items": [{"key": "config.yaml", "path": "config-default.yaml"}],
        }
    if spec.cdi.enabled:
        env_vars.append(env("CDI_ENABLED", "true"))
        if spec.toolkit.enabled:
            env_vars.append(env("NVIDIA_CDI_HOOK_PATH", cdi_hook_path(spec)))
    main = entry.entrypoint_container(
        CONTAINER_NAME,
        component_image(spec, SECTION),
        spec.mig_manager,
        ENTRYPOINT,
        env_vars=env_vars,
        mounts=[
            validations_mount(),
            mount("host-sys", "/sys"),
            host_root_mount(read_only=False),
            mount("gpu-clients", "/gpu-clients"),
            mount("mig-parted-config", CONFIG_DIR),
            entry.driver_root_mount(),
            entry.cdi_mount(),
        ],
    )
    clients = _clients_name(spec) or DEFAULT_CLIENTS
    volumes = [
        entry.entrypoint_volume(ENTRYPOINT),
        host_path("host-sys", "/sys", "Directory"),
        validations_volume(),
        entry.driver_root_volume(spec),
        host_root_volume(spec),
        {"name": "gpu-clients", "configMap": {"name": clients}},
        {"name": "mig-parted-config", "configMap": layouts},
        entry.cdi_volume(),
    ]
    wait = wait_for_file(
        ctx,
        "toolkit-validation",
        TOOLKIT_READY,
        message="waiting for nvidia container toolkit to be setup",
    )
    fields = {"hostPID": True, "hostIPC": True}
    return Pod(containers=[main], init=[wait], volumes=volumes, fields=fields)


def config_maps(spec: ClusterPolicySpec, ctx: RenderContext) -> list[Manifest]:
    """Our default layouts and GPU clients, where the policy names no ConfigMap of its
    own, then the entrypoint's."""
    layouts = {"config.yaml": _LAYOUTS}
    clients = {"clients.yaml": _CLIENTS}
    return [
        *([] if _config_name(spec) else [config_map(DEFAULT_CONFIG_MAP, NAME, spec, ctx, layouts)]),
        *([] if _clients_name(spec) else [config_map(DEFAULT_CLIENTS, NAME, spec, ctx, clients)]),
        *_entrypoint(spec, ctx),
    ]


_LAYOUTS = mig_layouts.config_yaml()
_CLIENTS = mig_layouts.gpu_clients_yaml()
_SCRIPT = entry.entrypoint_script(
    "nvidia-mig-manager",
    # With a host driver, host services holding the GPUs must stop during a change.
    extra='export WITH_SHUTDOWN_HOST_GPU_CLIENTS="$IS_HOST_DRIVER"\n',
)

_entrypoint = entry.entrypoint_objects(ENTRYPOINT, NAME, _SCRIPT, app=DAEMONSET_NAME)

OPERAND = Operand(
    name=NAME,
    section=SECTION,
    daemonset=DAEMONSET_NAME,
    deploy_label=DEPLOY_MIG_MANAGER_LABEL,
    pod=pod,
    eligible=is_mig_capable,
    # It restarts operand pods on its node and records layout state in ConfigMaps.
    role=(
        SCC_RULE,
        rule("", "pods", "get list watch delete"),
        rule("", "configmaps", "create get list update patch"),
    ),
    cluster=(
        rule("", "nodes", "get list watch update patch"),
        rule("", "pods", "list"),
    ),
    before=config_maps,
    kinds=(CONFIG_MAP,),
    gpu_container=CONTAINER_NAME,
)
COMPONENT = OPERAND.component()
