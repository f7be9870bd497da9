"""Mark a simulated node's GPUs healthy or not, as its node agent would (demos, tests).

Simulated nodes have no GPUs and no node agent; this writes the same `GPUHealthy`
condition the agent writes (a strategic merge patch of that one condition, which kwok's
own node status updates leave alone).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpuop.nodeagent.health import (
    CONDITION_TYPE,
    REASON_HEALTHY,
    KubernetesNodeStatus,
    Verdict,
    condition,
    status_patch,
)

DEFAULT_UNHEALTHY_REASON = "XidCritical"
DEFAULT_UNHEALTHY_MESSAGE = "GPU 0: XID 79 (GPU has fallen off the bus) [simulated]"


def verdict_for(status: str, reason: str | None, message: str | None) -> Verdict:
    """The condition to write for ``status`` True, False or Unknown."""
    if status == "True":
        return Verdict("True", reason or REASON_HEALTHY, message or "no GPU faults")
    if status == "False":
        return Verdict(
            "False", reason or DEFAULT_UNHEALTHY_REASON, message or DEFAULT_UNHEALTHY_MESSAGE
        )
    return Verdict("Unknown", reason or "NvmlUnavailable", message or "set by gpuop cluster")


async def mark_gpu_health(api: Any, node: str, verdict: Verdict) -> dict[str, str]:
    """Write the condition (keeping lastTransitionTime if the status stays) and return it."""
    nodes = KubernetesNodeStatus(api)
    previous = await nodes.node_condition(node, CONDITION_TYPE)
    cond = condition(verdict, previous, datetime.now(UTC))
    await nodes.patch_node_status(node, status_patch(cond))
    return cond


async def mark_gpu_health_with_kubeconfig(
    kubeconfig: Path, node: str, verdict: Verdict
) -> dict[str, str]:
    from gpuop.kube.client import api_client

    async with api_client(kubeconfig) as api:
        return await mark_gpu_health(api, node, verdict)
