"""What each driver upgrade state does, how long it may last and how it fails: data.

One entry per state: the side effect the controller performs while a node rests
there, the words for it, the policy field that bounds the state (a node waiting
longer fails or, for wait-for-jobs, moves on) and the failure reason written when
the state gives up. `upgrade.py` builds the machine's states from this table,
`next_step` reads action, timeout and reason from it, and the docs diagram prints
it beside each state, so the three cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from statemachine import upgrade_guards as g
from statemachine._fsm import StateDef
from statemachine.upgrade_keys import REASON_ANNOTATION, UpgradeState
from statemachine.upgrade_views import Action, UpgradePolicyView

S = UpgradeState
Words = Callable[[g.GuardContext], str]


@dataclass(frozen=True)
class PolicyTimeout:
    """The policy field bounding a state: its name (for people) and how to read it.
    0 seconds means no bound, as in the policy."""

    field: str
    seconds: Callable[[UpgradePolicyView], int]


@dataclass(frozen=True)
class UpgradeStateDef(StateDef):
    """One row of the upgrade table.

    `refine` picks a different action within the state (pod-restart-required restarts
    the old pod first, then waits for the new one); None keeps `action`.
    """

    action: Action = Action.NONE
    says: Words = lambda ctx: ""
    timeout: PolicyTimeout | None = None
    failure: Words | None = None
    refine: Callable[[g.GuardContext], tuple[Action, str] | None] | None = None

    def act(self, ctx: g.GuardContext) -> tuple[Action, str]:
        """The side effect and its words for a node resting in this state."""
        refined = self.refine(ctx) if self.refine is not None else None
        return refined if refined is not None else (self.action, self.says(ctx))

    def describe(self) -> str:
        parts = [f"action {self.action.value}"] if self.action is not Action.NONE else []
        if parts and self.refine is not None and self.refine.__doc__:
            parts[0] += f" ({self.refine.__doc__.strip().rstrip('.')})"
        if self.timeout is not None:
            parts.append(f"bounded by {self.timeout.field}")
        if self.failure is not None and self.failure.__doc__:
            parts.append(f"fails with {self.failure.__doc__.strip().rstrip('.')}")
        return ", ".join(parts)


# --- failure reasons ------------------------------------------------------------------


def _listing(items: tuple[str, ...], limit: int = 5) -> str:
    shown = "; ".join(items[:limit])
    return shown + (f"; and {len(items) - limit} more" if len(items) > limit else "")


def _pods_left(view_pods: tuple[str, ...], count: int) -> str:
    return f"{count} pods left" + (f": {_listing(view_pods)}" if view_pods else "")


def pod_deletion_problem(ctx: g.GuardContext) -> str:
    """the GPU pods refused, or those left at the timeout"""
    view, deletion = ctx.view, ctx.policy.pod_deletion
    if view.gpu_pods_refused:
        return f"GPU pods may not be deleted: {_listing(view.gpu_pods_refused)}"
    timeout = deletion.timeout_seconds if deletion else 0
    return f"GPU pod deletion timed out after {timeout}s with " + _pods_left(
        view.pods_left, view.gpu_pods
    )


def _drain_problem(ctx: g.GuardContext) -> str:
    """the pods refused, or those left at the timeout"""
    policy, view = ctx.policy, ctx.view
    if view.drain_refused:
        return f"drain may not evict: {_listing(view.drain_refused)}"
    return f"drain timed out after {policy.drain.timeout_seconds}s with " + _pods_left(
        view.pods_left, view.drain_pods
    )


def _crash_loop(ctx: g.GuardContext) -> str | None:
    if not g.driver_crash_looping(ctx):
        return None
    restarts = ctx.view.driver_pod.restart_count if ctx.view.driver_pod else 0
    return f"driver pod restarted {restarts} times (limit {ctx.policy.driver_restart_limit})"


def _driver_not_ready(ctx: g.GuardContext) -> str:
    """the driver pod's restarts or why it is not ready"""
    crash = _crash_loop(ctx)
    if crash is not None:
        return crash
    pod = g.new_driver_pod(ctx)
    if pod is None:
        why = "no new driver pod on the node"
    elif pod.waiting_reason:
        why = f"new driver pod waiting: {pod.waiting_reason}"
    else:
        why = "new driver pod " + ("not Ready" if pod.running else "not running")
    return f"new driver pod not ready after {ctx.policy.driver_ready_timeout_seconds}s ({why})"


