"""Pure state machines: cluster rollout order, per-node driver upgrade, upgrade budget. No I/O.

Driving them from the controller:

- Rollout (`cluster` key): build `{name: ComponentStatus}` for every name in
  `ROLLOUT_ORDER`, call `plan_rollout(snapshot, previous=<state from status>)`, apply
  objects of `plan.apply`, delete objects of `plan.disabled`, write `plan.state` and
  `plan.status_progress()` to the ClusterPolicy status (only when they changed).
- Upgrade slots (`cluster` key, one consistent view of all GPU nodes):
  `select_nodes([BudgetNode.from_view(v) for v in views], ...)`; call `next_step(...,
  may_start=True)` only for `selection.start`; report `selection.blocked`.
- Per node (`node/<name>` key): `d = next_step(view, policy)`; if `d.has_patch`, send
  `d.merge_patch()` first; then perform `d.action`; re-enqueue after `d.requeue_after`
  seconds if set. Completion of an action shows up in the caches, and the next pass's
  guards move the node on.
"""

from statemachine.budget import (
    BudgetNode,
    Selection,
    available_slots,
    resolve_max_unavailable,
    select_nodes,
)
from statemachine.rollout import (
    ROLLOUT_COMPLETE,
    ROLLOUT_ORDER,
    ComponentStatus,
    RolloutPlan,
    StatePhase,
    StateProgress,
    plan_rollout,
)
from statemachine.upgrade import cleanup_step, holds_cordon, next_step
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
]
