"""dcgm: a standalone DCGM host engine per GPU node (off by default; the exporter embeds
its own engine unless this runs)."""

from __future__ import annotations

from typing import Any

from components._accounts import SCC_RULE, operand_account
from components._host_paths import run_nvidia_volume
from components._k8s import (
    TOOLKIT_READY,
    container,
    daemonset,
    gpu_access,
    pull_secrets,
    service,
    wait_for_file,
)
from components.component import Component, Permissions
from components.context import Manifest, RenderContext
from components.keys import DEPLOY_DCGM_LABEL, TRUE
from components.kinds import DAEMONSET, NAMESPACED_RBAC, SERVICE
from crd import ClusterPolicySpec, component_image

NAME = "dcgm"
DAEMONSET_NAME = "nvidia-dcgm"
SERVICE_ACCOUNT = "nvidia-dcgm"
SERVICE_NAME = "nvidia-dcgm"
CONTAINER_NAME = "nvidia-dcgm-ctr"
ENGINE_PORT = 5555
"""The port nv-hostengine listens on; exporters reach it through the `nvidia-dcgm`
Service, which keeps traffic on the node (`internalTrafficPolicy: Local`)."""


def enabled(spec: ClusterPolicySpec) -> bool:
    return spec.dcgm.enabled


def _probe() -> dict[str, Any]:
    return {
        "tcpSocket": {"port": ENGINE_PORT},
        "initialDelaySeconds": 15,
        "periodSeconds": 10,
    }


def render(spec: ClusterPolicySpec, ctx: RenderContext) -> list[Manifest]:
    dcgm = spec.dcgm
    main = container(  # the image's entrypoint runs nv-hostengine
        CONTAINER_NAME,
        component_image(spec, "dcgm"),
        dcgm,
        privileged=True,
        extra={
            "ports": [
                # No hostPort, as upstream: the engine stays off the node's IP.
                {"name": "dcgm", "containerPort": ENGINE_PORT, "protocol": "TCP"}
            ],
            "livenessProbe": _probe(),
            "readinessProbe": _probe(),
        },
    )
    runtime, nri = gpu_access(spec, CONTAINER_NAME)
    pod: dict[str, Any] = {
        "serviceAccountName": SERVICE_ACCOUNT,
        **runtime,
        "initContainers": [
            wait_for_file(ctx, "toolkit-validation", TOOLKIT_READY, whole_run_nvidia=True)
        ],
        "containers": [main],
        "imagePullSecrets": pull_secrets(dcgm.image_pull_secrets),
        "volumes": [run_nvidia_volume()],
    }
    return [
        *operand_account(SERVICE_ACCOUNT, NAME, spec, ctx, [SCC_RULE]),
        daemonset(
            DAEMONSET_NAME,
            NAME,
            spec,
            ctx,
            pod,
            node_selector={DEPLOY_DCGM_LABEL: TRUE},
            pod_annotations=nri,
            host_network=spec.dcgm.host_network,
        ),
        service(
            SERVICE_NAME,
            NAME,
            spec,
            ctx,
            app=DAEMONSET_NAME,
            port_name="dcgm",
            port=ENGINE_PORT,
            internalTrafficPolicy="Local",
        ),
    ]


COMPONENT = Component(
    name=NAME,
    deploy_label=DEPLOY_DCGM_LABEL,
    is_enabled=enabled,
    render=render,
    kinds=(*NAMESPACED_RBAC, DAEMONSET, SERVICE),
    permissions=Permissions(role=(SCC_RULE,)),
)
