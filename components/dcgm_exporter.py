"""dcgm-exporter: per-GPU metrics for Prometheus, its Service, and optionally a
ServiceMonitor (only when asked for and the Prometheus Operator's CRD exists, since the
API server refuses objects of an unknown kind)."""

from __future__ import annotations

from typing import Any

from components import dcgm
from components._accounts import SCC_RULE
from components._host_paths import (
    config_map_volume,
    host_path,
    kubelet_path,
    mount,
    run_nvidia_volume,
)
from components._k8s import APP_LABEL, TOOLKIT_READY, env, field_env, wait_for_file
from components.component import rule
from components.context import Manifest, RenderContext
from components.keys import DEPLOY_DCGM_EXPORTER_LABEL
from components.kinds import SERVICE_MONITOR
from components.monitoring import service_monitor
from components.operand import Grant, Operand, Pod, Port, main_container
from crd import ClusterPolicySpec

NAME = "dcgm-exporter"
SECTION = "dcgmExporter"
DAEMONSET_NAME = "nvidia-dcgm-exporter"
SERVICE_NAME = "nvidia-dcgm-exporter"
SERVICE_ACCOUNT = "nvidia-dcgm-exporter"
CONTAINER_NAME = "nvidia-dcgm-exporter"
METRICS_PORT = 9400
SERVICE_PORT_NAME = "gpu-metrics"
CUSTOM_METRICS_DIR = "/etc/dcgm-exporter/custom"
POD_RESOURCES_DIR = "/var/lib/kubelet/pod-resources"
"""Where the exporter looks for the kubelet's pod-resources socket (in its container)."""
READ_PODS = "nvidia-dcgm-exporter-read-pods"
"""Upstream's ClusterRole (and binding) letting the exporter read pods cluster-wide."""
READ_PODS_RULES = (rule("", "pods", "get list watch"),)
DEFAULT_JOB_MAPPING_DIR = "/var/lib/dcgm-exporter/job-mapping"
"""Upstream's `DefaultDCGMJobMappingDir`: HPC job files when the policy names no directory."""
POD_LABELS_ENV = "DCGM_EXPORTER_KUBERNETES_ENABLE_POD_LABELS"
POD_UID_ENV = "DCGM_EXPORTER_KUBERNETES_ENABLE_POD_UID"
ALLOWLIST_ENV = "DCGM_EXPORTER_KUBERNETES_POD_LABEL_ALLOWLIST_REGEX"
CONFIG_MAP_DATA_ENV = "DCGM_EXPORTER_CONFIGMAP_DATA"
"""`namespace:name` of a ConfigMap the exporter reads its metrics from, through the API."""
DEFAULT_COLLECTORS = "/etc/dcgm-exporter/dcp-metrics-included.csv"
"""The image's own metric list (DCP profiling metrics included)."""


def _health_probe(*, period_seconds: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": "/health", "port": METRICS_PORT, "scheme": "HTTP"},
        "initialDelaySeconds": 45,
        "periodSeconds": period_seconds,
        "timeoutSeconds": 1,
        "successThreshold": 1,
        "failureThreshold": 3,
    }


def _user_env(spec: ClusterPolicySpec) -> dict[str, str]:
    return {v.name: v.value or "" for v in spec.dcgm_exporter.env or ()}


def reads_pods(spec: ClusterPolicySpec) -> bool:
    """Whether the exporter labels metrics with the pods using the GPUs (the policy's
    switches, or the same env vars set by hand): it then needs to read pods
    cluster-wide, as upstream's `rbacGates` grant it."""
    exporter = spec.dcgm_exporter
    user = _user_env(spec)
    return bool(
        exporter.enable_pod_labels
        or exporter.enable_pod_uid
        or any(user.get(name, "").lower() == "true" for name in (POD_LABELS_ENV, POD_UID_ENV))
    )


def uses_api(spec: ClusterPolicySpec) -> bool:
    """Whether the exporter talks to the API server (pods, or a metrics ConfigMap named
    in its env), so its pods need their service account token."""
    return reads_pods(spec) or _user_env(spec).get(CONFIG_MAP_DATA_ENV, "") not in ("", "none")


