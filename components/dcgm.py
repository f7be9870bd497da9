"""dcgm: a standalone DCGM host engine per GPU node (off by default; the exporter embeds
its own engine unless this runs)."""

from __future__ import annotations

from typing import Any

from components._host_paths import run_nvidia_volume
from components._k8s import TOOLKIT_READY, wait_for_file
from components.context import RenderContext
from components.keys import DEPLOY_DCGM_LABEL
from components.operand import Operand, Pod, Port, main_container
from crd import ClusterPolicySpec

NAME = "dcgm"
SECTION = "dcgm"
DAEMONSET_NAME = "nvidia-dcgm"
SERVICE_NAME = "nvidia-dcgm"
CONTAINER_NAME = "nvidia-dcgm-ctr"
ENGINE_PORT = 5555
"""The port nv-hostengine listens on; exporters reach it through the `nvidia-dcgm`
Service, which keeps traffic on the node (`internalTrafficPolicy: Local`)."""


def _probe() -> dict[str, Any]:
    return {
        "tcpSocket": {"port": ENGINE_PORT},
        "initialDelaySeconds": 15,
        "periodSeconds": 10,
    }


def pod(spec: ClusterPolicySpec, ctx: RenderContext) -> Pod:
    main = main_container(  # the image's entrypoint runs nv-hostengine
        CONTAINER_NAME,
        spec,
        SECTION,
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
    init = [wait_for_file(ctx, "toolkit-validation", TOOLKIT_READY, whole_run_nvidia=True)]
    return Pod(containers=[main], init=init, volumes=[run_nvidia_volume()])


OPERAND = Operand(
    name=NAME,
    section=SECTION,
    daemonset=DAEMONSET_NAME,
    deploy_label=DEPLOY_DCGM_LABEL,
    pod=pod,
    # Exporters reach the engine through it, on their own node only.
    service=Port("dcgm", ENGINE_PORT, fields=lambda _spec: {"internalTrafficPolicy": "Local"}),
    gpu_container=CONTAINER_NAME,
)
COMPONENT = OPERAND.component()
