"""node-status-exporter: our node agent serving per-node validation status and GPU health
as Prometheus metrics (off by default, as upstream)."""

from __future__ import annotations

from typing import Any

from components._k8s import (
    APP_LABEL,
    DRIVER_ROOT,
    HOST_ROOT_MOUNT,
    VALIDATIONS_DIR,
    container,
    daemonset,
    driver_root,
    field_env,
    host_path,
    metadata,
    mount,
    pull_secrets,
    service_account,
    validations_volume,
)
from components.component import Component
from components.context import Manifest, RenderContext
from components.keys import DEPLOY_NODE_STATUS_EXPORTER_LABEL, TRUE
from crd import ClusterPolicySpec

NAME = "node-status-exporter"
DAEMONSET_NAME = "nvidia-node-status-exporter"
SERVICE_NAME = "nvidia-node-status-exporter"
SERVICE_ACCOUNT = "nvidia-node-status-exporter"
CONTAINER_NAME = "nvidia-node-status-exporter"
METRICS_PORT = 8000
SERVICE_PORT_NAME = "node-status"


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
        env_vars=[field_env("NODE_NAME", "spec.nodeName")],
        mounts=[
            mount("run-nvidia-validations", VALIDATIONS_DIR, read_only=True),
            mount("driver-root", DRIVER_ROOT, read_only=True, propagation="HostToContainer"),
            mount("host-root", HOST_ROOT_MOUNT, read_only=True, propagation="HostToContainer"),
        ],
        privileged=True,
        extra={"ports": [{"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}]},
    )
    main["imagePullPolicy"] = ctx.operator_image_pull_policy
    pod: dict[str, Any] = {
        "serviceAccountName": SERVICE_ACCOUNT,
        "containers": [main],
        "imagePullSecrets": pull_secrets(
            ctx.operator_image_pull_secrets, section.image_pull_secrets
        ),
        "volumes": [
            validations_volume(),
            host_path("driver-root", driver_root(spec), "DirectoryOrCreate"),
            host_path("host-root", spec.host_paths.root_fs),
        ],
    }
    service_meta = metadata(SERVICE_NAME, NAME, spec, ctx)
    service_meta["labels"][APP_LABEL] = DAEMONSET_NAME
    return [
        service_account(SERVICE_ACCOUNT, NAME, spec, ctx),
        daemonset(
            DAEMONSET_NAME,
            NAME,
            spec,
            ctx,
            pod,
            node_selector={DEPLOY_NODE_STATUS_EXPORTER_LABEL: TRUE},
        ),
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": service_meta,
            "spec": {
                "selector": {APP_LABEL: DAEMONSET_NAME},
                "ports": [
                    {
                        "name": SERVICE_PORT_NAME,
                        "port": METRICS_PORT,
                        "targetPort": METRICS_PORT,
                        "protocol": "TCP",
                    }
                ],
            },
        },
    ]


COMPONENT = Component(
    name=NAME, deploy_label=DEPLOY_NODE_STATUS_EXPORTER_LABEL, is_enabled=enabled, render=render
)
