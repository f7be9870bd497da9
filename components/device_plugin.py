"""device-plugin: advertises `nvidia.com/gpu` (or MIG devices) to the kubelet.

Waits for the validator's `toolkit-ready`, then its entrypoint waits for `driver-ready`
and exports what the driver check found (driver root, host or container driver) before
starting the plugin. With CDI on it hands devices to containers as CDI annotations and
CRI device requests. With `devicePlugin.config.name` set it runs the config-manager
pair so per-node configs (time-slicing, MPS) follow the node label.
"""

from __future__ import annotations

from typing import Any

from components import _config_manager
from components import _entrypoint_operand as entry
from components._accounts import READ_NODES
from components._host_paths import (
    host_path,
    host_root_mount,
    host_root_volume,
    kubelet_path,
    mount,
    validations_mount,
    validations_volume,
)
from components._k8s import TOOLKIT_READY, env, wait_for_file
from components.context import RenderContext
from components.keys import DEPLOY_DEVICE_PLUGIN_LABEL
from components.kinds import CONFIG_MAP
from components.operand import Operand, Pod
from crd import ClusterPolicySpec, component_image

NAME = "device-plugin"
SECTION = "devicePlugin"
DAEMONSET_NAME = "nvidia-device-plugin-daemonset"
SERVICE_ACCOUNT = "nvidia-device-plugin"
CONTAINER_NAME = "nvidia-device-plugin"
PROCESS = "nvidia-device-plugin"
ENTRYPOINT = "nvidia-device-plugin-entrypoint"
KUBELET_PLUGINS_DIR = "/var/lib/kubelet/device-plugins"
"""Where the plugin puts its socket, in its container (the host side follows
`hostPaths.kubeletRootDir`)."""
CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"


def mps_root(spec: ClusterPolicySpec) -> str:
    mps = spec.device_plugin.mps
    return mps.root if mps else "/run/nvidia/mps"


def cdi_hook_path(spec: ClusterPolicySpec) -> str:
    """Where the toolkit installs `nvidia-cdi-hook` (CDI specs reference it)."""
    return f"{spec.toolkit.install_dir.rstrip('/')}/toolkit/nvidia-cdi-hook"


def _env(spec: ClusterPolicySpec) -> list[dict[str, Any]]:
    cdi = spec.cdi.enabled
    variables = [
        env("PASS_DEVICE_SPECS", "true"),
        env("FAIL_ON_INIT_ERROR", "true"),
        env("DEVICE_LIST_STRATEGY", "cdi-annotations,cdi-cri" if cdi else "envvar"),
        env("DEVICE_ID_STRATEGY", "uuid"),
        env("NVIDIA_VISIBLE_DEVICES", "all"),
        env("NVIDIA_DRIVER_CAPABILITIES", "all"),
        env("MPS_ROOT", mps_root(spec)),
        env("MIG_STRATEGY", spec.mig.strategy),
        env("NVIDIA_MIG_MONITOR_DEVICES", "all"),
    ]
    if spec.gds.enabled:
        variables.append(env("GDS_ENABLED", "true"))
    if spec.driver.rdma is not None and spec.driver.rdma.enabled:
        variables.append(env("MOFED_ENABLED", "true"))
    if spec.gdrcopy.enabled:
        variables.append(env("GDRCOPY_ENABLED", "true"))
    if cdi:
        variables += [
            env("CDI_ENABLED", "true"),
            env("CDI_ANNOTATION_PREFIX", CDI_ANNOTATION_PREFIX),
        ]
        if spec.toolkit.enabled:
            variables.append(env("NVIDIA_CDI_HOOK_PATH", cdi_hook_path(spec)))
    return variables + _config_manager.operand_settings(spec)[0]


def pod(spec: ClusterPolicySpec, ctx: RenderContext) -> Pod:
    _, config_mounts = _config_manager.operand_settings(spec)
    main = entry.entrypoint_container(
        CONTAINER_NAME,
        component_image(spec, SECTION),
        spec.device_plugin,
        ENTRYPOINT,
        env_vars=_env(spec),
        mounts=[
            mount("device-plugin", KUBELET_PLUGINS_DIR),
            validations_mount(),
            entry.driver_root_mount(),
            host_root_mount(),
            entry.cdi_mount(),
            mount("mps-shm", "/dev/shm"),
            mount("mps-root", "/mps"),
            *config_mounts,
        ],
    )
    volumes = [
        entry.entrypoint_volume(ENTRYPOINT),
        host_path("device-plugin", kubelet_path(spec, "device-plugins")),
        validations_volume(),
        entry.driver_root_volume(spec),
        host_root_volume(spec),
        entry.cdi_volume(),
        host_path("mps-root", mps_root(spec), "DirectoryOrCreate"),
        host_path("mps-shm", f"{mps_root(spec)}/shm"),
    ]
    init = [wait_for_file(ctx, "toolkit-validation", TOOLKIT_READY)]
    own = Pod(containers=[main], init=init, volumes=volumes)
    return _config_manager.with_config(spec, own, PROCESS)


HOST_MODULES = "/proc/modules"
_HOST_MODULE_FLAGS = (
    "# GPUDirect modules loaded on the host count even where the policy did not enable\n"
    "# them (as upstream): gdrdrv turns on GDRCopy, nvidia_fs GDS and MOFED. A flag the\n"
    "# pod already sets is kept.\n"
    f"if grep -q '^gdrdrv ' {HOST_MODULES}; then\n"
    '  : "${GDRCOPY_ENABLED:=true}"\n'
    "  export GDRCOPY_ENABLED\n"
    "fi\n"
    f"if grep -q '^nvidia_fs ' {HOST_MODULES}; then\n"
    '  : "${GDS_ENABLED:=true}" "${MOFED_ENABLED:=true}"\n'
    "  export GDS_ENABLED MOFED_ENABLED\n"
    "fi\n"
)
_SCRIPT = entry.entrypoint_script(PROCESS, extra=_HOST_MODULE_FLAGS)

OPERAND = Operand(
    name=NAME,
    section=SECTION,
    daemonset=DAEMONSET_NAME,
    deploy_label=DEPLOY_DEVICE_PLUGIN_LABEL,
    pod=pod,
    cluster=(READ_NODES,),  # the config manager follows its node's label
    before=entry.entrypoint_objects(ENTRYPOINT, NAME, _SCRIPT, app=DAEMONSET_NAME),
    kinds=(CONFIG_MAP,),
    gpu_container=CONTAINER_NAME,
)
COMPONENT = OPERAND.component()
