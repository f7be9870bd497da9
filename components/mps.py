"""mps-control-daemon: the CUDA MPS control daemon for nodes whose device plugin config
asks for MPS sharing.

Whether a config asks for MPS is in the user's ConfigMap, which rendering cannot read;
so, like upstream, the DaemonSet exists whenever the device plugin does and selects only
nodes the device plugin labelled `nvidia.com/mps.capable=true`: without MPS configs it
schedules no pods and counts as ready at once. It is enabled only when the device plugin
is and `devicePlugin.config.name` names a ConfigMap (no ConfigMap, no MPS config).
"""

from __future__ import annotations

from components import _config_manager
from components._k8s import (
    VALIDATIONS_DIR,
    container,
    driver_root,
    env,
    field_env,
    host_path,
    mount,
    pull_secrets,
    validations_volume,
    wait_for_file,
)
from components.component import Component
from components.context import Manifest, RenderContext
from components.device_plugin import mps_root
from components.keys import DEPLOY_DEVICE_PLUGIN_LABEL, MPS_CAPABLE_LABEL, TRUE
from crd import ClusterPolicySpec, component_image

NAME = "mps-control-daemon"
DAEMONSET_NAME = "nvidia-device-plugin-mps-control-daemon"
SERVICE_ACCOUNT = "nvidia-mps-control-daemon"
CONTAINER_NAME = "mps-control-daemon-ctr"
PROCESS = "mps-control-daemon"


def enabled(spec: ClusterPolicySpec) -> bool:
    return spec.device_plugin.enabled and _config_manager.configured(spec)


def render(spec: ClusterPolicySpec, ctx: RenderContext) -> list[Manifest]:
    plugin = spec.device_plugin
    main = container(
        CONTAINER_NAME,
        component_image(spec, "devicePlugin"),
        plugin,
        command=[PROCESS],
        env_vars=[
            field_env("NODE_NAME", "spec.nodeName"),
            env("CONFIG_FILE", _config_manager.CONFIG_FILE),
            env("NVIDIA_VISIBLE_DEVICES", "all"),
            env("NVIDIA_DRIVER_CAPABILITIES", "compute,utility"),
        ],
        mounts=[
            mount("mps-root", "/mps"),
            mount("mps-shm", "/dev/shm"),
            _config_manager.operand_mount(),
        ],
        privileged=True,
    )
    return _config_manager.operand_objects(
        spec,
        ctx,
        component=NAME,
        daemonset_name=DAEMONSET_NAME,
        service_account_name=SERVICE_ACCOUNT,
        process=PROCESS,
        pod={
            "runtimeClassName": spec.operator.runtime_class,
            "hostPID": True,
            "imagePullSecrets": pull_secrets(
                plugin.image_pull_secrets, ctx.operator_image_pull_secrets
            ),
        },
        init=[wait_for_file(ctx, "toolkit-validation", f"{VALIDATIONS_DIR}/toolkit-ready")],
        main=main,
        operand_volumes=[
            host_path("mps-root", mps_root(spec), "DirectoryOrCreate"),
            host_path("mps-shm", f"{mps_root(spec)}/shm", "DirectoryOrCreate"),
            host_path("driver-root", driver_root(spec), "DirectoryOrCreate"),
            validations_volume(),
        ],
        node_selector={DEPLOY_DEVICE_PLUGIN_LABEL: TRUE, MPS_CAPABLE_LABEL: TRUE},
    )


COMPONENT = Component(name=NAME, deploy_label=None, is_enabled=enabled, render=render)
