"""gpu-feature-discovery: publishes GPU model, memory, MIG capability... as node labels
through NFD's feature files. Shares the device plugin's config (and config-manager)."""

from __future__ import annotations

from components import _config_manager
from components._k8s import (
    VALIDATIONS_DIR,
    container,
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
from components.keys import DEPLOY_GFD_LABEL, TRUE
from crd import ClusterPolicySpec, component_image

NAME = "gpu-feature-discovery"
DAEMONSET_NAME = "gpu-feature-discovery"
SERVICE_ACCOUNT = "nvidia-gpu-feature-discovery"
CONTAINER_NAME = "gpu-feature-discovery"
PROCESS = "gpu-feature-discovery"
FEATURES_DIR = "/etc/kubernetes/node-feature-discovery/features.d"


def enabled(spec: ClusterPolicySpec) -> bool:
    return spec.gfd.enabled


def render(spec: ClusterPolicySpec, ctx: RenderContext) -> list[Manifest]:
    gfd = spec.gfd
    with_config = _config_manager.configured(spec)
    env_vars = [
        env("MIG_STRATEGY", spec.mig.strategy),
        env("GFD_SLEEP_INTERVAL", "60s"),
        env("GFD_FAIL_ON_INIT_ERROR", "true"),
        env("NVIDIA_MIG_MONITOR_DEVICES", "all"),
        field_env("NODE_NAME", "spec.nodeName"),
    ]
    mounts = [
        mount("output-dir", FEATURES_DIR),
        mount("host-sys", "/sys", read_only=True),
    ]
    volumes = [
        host_path("output-dir", FEATURES_DIR, "DirectoryOrCreate"),
        host_path("host-sys", "/sys"),
        validations_volume(),
    ]
    init = [wait_for_file(ctx, "toolkit-validation", f"{VALIDATIONS_DIR}/toolkit-ready")]
    if with_config:
        env_vars.append(env("CONFIG_FILE", _config_manager.CONFIG_FILE))
        mounts.append(_config_manager.operand_mount())
    main = container(
        CONTAINER_NAME,
        component_image(spec, "gfd"),
        gfd,
        command=[PROCESS],
        env_vars=env_vars,
        mounts=mounts,
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
            "imagePullSecrets": pull_secrets(
                gfd.image_pull_secrets, ctx.operator_image_pull_secrets
            ),
        },
        init=init,
        main=main,
        operand_volumes=volumes,
        node_selector={DEPLOY_GFD_LABEL: TRUE},
    )


COMPONENT = Component(name=NAME, deploy_label=DEPLOY_GFD_LABEL, is_enabled=enabled, render=render)
