"""gpu-feature-discovery: publishes GPU model, memory, MIG capability... as node labels
through NFD's feature files. Shares the device plugin's config (and config-manager)."""

from __future__ import annotations

from components import _config_manager
from components._accounts import READ_NODES, SCC_RULE
from components._host_paths import host_path, mount, run_nvidia_volume
from components._k8s import PART_OF_LABEL, TOOLKIT_READY, env, field_env, wait_for_file
from components.component import rule
from components.context import RenderContext
from components.keys import DEPLOY_GFD_LABEL
from components.operand import Operand, Pod, main_container
from crd import ClusterPolicySpec

NAME = "gpu-feature-discovery"
SECTION = "gfd"
DAEMONSET_NAME = "gpu-feature-discovery"
CONTAINER_NAME = "gpu-feature-discovery"
PROCESS = "gpu-feature-discovery"
FEATURES_DIR = "/etc/kubernetes/node-feature-discovery/features.d"


def pod(spec: ClusterPolicySpec, ctx: RenderContext) -> Pod:
    config_env, config_mounts = _config_manager.operand_settings(spec)
    main = main_container(
        CONTAINER_NAME,
        spec,
        SECTION,
        command=[PROCESS],
        env_vars=[
            env("GFD_SLEEP_INTERVAL", "60s"),
            env("GFD_FAIL_ON_INIT_ERROR", "true"),
            field_env("NAMESPACE", "metadata.namespace"),
            field_env("NODE_NAME", "spec.nodeName"),
            field_env("POD_NAME", "metadata.name"),
            env("MIG_STRATEGY", spec.mig.strategy),
            env("NVIDIA_MIG_MONITOR_DEVICES", "all"),
            *config_env,
        ],
        mounts=[
            mount("output-dir", FEATURES_DIR),
            mount("host-sys", "/sys", read_only=True),
            *config_mounts,
        ],
        privileged=True,
    )
    own = Pod(
        containers=[main],
        init=[wait_for_file(ctx, "toolkit-validation", TOOLKIT_READY, whole_run_nvidia=True)],
        volumes=[
            host_path("output-dir", FEATURES_DIR),
            host_path("host-sys", "/sys"),
            run_nvidia_volume(),
        ],
    )
    return _config_manager.with_config(spec, own, PROCESS)


OPERAND = Operand(
    name=NAME,
    section=SECTION,
    daemonset=DAEMONSET_NAME,
    deploy_label=DEPLOY_GFD_LABEL,
    pod=pod,
    account="nvidia-gpu-feature-discovery",
    # GFD can publish through NFD's NodeFeature objects instead of feature files.
    role=(
        SCC_RULE,
        rule("nfd.k8s-sigs.io", "nodefeatures", "get list watch create update"),
        rule("", "pods", "get"),
    ),
    cluster=(READ_NODES,),  # the config manager follows its node's label
    gpu_container=CONTAINER_NAME,
    # Upstream's selector (immutable): GFD's pods are part of `nvidia-gpu`.
    selector_labels={PART_OF_LABEL: "nvidia-gpu"},
)
COMPONENT = OPERAND.component()
