"""`spec.driver.upgradePolicy`: how a driver change rolls across the fleet.

Kept apart from the other sections because the upgrade state machine reads nothing else,
and its defaults (one node at a time, at most 25% unavailable, five-minute timeouts) are
what stop a driver bump from taking out a whole cluster.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from crd._common import IntOrPercent, K8sModel


class WaitForCompletionSpec(K8sModel):
    """Wait for selected jobs to finish on a node before its driver is replaced."""

    pod_selector: str | None = None
    """Label selector (`app=batch,tier!=web`) of the pods to wait for; none when empty."""
    timeout_seconds: Annotated[int, Field(ge=0)] = 0
    """Give up waiting after this many seconds and go on; 0 waits forever."""


class PodDeletionSpec(K8sModel):
    """Delete the pods that use GPUs on a node before its driver is replaced."""

    force: bool = False
    """Also delete pods that no controller manages (they will not come back)."""
    timeout_seconds: Annotated[int, Field(ge=0)] = 300
    """Seconds to wait for the pods to go; 0 waits forever."""
    delete_empty_dir: bool = False
    """Also delete pods with emptyDir volumes (their data is lost)."""


class DrainSpec(K8sModel):
    """Drain the whole node when deleting the GPU pods is not enough."""

    enable: bool = False
    """Drain the node (evict every pod but DaemonSet ones) before the driver is replaced."""
    force: bool = False
    """Also evict pods that no controller manages."""
    pod_selector: str | None = None
    """Label selector limiting which pods are evicted; all when empty."""
    timeout_seconds: Annotated[int, Field(ge=0)] = 300
    """Seconds to wait for the drain; 0 waits forever."""
    delete_empty_dir: bool = False
    """Also evict pods with emptyDir volumes (their data is lost)."""


class DriverUpgradePolicySpec(K8sModel):
    """Rolling driver upgrades: how many nodes at once and how each node is emptied."""

    auto_upgrade: bool = False
    """Let the operator upgrade drivers node by node; off (upstream's default) leaves them
    to the admin."""
    max_parallel_upgrades: Annotated[int, Field(ge=0)] = 1
    """Nodes upgraded at the same time; 0 means no limit."""
    max_unavailable: IntOrPercent = "25%"
    """Nodes (or percentage of GPU nodes, rounded up) that may be unavailable at once."""
    wait_for_completion: WaitForCompletionSpec = Field(default_factory=WaitForCompletionSpec)
    """Wait for running jobs first."""
    pod_deletion: PodDeletionSpec = Field(default_factory=PodDeletionSpec)
    """Delete GPU pods first."""
    drain: DrainSpec = Field(default_factory=DrainSpec)
    """Drain the node first."""


class CanarySpec(K8sModel):
    """Upgrade a few nodes first and let them run a while before the rest (gpuop)."""

    nodes: Annotated[int, Field(ge=1)] = 1
    """How many nodes upgrade first; the rest wait until these validated and soaked."""
    soak_seconds: Annotated[int, Field(ge=0)] = 0
    """Seconds the canary nodes must run the new driver, validated, before others start."""


class ClusterDriverUpgradePolicySpec(DriverUpgradePolicySpec):
    """The ClusterPolicy's (and an NVIDIADriver's) upgrade policy: upstream's fields plus
    gpuop's rollout gate.

    Both extensions are optional; absent, upgrades behave as upstream's. Their state
    lives on the resource (an annotation and a condition), never in memory.
    """

    canary: CanarySpec | None = None
    """gpuop extension: upgrade this many nodes first and soak them before the rest."""
    halt_after_failures: Annotated[int, Field(ge=1)] | None = None
    """gpuop extension: start no new node upgrades once this many nodes reached
    upgrade-failed in this rollout; resume with the gpuop.io/driver-upgrade-resume
    annotation on the ClusterPolicy, or by changing the driver again."""
    rollback_on_halt: bool | None = None
    """gpuop extension: once a halt stops the rollout, put the canary and failed nodes
    back on the driver revision the rest of the fleet still runs, through the same
    cordon, drain, restart and validation; the resume annotation retries the new
    driver."""
