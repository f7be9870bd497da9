"""Pure decisions the controller carries out: rollout order, driver upgrades, upgrade
slots, evictions, health remediation, driver ownership. No I/O and no clock of their own:
every input (time included) arrives in a view the controller builds from its caches, so
an operator restarted at any moment computes the same decisions from the cluster.

How the controller (gpuop/operator/controller) drives them:

- Rollout (`cluster` key): every enabled component's objects are applied on every pass
  and owned objects no enabled component renders any more are deleted. Each node's
  progress through `NODE_ORDER` is observed with `node_rollout` (a stuck node holds back
  only itself); `plan_rollout(snapshot, previous=<status.rolloutState>)` over a
  `ComponentStatus` per name in `ROLLOUT_ORDER` (the operand registry's order) summarises
  the fleet, and its `state` with the per-component states is written to the
  ClusterPolicy status when it differs.
- Upgrade slots (`upgrades` key, one serial pass over the fleet, one budget per driver
  owner): `select_nodes(...)` over `BudgetNode`s counts persisted in-progress states;
  each node in `selection.start` is started with `start_step(view, policy)`, one patch
  to `cordon-required`: the slot is that label, never memory.
- Per node (`node/<name>` key): `next_step(view, policy)` gives a `Decision` (never a
  start): its `merge_patch()` is sent first when `has_patch`, then its `action` is
  performed, and the node is looked at again after `requeue_after` seconds when set.
  Completion shows up in the caches; the next pass's guards move the node on. With
  upgrades off, `cleanup_step` hands the node back (`holds_cordon`: whose cordon it is).
- Emptying a node: `eviction.plan_removal` applies kubectl-drain rules to its pods.
- Health remediation (`remediation` key): `remediation.plan_remediation` over the fleet.
- NVIDIADrivers: `driver_owner.assign_owners` says which resource drives each node.
"""

from statemachine.budget import (
    BudgetNode,
    Selection,
    available_slots,
    select_nodes,
)
from statemachine.max_unavailable import resolve_max_unavailable
from statemachine.rollout import (
    ROLLOUT_COMPLETE,
    ROLLOUT_ORDER,
    ComponentStatus,
    RolloutPlan,
    StatePhase,
    StateProgress,
    plan_rollout,
)
from statemachine.upgrade import cleanup_step, holds_cordon, next_step, start_step
from statemachine.upgrade_keys import IN_PROGRESS_STATES, UpgradeState, parse_state
from statemachine.upgrade_views import (
    Action,
    Decision,
    DrainView,
    DriverPodView,
    NodeUpgradeView,
    PodDeletionView,
    UpgradePolicyView,
    WaitForCompletionView,
)

__all__ = [
    "IN_PROGRESS_STATES",
    "ROLLOUT_COMPLETE",
    "ROLLOUT_ORDER",
    "Action",
    "BudgetNode",
    "ComponentStatus",
    "Decision",
    "DrainView",
    "DriverPodView",
    "NodeUpgradeView",
    "PodDeletionView",
    "RolloutPlan",
    "Selection",
    "StatePhase",
    "StateProgress",
    "UpgradePolicyView",
    "UpgradeState",
    "WaitForCompletionView",
    "available_slots",
    "cleanup_step",
    "holds_cordon",
    "next_step",
    "parse_state",
    "plan_rollout",
    "resolve_max_unavailable",
    "select_nodes",
    "start_step",
]