def job_mapping_dir(spec: ClusterPolicySpec) -> str | None:
    """The HPC job mapping directory when the mapping is on, else None."""
    mapping = spec.dcgm_exporter.hpc_job_mapping
    if mapping is None or not mapping.enabled:
        return None
    return mapping.directory or DEFAULT_JOB_MAPPING_DIR


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
    jobs = job_mapping_dir(spec)
    if jobs is not None:
        variables.append(env("DCGM_HPC_JOB_MAPPING_DIR", jobs))
    if exporter.enable_pod_labels:
        variables.append(env(POD_LABELS_ENV, "true"))
    if exporter.enable_pod_uid:
        variables.append(env(POD_UID_ENV, "true"))
    if exporter.pod_label_allowlist_regex:
        variables.append(env(ALLOWLIST_ENV, ",".join(exporter.pod_label_allowlist_regex)))
    return variables


def pod(spec: ClusterPolicySpec, ctx: RenderContext) -> Pod:
    exporter = spec.dcgm_exporter
    mounts = [mount("pod-gpu-resources", POD_RESOURCES_DIR, read_only=True)]
    volumes = [
        host_path("pod-gpu-resources", kubelet_path(spec, "pod-resources")),
        run_nvidia_volume(None),
    ]
    jobs = job_mapping_dir(spec)
    if jobs is not None:
        mounts.append(mount("hpc-job-mapping", jobs, read_only=True))
        volumes.append(host_path("hpc-job-mapping", jobs, "DirectoryOrCreate"))
    if exporter.config and exporter.config.name:
        mounts.append(mount("metrics-config", CUSTOM_METRICS_DIR, read_only=True))
        volumes.append(config_map_volume("metrics-config", exporter.config.name))
    main = main_container(
        CONTAINER_NAME,
        spec,
        SECTION,
        env_vars=_env(spec),
        mounts=mounts,
        extra={
            "ports": [{"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}],
            # Upstream's: a hung exporter is restarted, and drops out of the Service
            # while it starts (it needs DCGM up first).
            "livenessProbe": _health_probe(period_seconds=5),
            "readinessProbe": _health_probe(period_seconds=10),
        },
        privileged=True,
    )
    fields: dict[str, Any] = {"automountServiceAccountToken": uses_api(spec)}
    if exporter.host_pid:
        fields["hostPID"] = True
    return Pod(
        containers=[main],
        init=[wait_for_file(ctx, "toolkit-validation", TOOLKIT_READY, whole_run_nvidia=True)],
        volumes=volumes,
        fields=fields,
        annotations=exporter.annotations or {},
    )


def _service_fields(spec: ClusterPolicySpec) -> dict[str, Any]:
    """`dcgmExporter.service`: the Service's type and traffic policy."""
    settings = spec.dcgm_exporter.service
    fields: dict[str, Any] = {
        "type": (settings.type if settings and settings.type else "ClusterIP"),
    }
    if settings and settings.internal_traffic_policy:
        fields["internalTrafficPolicy"] = settings.internal_traffic_policy
    return fields


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


def _monitors(spec: ClusterPolicySpec, ctx: RenderContext) -> list[Manifest]:
    monitor = _service_monitor(spec, ctx)
    return [] if monitor is None else [monitor]


OPERAND = Operand(
    name=NAME,
    section=SECTION,
    daemonset=DAEMONSET_NAME,
    deploy_label=DEPLOY_DCGM_EXPORTER_LABEL,
    pod=pod,
    # The exporter can read a metrics list from a ConfigMap in its namespace.
    role=(SCC_RULE, rule("", "configmaps", "get list")),
    grants=(Grant(READ_PODS, READ_PODS_RULES, reads_pods),),
    service=Port(SERVICE_PORT_NAME, METRICS_PORT, scrape=True, fields=_service_fields),
    after=_monitors,
    kinds=(SERVICE_MONITOR,),
    gpu_container=CONTAINER_NAME,
    labelled_account=True,  # upstream labels the exporter's account and Role `app=<name>`
)
COMPONENT = OPERAND.component()
