"""device-plugin: advertises `nvidia.com/gpu` (or MIG devices) to the kubelet.

Waits for the validator's `toolkit-ready`. With `devicePlugin.config.name` set it runs
the config-manager pair so per-node configs (time-slicing, MPS) follow the node label.
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
from components.keys import DEPLOY_DEVICE_PLUGIN_LABEL, TRUE
from crd import ClusterPolicySpec, component_image

NAME = "device-plugin"
DAEMONSET_NAME = "nvidia-device-plugin-daemonset"
SERVICE_ACCOUNT = "nvidia-device-plugin"
CONTAINER_NAME = "nvidia-device-plugin"
PROCESS = "nvidia-device-plugin"
KUBELET_PLUGINS_DIR = "/var/lib/kubelet/device-plugins"


def enabled(spec: ClusterPolicySpec) -> bool:
    return spec.device_plugin.enabled


def mps_root(spec: ClusterPolicySpec) -> str:
    mps = spec.device_plugin.mps
    return mps.root if mps else "/run/nvidia/mps"


def render(spec: ClusterPolicySpec, ctx: RenderContext) -> list[Manifest]:
    plugin = spec.device_plugin
    with_config = _config_manager.configured(spec)
    env_vars = [
        env("MIG_STRATEGY", spec.mig.strategy),
        env("PASS_DEVICE_SPECS", "true"),
        env("FAIL_ON_INIT_ERROR", "true"),
        env("DEVICE_ID_STRATEGY", "uuid"),
        env("NVIDIA_MIG_MONITOR_DEVICES", "all"),
        env("NVIDIA_DRIVER_ROOT", driver_root(spec)),
        env("CONTAINER_DRIVER_ROOT", "/driver-root"),
        env("MPS_ROOT", mps_root(spec)),
        field_env("NODE_NAME", "spec.nodeName"),
    ]
    mounts = [
        mount("device-plugins", KUBELET_PLUGINS_DIR),
        mount("driver-root", "/driver-root", read_only=True, propagation="HostToContainer"),
        mount("mps-root", "/mps"),
        mount("cdi-root", "/var/run/cdi"),
        mount("run-nvidia-validations", VALIDATIONS_DIR, read_only=True),
    ]
    if with_config:
        env_vars.append(env("CONFIG_FILE", _config_manager.CONFIG_FILE))
        mounts.append(_config_manager.operand_mount())
    main = container(
        CONTAINER_NAME,
        component_image(spec, "devicePlugin"),
        plugin,
        command=[PROCESS],
        env_vars=env_vars,
        mounts=mounts,
        privileged=True,
    )
    init = [wait_for_file(ctx, "toolkit-validation", f"{VALIDATIONS_DIR}/toolkit-ready")]
    volumes = [
        host_path("device-plugins", KUBELET_PLUGINS_DIR),
        host_path("driver-root", driver_root(spec), "DirectoryOrCreate"),
        host_path("mps-root", mps_root(spec), "DirectoryOrCreate"),
        host_path("cdi-root", "/var/run/cdi", "DirectoryOrCreate"),
        validations_volume(),
    ]
    return _config_manager.operand_objects(
        spec,
        ctx,
        component=NAME,
        daemonset_name=DAEMONSET_NAME,
        service_account_name=SERVICE_ACCOUNT,
        process=PROCESS,
        pod={
            "runtimeClassName": spec.operator.runtime_class,
            "imagePullSecrets": pull_secrets(
                plugin.image_pull_secrets, ctx.operator_image_pull_secrets
            ),
        },
        init=init,
        main=main,
        operand_volumes=volumes,
        node_selector={DEPLOY_DEVICE_PLUGIN_LABEL: TRUE},
    )


COMPONENT = Component(
    name=NAME, deploy_label=DEPLOY_DEVICE_PLUGIN_LABEL, is_enabled=enabled, render=render
)
