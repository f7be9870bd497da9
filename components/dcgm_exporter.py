"""dcgm-exporter: per-GPU metrics for Prometheus, its Service, and optionally a
ServiceMonitor (only when asked for and the Prometheus Operator's CRD exists, since the
API server refuses objects of an unknown kind)."""

from __future__ import annotations

from typing import Any

from components import dcgm
from components._k8s import (
    APP_LABEL,
    SCC_RULE,
    TOOLKIT_READY,
    config_map_volume,
    container,
    daemonset,
    env,
    field_env,
    host_path,
    metadata,
    mount,
    pull_secrets,
    role_and_binding,
    run_nvidia_volume,
    service_account,
    wait_for_file,
)
from components.component import Component, Permissions
from components.context import Manifest, RenderContext
from components.keys import DEPLOY_DCGM_EXPORTER_LABEL, TRUE
from components.kinds import DAEMONSET, NAMESPACED_RBAC, SERVICE, SERVICE_MONITOR
from components.monitoring import service_monitor
from crd import ClusterPolicySpec, component_image

NAME = "dcgm-exporter"
DAEMONSET_NAME = "nvidia-dcgm-exporter"
SERVICE_NAME = "nvidia-dcgm-exporter"
SERVICE_ACCOUNT = "nvidia-dcgm-exporter"
CONTAINER_NAME = "nvidia-dcgm-exporter"
METRICS_PORT = 9400
SERVICE_PORT_NAME = "gpu-metrics"
CUSTOM_METRICS_DIR = "/etc/dcgm-exporter/custom"
POD_RESOURCES_DIR = "/var/lib/kubelet/pod-resources"
DEFAULT_COLLECTORS = "/etc/dcgm-exporter/dcp-metrics-included.csv"
"""The image's own metric list (DCP profiling metrics included)."""
_ROLE_RULES = [
    SCC_RULE,
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]},
]
"""The exporter can read a metrics list from a ConfigMap in its namespace."""


def enabled(spec: ClusterPolicySpec) -> bool:
    return spec.dcgm_exporter.enabled


def _env(spec: ClusterPolicySpec) -> list[dict[str, Any]]:
    exporter = spec.dcgm_exporter
    collectors = (
        f"{CUSTOM_METRICS_DIR}/dcgm-metrics.csv"
        if exporter.config and exporter.config.name
        else DEFAULT_COLLECTORS
    )
    variables = [
        env("DCGM_EXPORTER_LISTEN", f":{METRICS_PORT}"),
        env("DCGM_EXPORTER_KUBERNETES", "true"),
        env("DCGM_EXPORTER_COLLECTORS", collectors),
        field_env("NODE_NAME", "spec.nodeName"),
    ]
    if spec.dcgm.enabled:  # the standalone host engine on this node, through its Service
        variables.append(
            env("DCGM_REMOTE_HOSTENGINE_INFO", f"{dcgm.SERVICE_NAME}:{dcgm.ENGINE_PORT}")
        )
    return variables


def _daemonset(spec: ClusterPolicySpec, ctx: RenderContext) -> Manifest:
    exporter = spec.dcgm_exporter
    mounts = [mount("pod-gpu-resources", POD_RESOURCES_DIR, read_only=True)]
    volumes = [host_path("pod-gpu-resources", POD_RESOURCES_DIR), run_nvidia_volume(None)]
    if exporter.config and exporter.config.name:
        mounts.append(mount("metrics-config", CUSTOM_METRICS_DIR, read_only=True))
        volumes.append(config_map_volume("metrics-config", exporter.config.name))
    main = container(
        CONTAINER_NAME,
        component_image(spec, "dcgmExporter"),
        exporter,
        env_vars=_env(spec),
        mounts=mounts,
        extra={
            "ports": [{"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}],
        },
        privileged=True,
    )
    pod: dict[str, Any] = {
        "serviceAccountName": SERVICE_ACCOUNT,
        "runtimeClassName": spec.operator.runtime_class,
        "automountServiceAccountToken": False,
        "initContainers": [
            wait_for_file(ctx, "toolkit-validation", TOOLKIT_READY, whole_run_nvidia=True)
        ],
        "containers": [main],
        "imagePullSecrets": pull_secrets(
            exporter.image_pull_secrets, ctx.operator_image_pull_secrets
        ),
        "volumes": volumes,
    }
    return daemonset(
        DAEMONSET_NAME, NAME, spec, ctx, pod, node_selector={DEPLOY_DCGM_EXPORTER_LABEL: TRUE}
    )


def _service(spec: ClusterPolicySpec, ctx: RenderContext) -> Manifest:
    settings = spec.dcgm_exporter.service
    service_spec: dict[str, Any] = {
        "type": (settings.type if settings and settings.type else "ClusterIP"),
        "selector": {APP_LABEL: DAEMONSET_NAME},
        "ports": [
            {
                "name": SERVICE_PORT_NAME,
                "port": METRICS_PORT,
                "targetPort": METRICS_PORT,
                "protocol": "TCP",
            }
        ],
    }
    if settings and settings.internal_traffic_policy:
        service_spec["internalTrafficPolicy"] = settings.internal_traffic_policy
    meta = metadata(SERVICE_NAME, NAME, spec, ctx)
    meta["labels"][APP_LABEL] = DAEMONSET_NAME
    meta["annotations"] = {"prometheus.io/scrape": "true"}
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": service_spec}


def _service_monitor(spec: ClusterPolicySpec, ctx: RenderContext) -> Manifest | None:
    monitor = spec.dcgm_exporter.service_monitor
    if monitor is None or not monitor.enabled or not ctx.service_monitor_crd:
        return None
    return service_monitor(
        SERVICE_NAME,
        NAME,
        spec,
        ctx,
        app=DAEMONSET_NAME,
        port=SERVICE_PORT_NAME,
        job_label=APP_LABEL,
        settings=monitor,
    )


def render(spec: ClusterPolicySpec, ctx: RenderContext) -> list[Manifest]:
    objects = [
        service_account(SERVICE_ACCOUNT, NAME, spec, ctx),
        *role_and_binding(SERVICE_ACCOUNT, NAME, spec, ctx, _ROLE_RULES),
        _daemonset(spec, ctx),
        _service(spec, ctx),
    ]
    monitor = _service_monitor(spec, ctx)
    if monitor is not None:
        objects.append(monitor)
    return objects


COMPONENT = Component(
    name=NAME,
    deploy_label=DEPLOY_DCGM_EXPORTER_LABEL,
    is_enabled=enabled,
    render=render,
    kinds=(*NAMESPACED_RBAC, DAEMONSET, SERVICE, SERVICE_MONITOR),
    permissions=Permissions(role=tuple(_ROLE_RULES)),
)
