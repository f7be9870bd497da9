"""dcgm: a standalone DCGM host engine per GPU node (off by default; the exporter embeds
its own engine unless this runs)."""

from __future__ import annotations

from typing import Any

from components._k8s import (
    VALIDATIONS_DIR,
    container,
    daemonset,
    pull_secrets,
    service_account,
    validations_volume,
    wait_for_file,
)
from components.component import Component
from components.context import Manifest, RenderContext
from components.keys import DEPLOY_DCGM_LABEL, TRUE
from crd import ClusterPolicySpec, component_image

NAME = "dcgm"
DAEMONSET_NAME = "nvidia-dcgm"
SERVICE_ACCOUNT = "nvidia-dcgm"
CONTAINER_NAME = "nvidia-dcgm-ctr"
ENGINE_PORT = 5555
"""The port nv-hostengine listens on inside the pod (exposed as `dcgm.hostPort`)."""


def enabled(spec: ClusterPolicySpec) -> bool:
    return spec.dcgm.enabled


def render(spec: ClusterPolicySpec, ctx: RenderContext) -> list[Manifest]:
    dcgm = spec.dcgm
    main = container(
        CONTAINER_NAME,
        component_image(spec, "dcgm"),
        dcgm,
        command=["nv-hostengine", "-n", "-b", "ALL"],
        extra={
            "ports": [
                {
                    "name": "dcgm",
                    "containerPort": ENGINE_PORT,
                    "hostPort": dcgm.host_port,
                    "protocol": "TCP",
                }
            ],
            "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}},
        },
    )
    pod: dict[str, Any] = {
        "serviceAccountName": SERVICE_ACCOUNT,
        "runtimeClassName": spec.operator.runtime_class,
        "initContainers": [
            wait_for_file(ctx, "toolkit-validation", f"{VALIDATIONS_DIR}/toolkit-ready")
        ],
        "containers": [main],
        "imagePullSecrets": pull_secrets(dcgm.image_pull_secrets, ctx.operator_image_pull_secrets),
        "volumes": [validations_volume()],
    }
    return [
        service_account(SERVICE_ACCOUNT, NAME, spec, ctx),
        daemonset(DAEMONSET_NAME, NAME, spec, ctx, pod, node_selector={DEPLOY_DCGM_LABEL: TRUE}),
    ]


COMPONENT = Component(name=NAME, deploy_label=DEPLOY_DCGM_LABEL, is_enabled=enabled, render=render)
