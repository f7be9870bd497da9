"""gpu-feature-discovery: publishes GPU model, memory, MIG capability... as node labels
through NFD's feature files. Shares the device plugin's config (and config-manager)."""

from __future__ import annotations

from components import _config_manager
from components._accounts import SCC_RULE
from components._host_paths import host_path, mount, run_nvidia_volume
from components._k8s import PART_OF_LABEL, TOOLKIT_READY, container, env, field_env, wait_for_file
from components.component import Component
from components.context import Manifest, RenderContext
from components.keys import DEPLOY_GFD_LABEL, TRUE
from components.kinds import CLUSTER_RBAC, DAEMONSET, NAMESPACED_RBAC
from crd import ClusterPolicySpec, component_image

NAME = "gpu-feature-discovery"
DAEMONSET_NAME = "gpu-feature-discovery"
SERVICE_ACCOUNT = "nvidia-gpu-feature-discovery"
CONTAINER_NAME = "gpu-feature-discovery"
PROCESS = "gpu-feature-discovery"
FEATURES_DIR = "/etc/kubernetes/node-feature-discovery/features.d"

_ROLE_RULES = [
    SCC_RULE,
    {
        "apiGroups": ["nfd.k8s-sigs.io"],
        "resources": ["nodefeatures"],
        "verbs": ["get", "list", "watch", "create", "update"],
    },
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
]
"""GFD can publish through NFD's NodeFeature objects instead of feature files."""


def enabled(spec: ClusterPolicySpec) -> bool:
    return spec.gfd.enabled


def render(spec: ClusterPolicySpec, ctx: RenderContext) -> list[Manifest]:
    gfd = spec.gfd
    env_vars = [
        env("GFD_SLEEP_INTERVAL", "60s"),
        env("GFD_FAIL_ON_INIT_ERROR", "true"),
        field_env("NAMESPACE", "metadata.namespace"),
        field_env("NODE_NAME", "spec.nodeName"),
        field_env("POD_NAME", "metadata.name"),
        env("MIG_STRATEGY", spec.mig.strategy),
        env("NVIDIA_MIG_MONITOR_DEVICES", "all"),
    ]
    mounts = [mount("output-dir", FEATURES_DIR), mount("host-sys", "/sys", read_only=True)]
    if _config_manager.configured(spec):
        env_vars.append(env("CONFIG_FILE", _config_manager.CONFIG_FILE))
        mounts += _config_manager.operand_mounts()
    main = container(
        CONTAINER_NAME,
        component_image(spec, "gfd"),
        gfd,
        command=[PROCESS],
        env_vars=env_vars,
        mounts=mounts,
        privileged=True,
    )
    return [
        *_config_manager.operand_rbac(SERVICE_ACCOUNT, NAME, spec, ctx, role_rules=_ROLE_RULES),
        _config_manager.operand_daemonset(
            spec,
            ctx,
            gfd,
            component=NAME,
            daemonset_name=DAEMONSET_NAME,
            service_account_name=SERVICE_ACCOUNT,
            process=PROCESS,
            init=[wait_for_file(ctx, "toolkit-validation", TOOLKIT_READY, whole_run_nvidia=True)],
            main=main,
            operand_volumes=[
                host_path("output-dir", FEATURES_DIR),
                host_path("host-sys", "/sys"),
                run_nvidia_volume(),
            ],
            node_selector={DEPLOY_GFD_LABEL: TRUE},
            # Upstream's selector (immutable): GFD's pods are part of `nvidia-gpu`.
            selector_labels={PART_OF_LABEL: "nvidia-gpu"},
        ),
    ]


COMPONENT = Component(
    name=NAME,
    deploy_label=DEPLOY_GFD_LABEL,
    is_enabled=enabled,
    render=render,
    kinds=(*NAMESPACED_RBAC, *CLUSTER_RBAC, DAEMONSET),
    permissions=_config_manager.permissions(_ROLE_RULES),
)
