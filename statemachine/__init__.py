"""Pure state machines: cluster rollout order, per-node driver upgrade, upgrade budget. No I/O."""
