"""mps-control-daemon: the CUDA MPS control daemon for nodes whose device plugin config
asks for MPS sharing.

Whether a config asks for MPS is in the user's ConfigMap, which rendering cannot read;
so, like upstream, the DaemonSet exists whenever the device plugin does and selects only
nodes the device plugin labelled `nvidia.com/mps.capable=true`: without MPS configs it
schedules no pods and counts as ready at once. Its pods run under the device plugin's
ServiceAccount, as upstream's do; the daemon's own account and RBAC exist alongside.
"""

from __future__ import annotations

from components import _config_manager
from components._accounts import SCC_RULE
from components._host_paths import host_path, mount, run_nvidia_volume
from components._k8s import TOOLKIT_READY, container, env, field_env, wait_for_file
from components.component import Component
from components.context import Manifest, RenderContext
from components.device_plugin import SERVICE_ACCOUNT as DEVICE_PLUGIN_ACCOUNT
from components.device_plugin import mps_root
from components.keys import DEPLOY_DEVICE_PLUGIN_LABEL, MPS_CAPABLE_LABEL, TRUE
from components.kinds import CLUSTER_RBAC, DAEMONSET, NAMESPACED_RBAC
from crd import ClusterPolicySpec, component_image

NAME = "mps-control-daemon"
DAEMONSET_NAME = "nvidia-device-plugin-mps-control-daemon"
SERVICE_ACCOUNT = "nvidia-device-plugin-mps-control-daemon"
CONTAINER_NAME = "mps-control-daemon-ctr"
PROCESS = "mps-control-daemon"
PROCESS_PATH = "/usr/bin/mps-control-daemon"
"""What the config manager signals: the daemon is matched by its full path."""


def enabled(spec: ClusterPolicySpec) -> bool:
    return spec.device_plugin.enabled


def render(spec: ClusterPolicySpec, ctx: RenderContext) -> list[Manifest]:
    plugin = spec.device_plugin
    image = component_image(spec, "devicePlugin")
    env_vars = [
        field_env("NODE_NAME", "spec.nodeName"),
        env("NVIDIA_VISIBLE_DEVICES", "all"),
        env("NVIDIA_DRIVER_CAPABILITIES", "compute,utility"),
        env("MIG_STRATEGY", spec.mig.strategy),
        env("NVIDIA_MIG_MONITOR_DEVICES", "all"),
    ]
    mounts = [mount("mps-shm", "/dev/shm"), mount("mps-root", "/mps")]
    if _config_manager.configured(spec):
        env_vars.append(env("CONFIG_FILE", _config_manager.CONFIG_FILE))
        mounts += _config_manager.operand_mounts()
    main = container(
        CONTAINER_NAME,
        image,
        # The device plugin's resources, but not its env or args (PASS_DEVICE_SPECS,
        # DEVICE_LIST_STRATEGY... are the plugin's), as upstream.
        plugin.model_copy(update={"env": None, "args": None}),
        command=[PROCESS],
        env_vars=env_vars,
        mounts=mounts,
        privileged=True,
    )
    shm_mount = {
        "name": "mps-control-daemon-mounts",
        "image": image,
        "imagePullPolicy": plugin.image_pull_policy,
        "command": [PROCESS, "mount-shm"],
        "securityContext": {"privileged": True},
        "volumeMounts": [mount("mps-root", "/mps", propagation="Bidirectional")],
    }
    return [
        *_config_manager.operand_rbac(SERVICE_ACCOUNT, NAME, spec, ctx, role_rules=[SCC_RULE]),
        _config_manager.operand_daemonset(
            spec,
            ctx,
            plugin,  # upstream's MPS control daemon follows the device plugin's settings
            component=NAME,
            daemonset_name=DAEMONSET_NAME,
            service_account_name=DEVICE_PLUGIN_ACCOUNT,
            process=PROCESS_PATH,
            pod={"hostPID": True},
            init=[
                wait_for_file(ctx, "toolkit-validation", TOOLKIT_READY, whole_run_nvidia=True),
                shm_mount,
            ],
            main=main,
            operand_volumes=[
                run_nvidia_volume(),
                host_path("mps-root", mps_root(spec), "DirectoryOrCreate"),
                host_path("mps-shm", f"{mps_root(spec)}/shm"),
            ],
            node_selector={DEPLOY_DEVICE_PLUGIN_LABEL: TRUE, MPS_CAPABLE_LABEL: TRUE},
        ),
    ]


COMPONENT = Component(
    name=NAME,
    deploy_label=None,  # runs where the device plugin does and MPS is configured
    is_enabled=enabled,
    render=render,
    kinds=(*NAMESPACED_RBAC, *CLUSTER_RBAC, DAEMONSET),
    permissions=_config_manager.permissions([SCC_RULE]),
)
