"""Work-queue keys: one per reconcile unit, so every module that wakes a unit names it
the same way (a typo would wake nothing and fail no test)."""

from __future__ import annotations

CLUSTER_KEY = "cluster"
"""The cluster pass (:mod:`gpuop.controller._cluster`): render, apply, prune, status."""
UPGRADES_KEY = "upgrades"
"""The fleet pass (:mod:`gpuop.controller._node`): upgrade slots over all nodes."""
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
"""``node/<name>``: one node's labels and upgrade step (:mod:`gpuop.controller._node`)."""


def node_key(name: str) -> str:
    return NODE_PREFIX + name
