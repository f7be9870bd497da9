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
    host_root_volume,
    mount,
    validations_volume,
)
from components._k8s import config_map, env, field_env
from components._sandbox import operand_container, sandbox_switch, validations_container
from components.component import VGPU_ONLY, rule
from components.context import Manifest, RenderContext
from components.keys import DEPLOY_VGPU_DEVICE_MANAGER_LABEL
from components.kinds import CONFIG_MAP
from components.operand import Operand, Pod
from crd import ClusterPolicySpec

NAME = "vgpu-device-manager"
DAEMONSET_NAME = "nvidia-vgpu-device-manager"
SECTION = "vgpuDeviceManager"
CONTAINER_NAME = "nvidia-vgpu-device-manager"
DEFAULT_CONFIG_MAP = "default-vgpu-devices-config"
CONFIG_DIR = "/vgpu-config"
VGPU_MANAGER_READY = f"{VALIDATIONS_DIR}/vgpu-manager-ready"
HOST_VGPU_MANAGER_READY = f"{VALIDATIONS_DIR}/host-vgpu-manager-ready"
"""The sandbox validator's: the vGPU manager runs (ours, or one installed on the host)."""


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


def pod(spec: ClusterPolicySpec, ctx: RenderContext) -> Pod:
    main = operand_container(
        CONTAINER_NAME,
        spec,
        SECTION,
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
    layouts = config_map_name(spec) or DEFAULT_CONFIG_MAP
    volumes = [
        {"name": "vgpu-config", "configMap": {"name": layouts}},
        host_path("host-sys", "/sys", "Directory"),
        host_root_volume(spec),
        host_path("driver-install-dir", spec.host_paths.driver_install_dir, "DirectoryOrCreate"),
        validations_volume(),
    ]
    return Pod(containers=[main], init=[_wait_for_vgpu_manager(ctx)], volumes=volumes)


def default_layouts(spec: ClusterPolicySpec, ctx: RenderContext) -> list[Manifest]:
    """Our layouts, where the policy names no ConfigMap of its own."""
    if config_map_name(spec) is not None:
        return []
    return [config_map(DEFAULT_CONFIG_MAP, NAME, spec, ctx, {"config.yaml": _LAYOUTS})]


_LAYOUTS = vgpu_layouts.config_yaml()

OPERAND = Operand(
    name=NAME,
    section=SECTION,
    daemonset=DAEMONSET_NAME,
    deploy_label=DEPLOY_VGPU_DEVICE_MANAGER_LABEL,
    pod=pod,
    enabled=sandbox_switch(SECTION),
    placement=VGPU_ONLY,
    role=(SCC_RULE, rule("", "pods", "get list watch")),
    # It watches its node's `nvidia.com/vgpu.config` and records its state on the node.
    cluster=(
        CLUSTER_VERSION_RULE,
        rule("", "nodes", "get list watch update"),
    ),
    before=default_layouts,
    kinds=(CONFIG_MAP,),
)
COMPONENT = OPERAND.component()
