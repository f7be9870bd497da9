"""node-status-exporter: our node agent serving per-node validation status and GPU health
as Prometheus metrics (off by default, as upstream), with a ServiceMonitor and the
node alert rules where the Prometheus Operator's CRDs are served."""

from __future__ import annotations

from typing import Any

from components._accounts import (
    READ_NODES,
    operand_account,
)
from components._host_paths import (
    DRIVER_ROOT,
    HOST_ROOT_MOUNT,
    RUN_NVIDIA,
    VALIDATIONS_DIR,
    host_path,
    mount,
    run_nvidia_volume,
)
from components._k8s import container, daemonset, env, field_env, service
from components.component import Component, Permissions
from components.context import Manifest, RenderContext
from components.keys import DEPLOY_NODE_STATUS_EXPORTER_LABEL, TRUE
from components.kinds import (
    CLUSTER_RBAC,
    DAEMONSET,
    NAMESPACED_RBAC,
    PROMETHEUS_RULE,
    SERVICE,
    SERVICE_MONITOR,
)
from components.monitoring import monitoring_objects
from crd import ClusterPolicySpec

NAME = "node-status-exporter"
DAEMONSET_NAME = "nvidia-node-status-exporter"
SERVICE_NAME = "nvidia-node-status-exporter"
SERVICE_ACCOUNT = "nvidia-node-status-exporter"
CONTAINER_NAME = "nvidia-node-status-exporter"
METRICS_PORT = 8000
SERVICE_PORT_NAME = "node-status"
JOB_LABEL = "node-status"
PROMETHEUS_RULE_NAME = "nvidia-node-status-exporter-alerts"
"""Upstream's name for its node alerts (it creates them on OpenShift only)."""
_ROLE_RULES = [
    {
        "apiGroups": ["security.openshift.io"],
        "resources": ["securitycontextconstraints"],
        "verbs": ["use"],
    },
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
    {"apiGroups": ["apps"], "resources": ["daemonsets"], "verbs": ["get", "list", "watch"]},
]


def enabled(spec: ClusterPolicySpec) -> bool:
    return spec.node_status_exporter.enabled


def render(spec: ClusterPolicySpec, ctx: RenderContext) -> list[Manifest]:
    section = spec.node_status_exporter
    root = DRIVER_ROOT if spec.driver.enabled else HOST_ROOT_MOUNT
    main = container(
        CONTAINER_NAME,
        ctx.operator_image,
        section,
        command=[
            "gpuop",
            "node-agent",
            "export",
            "--port",
            str(METRICS_PORT),
            "--driver-root",
            root,
            "--validations-dir",
            VALIDATIONS_DIR,
        ],
        env_vars=[
            env("NVIDIA_VISIBLE_DEVICES", "void"),
            field_env("NODE_NAME", "spec.nodeName"),
            field_env("OPERATOR_NAMESPACE", "metadata.namespace"),
        ],
        # /run/nvidia holds both the validations and the driver container's root.
        mounts=[
            mount("run-nvidia", RUN_NVIDIA, propagation="HostToContainer"),
            mount("host-root", HOST_ROOT_MOUNT, read_only=True, propagation="HostToContainer"),
        ],
        privileged=True,
        root=True,
        extra={
            "ports": [{"name": SERVICE_PORT_NAME, "containerPort": METRICS_PORT, "protocol": "TCP"}]
        },
    )
    pod: dict[str, Any] = {
        "serviceAccountName": SERVICE_ACCOUNT,
        "containers": [main],
        "volumes": [run_nvidia_volume(), host_path("host-root", spec.host_paths.root_fs)],
    }
    objects = [
        # Upstream labels the exporter's account and namespaced RBAC `app=<name>`.
        *operand_account(
            SERVICE_ACCOUNT, NAME, spec, ctx, _ROLE_RULES, [READ_NODES], app=SERVICE_ACCOUNT
        ),
        daemonset(
            DAEMONSET_NAME,
            NAME,
            spec,
            ctx,
            pod,
            node_selector={DEPLOY_NODE_STATUS_EXPORTER_LABEL: TRUE},
            host_network=spec.node_status_exporter.host_network,
            replaced_image=section,  # upstream's exporter ran its own image
        ),
        service(
            SERVICE_NAME,
            NAME,
            spec,
            ctx,
            app=DAEMONSET_NAME,
            port_name=SERVICE_PORT_NAME,
            port=METRICS_PORT,
            scrape=True,
        ),
    ]
    objects += monitoring_objects(
        NAME,
        spec,
        ctx,
        app=DAEMONSET_NAME,
        monitor_name=SERVICE_NAME,
        port=SERVICE_PORT_NAME,
        job_label=JOB_LABEL,
        rule_name=PROMETHEUS_RULE_NAME,
        node=True,
        settings=spec.node_status_exporter.service_monitor,
    )
    return objects


COMPONENT = Component(
    name=NAME,
    deploy_label=DEPLOY_NODE_STATUS_EXPORTER_LABEL,
    is_enabled=enabled,
    render=render,
    kinds=(*NAMESPACED_RBAC, *CLUSTER_RBAC, DAEMONSET, SERVICE, SERVICE_MONITOR, PROMETHEUS_RULE),
    permissions=Permissions(role=tuple(_ROLE_RULES), cluster=(READ_NODES,)),
)
