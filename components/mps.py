"""mps-control-daemon: the CUDA MPS control daemon for nodes whose device plugin config
asks for MPS sharing.

Whether a config asks for MPS is in the user's ConfigMap, which rendering cannot read;
so, like upstream, the DaemonSet exists whenever the device plugin does and selects only
nodes the device plugin labelled `nvidia.com/mps.capable=true`: without MPS configs it
schedules no pods and counts as ready at once. Its pods run under the device plugin's
ServiceAccount, as upstream's do; the daemon's own account and RBAC exist alongside.
It follows the device plugin's section (switch, image, pull secrets, host network).
"""

from __future__ import annotations

from components import _config_manager
from components._accounts import READ_NODES
from components._host_paths import host_path, mount, run_nvidia_volume
from components._k8s import TOOLKIT_READY, container, env, field_env, wait_for_file
from components.context import RenderContext
from components.device_plugin import SERVICE_ACCOUNT as DEVICE_PLUGIN_ACCOUNT
from components.device_plugin import mps_root
from components.keys import DEPLOY_DEVICE_PLUGIN_LABEL, MPS_CAPABLE_LABEL, TRUE
from components.operand import Operand, Pod
from crd import ClusterPolicySpec, component_image

NAME = "mps-control-daemon"
SECTION = "devicePlugin"
DAEMONSET_NAME = "nvidia-device-plugin-mps-control-daemon"
CONTAINER_NAME = "mps-control-daemon-ctr"
PROCESS = "mps-control-daemon"
PROCESS_PATH = "/usr/bin/mps-control-daemon"
"""What the config manager signals: the daemon is matched by its full path."""


def pod(spec: ClusterPolicySpec, ctx: RenderContext) -> Pod:
    plugin = spec.device_plugin
    image = component_image(spec, SECTION)
    config_env, config_mounts = _config_manager.operand_settings(spec)
    main = container(
        CONTAINER_NAME,
        image,
        # The device plugin's resources, but not its env or args (PASS_DEVICE_SPECS,
        # DEVICE_LIST_STRATEGY... are the plugin's), as upstream.
        plugin.model_copy(update={"env": None, "args": None}),
        command=[PROCESS],
        env_vars=[
            field_env("NODE_NAME", "spec.nodeName"),
            env("NVIDIA_VISIBLE_DEVICES", "all"),
            env("NVIDIA_DRIVER_CAPABILITIES", "compute,utility"),
            env("MIG_STRATEGY", spec.mig.strategy),
            env("NVIDIA_MIG_MONITOR_DEVICES", "all"),
            *config_env,
        ],
        mounts=[mount("mps-shm", "/dev/shm"), mount("mps-root", "/mps"), *config_mounts],
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
    own = Pod(
        containers=[main],
        init=[
            wait_for_file(ctx, "toolkit-validation", TOOLKIT_READY, whole_run_nvidia=True),
            shm_mount,
        ],
        volumes=[
            run_nvidia_volume(),
            host_path("mps-root", mps_root(spec), "DirectoryOrCreate"),
            host_path("mps-shm", f"{mps_root(spec)}/shm"),
        ],
        fields={"serviceAccountName": DEVICE_PLUGIN_ACCOUNT, "hostPID": True},
    )
    return _config_manager.with_config(spec, own, PROCESS_PATH)


OPERAND = Operand(
    name=NAME,
    section=SECTION,
    daemonset=DAEMONSET_NAME,
    deploy_label=None,  # runs where the device plugin does and MPS is configured
    pod=pod,
    cluster=(READ_NODES,),  # the config manager follows its node's label
    gpu_container=CONTAINER_NAME,
    node_selector={DEPLOY_DEVICE_PLUGIN_LABEL: TRUE, MPS_CAPABLE_LABEL: TRUE},
)
COMPONENT = OPERAND.component()