def _not_validated(ctx: g.GuardContext) -> str:
    """the driver pod's restarts or the validation timeout"""
    crash = _crash_loop(ctx)
    if crash is not None:
        return crash
    return f"validation did not pass within {ctx.policy.validation_timeout_seconds}s"


# --- actions ----------------------------------------------------------------------------


def _waiting_for_slot(ctx: g.GuardContext) -> str:
    if ctx.view.skip:
        return "skip label set"
    return "not Ready" if not ctx.view.node_ready else "waiting for an upgrade slot"


def _restart_first(ctx: g.GuardContext) -> tuple[Action, str] | None:
    """first restart-driver-pod while the old pod runs"""
    if ctx.view.driver_pod is not None and g.new_driver_pod(ctx) is None:
        return Action.RESTART_DRIVER_POD, "restarting the driver pod"
    return None


def _said(text: str) -> Words:
    return lambda ctx: text


def _deletion_timeout(policy: UpgradePolicyView) -> int:
    return policy.pod_deletion.timeout_seconds if policy.pod_deletion else 0


def _row(state: UpgradeState, **behaviour: Any) -> tuple[UpgradeState, UpgradeStateDef]:
    return state, UpgradeStateDef(state.value, **behaviour)


#: The table, in the states' order. Callbacks (`on_enter`) are added by `upgrade.py`.
STATE_TABLE: dict[UpgradeState, UpgradeStateDef] = dict(
    (
        _row(S.UNKNOWN, says=_said("no driver pod or revision to compare yet")),
        _row(S.UPGRADE_REQUIRED, says=_waiting_for_slot),
        _row(S.CORDON_REQUIRED, action=Action.CORDON, says=_said("cordoning node")),
        _row(
            S.WAIT_FOR_JOBS_REQUIRED,
            action=Action.WAIT_JOBS,
            says=lambda ctx: f"waiting for {ctx.view.wait_pods_running} job pods",
            # On timeout the node moves on (upstream: the wait is a courtesy).
            timeout=PolicyTimeout(
                "waitForCompletion.timeoutSeconds",
                lambda p: p.wait_for_completion.timeout_seconds,
            ),
        ),
        _row(
            S.POD_DELETION_REQUIRED,
            action=Action.DELETE_GPU_PODS,
            says=lambda ctx: f"deleting {ctx.view.gpu_pods} GPU pods",
            timeout=PolicyTimeout("podDeletion.timeoutSeconds", _deletion_timeout),
            failure=pod_deletion_problem,
        ),
        _row(
            S.DRAIN_REQUIRED,
            action=Action.DRAIN,
            says=lambda ctx: f"draining {ctx.view.drain_pods} pods",
            timeout=PolicyTimeout("drain.timeoutSeconds", lambda p: p.drain.timeout_seconds),
            failure=_drain_problem,
        ),
        _row(
            S.POD_RESTART_REQUIRED,
            action=Action.WAIT_DRIVER_POD,
            says=_said("waiting for the new driver pod"),
            refine=_restart_first,
            timeout=PolicyTimeout(
                "the driver-ready timeout (gpuop: the startup probe's budget)",
                lambda p: p.driver_ready_timeout_seconds,
            ),
            failure=_driver_not_ready,
        ),
        _row(
            S.VALIDATION_REQUIRED,
            action=Action.WAIT_VALIDATION,
            says=_said("waiting for validator pods"),
            timeout=PolicyTimeout(
                "the validation timeout (upstream, fixed 600 s)",
                lambda p: p.validation_timeout_seconds,
            ),
            failure=_not_validated,
        ),
        _row(S.UNCORDON_REQUIRED, action=Action.UNCORDON, says=_said("uncordoning node")),
        _row(S.UPGRADE_DONE, says=_said("driver is up to date")),
        # Resting in failed: the reason recorded on entry (this pass's or an earlier one).
        _row(
            S.UPGRADE_FAILED,
            says=lambda ctx: ctx.view.annotations.get(REASON_ANNOTATION, "failed"),
        ),
    )
)
assert list(STATE_TABLE) == list(UpgradeState), "one row per state, in order"
