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
nothing to them and saves a pass per node."""
NODE_PREFIX = "node/"
"""``node/<name>``: one node's labels and upgrade step (:mod:`gpuop.controller._node`)."""


def node_key(name: str) -> str:
    return NODE_PREFIX + name
