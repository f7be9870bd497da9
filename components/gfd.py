"""gpu-feature-discovery: publishes GPU model, memory, MIG capability... as node labels
through NFD's feature files. Shares the device plugin's config (and config-manager)."""

from __future__ import annotations

from typing import Any

from components import _config_manager
from components._k8s import (
    READ_NODES,
    VALIDATIONS_DIR,
    cluster_role_and_binding,
    container,
    daemonset,
    env,
    field_env,
    host_path,
    mount,
    pull_secrets,
    service_account,
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
    containers = [main]
    pod: dict[str, Any] = {
        "serviceAccountName": SERVICE_ACCOUNT,
        "runtimeClassName": spec.operator.runtime_class,
    }
    if with_config:
        init.append(_config_manager.init_container(spec, PROCESS))
        containers.append(_config_manager.sidecar(spec, PROCESS))
        volumes += _config_manager.volumes(spec)
        pod["shareProcessNamespace"] = True
    pod.update(
        {
            "initContainers": init,
            "containers": containers,
            "imagePullSecrets": pull_secrets(
                gfd.image_pull_secrets, ctx.operator_image_pull_secrets
            ),
            "volumes": volumes,
        }
    )
    objects = [service_account(SERVICE_ACCOUNT, NAME, spec, ctx)]
    if with_config:
        objects += cluster_role_and_binding(SERVICE_ACCOUNT, NAME, spec, ctx, [READ_NODES])
    objects.append(
        daemonset(DAEMONSET_NAME, NAME, spec, ctx, pod, node_selector={DEPLOY_GFD_LABEL: TRUE})
    )
    return objects


COMPONENT = Component(name=NAME, deploy_label=DEPLOY_GFD_LABEL, is_enabled=enabled, render=render)
