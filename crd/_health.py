"""`spec.healthRemediation`: what the operator does with a node whose GPUs are unhealthy.

A gpuop extension (upstream NVIDIA ships remediation as a separate system), so the
section is optional and absent from every upstream policy: a policy without it, or with
``enabled: false``, behaves exactly as upstream. The limits mirror what the remediation
systems people run today enforce: a circuit breaker on the share of nodes quarantined
(NVSentinel, EKS node repair, NodeHealthCheck ``minHealthy``), a settle time before a
node is trusted again, and a dry run that only reports.

There are no drain flags here on purpose: ``action: drain`` empties a node by kubectl
drain's rules with ``driver.upgradePolicy.drain``'s flags (``force``,
``deleteEmptyDir``, ``podSelector``), so a quarantine never removes a pod the
administrator's drain settings keep.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from crd._common import IntOrPercent, K8sModel

RemediationAction = Literal["taint", "cordon", "drain"]


class HealthRemediationSpec(K8sModel):
    """Quarantine GPU nodes whose `GPUHealthy` node condition is False."""

    enabled: bool = False
    """Act on the `GPUHealthy` condition the node agent reports; off changes nothing."""
    dry_run: bool = False
    """Only report (log, Event, metric) what would be done; nodes are left untouched."""
    action: RemediationAction = "taint"
    """taint (`nvidia.com/gpu.health`), cordon (taint and cordon) or drain (also evict pods)."""
    max_unhealthy: IntOrPercent = "10%"
    """GPU nodes (or percentage, rounded down) quarantined at most; beyond it remediation pauses."""
    settle_seconds: Annotated[int, Field(ge=0)] = 300
    """Seconds `GPUHealthy` must stay True before the quarantine is lifted."""
