"""Settings of one operator process (CLI flags and environment)."""

from __future__ import annotations

from dataclasses import dataclass

from gpuop.operator.leader import DEFAULT_LEASES
from statemachine.preflight import Mode

DEFAULT_NAMESPACE = "gpu-operator"
DEFAULT_OPERATOR_IMAGE = "ghcr.io/gpuop/gpuop:0.1.0"


@dataclass(frozen=True)
class OperatorConfig:
    namespace: str = DEFAULT_NAMESPACE
    operator_image: str = DEFAULT_OPERATOR_IMAGE
    operator_image_pull_policy: str | None = None
    """How nodes pull the operator image (the chart's `operator.imagePullPolicy`):
    `components.context.RenderContext.operator_image_pull_policy`."""
    operator_image_pull_secrets: tuple[str, ...] = ()
    """Secrets that pull it (the chart's `operator.imagePullSecrets`), added to every
    operand pod that runs it."""
    workers: int = 8
    metrics_host: str = "0.0.0.0"  # a pod serves on its own IP
    metrics_port: int = 8080
    probe_port: int = 8081
    leader_elect: bool = False
    lease_names: tuple[str, ...] = DEFAULT_LEASES
    """Held together (see `gpuop.operator.leader.Leases`): NVIDIA's operator's Lease first."""
    node_stuck_seconds: float = 600.0
    """A GPU node waiting this long for a missing or unready operand pod is named as
    stuck (status message, NodesNotReady Event, gpu_operator_nodes_not_ready)."""
    upgrade_preflight: Mode = Mode.OFF
    """Ask the registry for a driver pool's images before its upgrade wave
    (``statemachine.preflight.Mode``; the chart's ``operator.upgradePreflight``, default
    ``hold``). Off here: the local simulated cluster's images are in no registry."""
