"""Work-queue keys: one per reconcile unit, so every module that wakes a unit names it
the same way (a typo would wake nothing and fail no test)."""

from __future__ import annotations

CLUSTER_KEY = "cluster"
"""The cluster pass (:mod:`gpuop.operator.controller.passes.cluster`): render, apply, prune,
status."""
UPGRADES_KEY = "upgrades"
"""The fleet pass (:mod:`gpuop.operator.controller.passes.node`): upgrade slots over all nodes."""
NVD_KEY = "nvidiadrivers"
"""The NVIDIADriver pass (:mod:`gpuop.operator.controller.passes.nvidiadriver`): owners, pools,
status."""
GC_KEY = "gpuclusters"
"""The GPUCluster pass (:mod:`gpuop.operator.controller.passes.gpucluster`): the DRA stack,
status."""
REMEDIATION_KEY = "remediation"
"""The GPU health pass (:mod:`gpuop.operator.controller.passes.remediation`)."""
STUCK_KEY = "rollout-stuck"
"""The timer that re-runs the cluster pass when a node becomes due to count as stuck
(:mod:`gpuop.operator.controller.writers.rollout_reports`; a key of its own, so dropping it never
drops a
refusal's retry)."""
FLEET_COALESCE_S = 0.5
"""How long node and driver-pod news waits for the fleet pass: a rollout brings one
per node, and a pass reads every node; upgrades take minutes, so half a second is
nothing to them and saves a pass per node. The least wait: see ``FLEET_COALESCE_FACTOR``."""
FLEET_COALESCE_MAX_S = 5.0
FLEET_COALESCE_FACTOR = 20.0
"""The fleet pass waits this many times what its last run cost (between
``FLEET_COALESCE_S`` and ``FLEET_COALESCE_MAX_S``), so it takes at most about a
twentieth of a CPU however large the fleet, as the cluster pass does."""
NODE_PREFIX = "node/"
"""``node/<name>``: one node's labels and upgrade step
(:mod:`gpuop.operator.controller.passes.node`)."""


def node_key(name: str) -> str:
    return NODE_PREFIX + name


def node_of(key: str) -> str | None:
    """The node a ``node/<name>`` key names; None for any other key."""
    return key[len(NODE_PREFIX) :] if key.startswith(NODE_PREFIX) else None
