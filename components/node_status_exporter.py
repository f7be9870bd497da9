"""node-status-exporter: our node agent serving per-node validation status and GPU health
as Prometheus metrics (off by default, as upstream), with a ServiceMonitor and the
node alert rules where the Prometheus Operator's CRDs are served."""

from __future__ import annotations

from components._accounts import READ_NODES
from components._host_paths import (
    DRIVER_ROOT,
    HOST_ROOT_MOUNT,
    RUN_NVIDIA,
    VALIDATIONS_DIR,
    host_root_mount,
    host_root_volume,
    mount,
    run_nvidia_volume,
)
from components._k8s import container, env, field_env
from components.component import rule
from components.context import Manifest, RenderContext
from components.keys import DEPLOY_NODE_STATUS_EXPORTER_LABEL
from components.kinds import PROMETHEUS_RULE, SERVICE_MONITOR
from components.monitoring import monitoring_objects
from components.operand import Operand, Pod, Port
from crd import ClusterPolicySpec

NAME = "node-status-exporter"
SECTION = "nodeStatusExporter"
DAEMONSET_NAME = "nvidia-node-status-exporter"
SERVICE_NAME = "nvidia-node-status-exporter"
SERVICE_ACCOUNT = "nvidia-node-status-exporter"
CONTAINER_NAME = "nvidia-node-status-exporter"
METRICS_PORT = 8000
SERVICE_PORT_NAME = "node-status"
JOB_LABEL = "node-status"
PROMETHEUS_RULE_NAME = "nvidia-node-status-exporter-alerts"
"""Upstream's name for its node alerts (it creates them on OpenShift only)."""


def pod(spec: ClusterPolicySpec, ctx: RenderContext) -> Pod:
    root = DRIVER_ROOT if spec.driver.enabled else HOST_ROOT_MOUNT
    main = container(
        CONTAINER_NAME,
        ctx.operator_image,
        spec.node_status_exporter,
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
            host_root_mount(),
        ],
        privileged=True,
        root=True,
        extra={
            "ports": [{"name": SERVICE_PORT_NAME, "containerPort": METRICS_PORT, "protocol": "TCP"}]
        },
    )
    volumes = [run_nvidia_volume(), host_root_volume(spec)]
    return Pod(containers=[main], volumes=volumes)


def metrics_objects(spec: ClusterPolicySpec, ctx: RenderContext) -> list[Manifest]:
    """Where served, its ServiceMonitor and the node alert rules."""
    return monitoring_objects(
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


OPERAND = Operand(
    name=NAME,
    section=SECTION,
    daemonset=DAEMONSET_NAME,
    deploy_label=DEPLOY_NODE_STATUS_EXPORTER_LABEL,
    pod=pod,
    role=(
        rule("security.openshift.io", "securitycontextconstraints", "use"),
        rule("", "pods", "get list"),
        rule("apps", "daemonsets", "get list watch"),
    ),
    cluster=(READ_NODES,),
    service=Port(SERVICE_PORT_NAME, METRICS_PORT, scrape=True),
    after=metrics_objects,
    kinds=(SERVICE_MONITOR, PROMETHEUS_RULE),
    labelled_account=True,  # upstream labels the exporter's account and Role `app=<name>`
    own_image_pulls=True,  # upstream's exporter ran its own image
)
COMPONENT = OPERAND.component()
