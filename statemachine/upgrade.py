"""The per-node driver upgrade rulebook: ONE `transitions.Machine`, many short-lived models.

Each call of `next_step` attaches a model for one node at the state its label names,
fires enabled triggers until none is (guards are pure, see `upgrade_guards`), and
detaches it again. The result says which label/annotation changes to persist and
which side effect to perform. Guards observe effects (node cordoned, pods gone, new
driver pod ready) instead of assuming them, so the machine is level-triggered: a
restarted operator, or a lost write, simply re-runs the step it finds on the node.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from transitions import EventData

from statemachine import upgrade_guards as g
from statemachine._fsm import (
    Callback,
    Condition,
    MachineDef,
    SharedMachine,
    StateDef,
    TransitionDef,
    named,
)
from statemachine.upgrade_keys import (
    FAILED_REVISION_ANNOTATION,
    IN_PROGRESS_STATES,
    INITIAL_UNSCHEDULABLE_ANNOTATION,
    MANAGED_ANNOTATIONS,
    REASON_ANNOTATION,
    REPLACE_POD_ANNOTATION,
    REQUESTED_ANNOTATION,
    STATE_LABEL,
    STATE_SINCE_ANNOTATION,
    TIMER_ANNOTATIONS,
    UpgradeState,
)
from statemachine.upgrade_views import (
    Action,
    Decision,
    NodeUpgradeView,
    UpgradePolicyView,
    parse_time,
)

S = UpgradeState
Guard = Callable[[g.GuardContext], bool]


class _NodeModel:
    """Scratch model for one evaluation: the context plus the annotations we intend.

    Guards read `ctx`, whose view carries the intended annotations, so a clock or a
    record written earlier in the same pass is what later guards see.
    """

    state: str
    trigger: Any

    def __init__(self, ctx: g.GuardContext) -> None:
        self.base = ctx
        self.ctx = ctx
        keys = (*MANAGED_ANNOTATIONS, REQUESTED_ANNOTATION)
        self.annotations: dict[str, str | None] = {k: ctx.view.annotations.get(k) for k in keys}
        self.failure: str = ""
        self.notice: str = ""

    def set(self, key: str, value: str | None) -> None:
        self.annotations[key] = value
        merged = dict(self.base.view.annotations)
        merged.update({k: v for k, v in self.annotations.items() if v is not None})
        for k, v in self.annotations.items():
            if v is None:
                merged.pop(k, None)
        self.ctx = replace(self.base, view=replace(self.base.view, annotations=merged))


def _model(event: EventData) -> _NodeModel:
    model = event.model
    assert isinstance(model, _NodeModel)
    return model


def _guard(func: Guard) -> Condition:
    """Adapt a pure guard over `GuardContext` to a `transitions` condition."""

    def condition(event: EventData) -> bool:
        return func(_model(event).ctx)

    return named(func.__name__, condition)


def _stamp(ts: float) -> str:
    return str(int(ts))


# --- callbacks: bookkeeping only, on the scratch model -------------------------------


def _on_enter(event: EventData) -> None:
    """Every state change restarts the state clock and the per-state timers."""
    model = _model(event)
    now = _stamp(model.ctx.view.now)
    model.set(STATE_SINCE_ANNOTATION, now)
    state = S(model.state)
    for timed_state, key in TIMER_ANNOTATIONS.items():
        model.set(key, now if timed_state is state else None)


def _on_start(event: EventData) -> None:
    """Remember what a clean finish needs: the pre-upgrade cordon, the pod to replace."""
    model = _model(event)
    view = model.ctx.view
    retrying = g.interrupted_upgrade(model.ctx)
    if not retrying:
        # A retry keeps the first attempt's record: by now the node is cordoned by us.
        model.set(INITIAL_UNSCHEDULABLE_ANNOTATION, "true" if view.unschedulable else None)
    model.set(REPLACE_POD_ANNOTATION, view.driver_pod.uid if view.driver_pod else None)
    model.set(REQUESTED_ANNOTATION, None)


def _on_enter_failed(event: EventData) -> None:
    model = _model(event)
    model.failure = _failure_reason(model.ctx, event.event.name)
    model.set(REASON_ANNOTATION, model.failure)
    model.set(FAILED_REVISION_ANNOTATION, model.ctx.view.newest_revision)
    # This attempt used up any request; retrying takes a new one (or a new revision),
    # so a node that keeps failing never loops within a pass or across passes.
    model.set(REQUESTED_ANNOTATION, None)


def _on_enter_done(event: EventData) -> None:
    model = _model(event)
    model.set(INITIAL_UNSCHEDULABLE_ANNOTATION, None)
    model.set(REPLACE_POD_ANNOTATION, None)


def _listing(items: tuple[str, ...], limit: int = 5) -> str:
    shown = "; ".join(items[:limit])
    return shown + (f"; and {len(items) - limit} more" if len(items) > limit else "")


def _pods_left(view_pods: tuple[str, ...], count: int) -> str:
    return f"{count} pods left" + (f": {_listing(view_pods)}" if view_pods else "")


def _pod_deletion_problem(ctx: g.GuardContext) -> str:
    view, deletion = ctx.view, ctx.policy.pod_deletion
    if view.gpu_pods_refused:
        return f"GPU pods may not be deleted: {_listing(view.gpu_pods_refused)}"
    timeout = deletion.timeout_seconds if deletion else 0
    return f"GPU pod deletion timed out after {timeout}s with " + _pods_left(
        view.pods_left, view.gpu_pods
    )


def _driver_not_ready(ctx: g.GuardContext) -> str:
    pod = g.new_driver_pod(ctx)
    if pod is None:
        why = "no new driver pod on the node"
    elif pod.waiting_reason:
        why = f"new driver pod waiting: {pod.waiting_reason}"
    else:
        why = "new driver pod " + ("not Ready" if pod.running else "not running")
    return f"new driver pod not ready after {ctx.policy.driver_ready_timeout_seconds}s ({why})"


def _failure_reason(ctx: g.GuardContext, trigger: str) -> str:
    policy, view = ctx.policy, ctx.view
    if trigger == "pod_deletion_failed":
        return _pod_deletion_problem(ctx)
    if trigger == "drain_failed":
        if view.drain_refused:
            return f"drain may not evict: {_listing(view.drain_refused)}"
        return f"drain timed out after {policy.drain.timeout_seconds}s with " + _pods_left(
            view.pods_left, view.drain_pods
        )
    if g.driver_crash_looping(ctx):
        restarts = view.driver_pod.restart_count if view.driver_pod else 0
        return f"driver pod restarted {restarts} times (limit {policy.driver_restart_limit})"
    if trigger == "driver_failed":
        return _driver_not_ready(ctx)
    return f"validation did not pass within {policy.validation_timeout_seconds}s"


def _on_deletion_fallback(event: EventData) -> None:
    model = _model(event)
    model.notice = _pod_deletion_problem(model.ctx) + "; draining the node instead"


# --- the rulebook ---------------------------------------------------------------------


def _t(
    trigger: str, source: tuple[S, ...], dest: S, guard: Guard, *after: Callback
) -> TransitionDef:
    return TransitionDef(
        trigger=trigger,
        source=tuple(s.value for s in source),
        dest=dest.value,
        conditions=(_guard(guard),),
        after=after,
    )


def _definition() -> MachineDef:
    transitions = (
        _t("upgrade_needed", (S.UNKNOWN, S.UPGRADE_DONE), S.UPGRADE_REQUIRED, g.needs_upgrade),
        _t("driver_up_to_date", (S.UNKNOWN,), S.UPGRADE_DONE, g.up_to_date),
        _t("start", (S.UPGRADE_REQUIRED,), S.CORDON_REQUIRED, g.slot_granted, _on_start),
        _t("cancel", (S.UPGRADE_REQUIRED,), S.UPGRADE_DONE, g.upgrade_cancelled),
        _t("cordoned", (S.CORDON_REQUIRED,), S.WAIT_FOR_JOBS_REQUIRED, g.node_cordoned),
        _t(
            "cordoned",
            (S.CORDON_REQUIRED,),
            S.POD_RESTART_REQUIRED,
            g.cordoned_for_restart,
        ),
        _t("jobs_finished", (S.WAIT_FOR_JOBS_REQUIRED,), S.POD_DELETION_REQUIRED, g.jobs_finished),
        _t("gpu_pods_deleted", (S.POD_DELETION_REQUIRED,), S.DRAIN_REQUIRED, g.gpu_pods_gone),
        _t(
            "pod_deletion_failed",
            (S.POD_DELETION_REQUIRED,),
            S.UPGRADE_FAILED,
            g.pod_deletion_failed,
        ),
        _t(
            "pod_deletion_failed",
            (S.POD_DELETION_REQUIRED,),
            S.DRAIN_REQUIRED,
            g.pod_deletion_falls_back_to_drain,
            named("note_drain_fallback", _on_deletion_fallback),
        ),
        _t("drained", (S.DRAIN_REQUIRED,), S.POD_RESTART_REQUIRED, g.drained),
        _t("drain_failed", (S.DRAIN_REQUIRED,), S.UPGRADE_FAILED, g.drain_failed),
        _t(
            "driver_restarted",
            (S.POD_RESTART_REQUIRED,),
            S.VALIDATION_REQUIRED,
            g.restarted_validate,
        ),
        _t(
            "driver_restarted",
            (S.POD_RESTART_REQUIRED,),
            S.UNCORDON_REQUIRED,
            g.restarted_no_validation,
        ),
        _t("driver_failed", (S.POD_RESTART_REQUIRED,), S.UPGRADE_FAILED, g.restart_failed),
        _t("driver_changed", (S.VALIDATION_REQUIRED,), S.POD_RESTART_REQUIRED, g.driver_outdated),
        _t("validated", (S.VALIDATION_REQUIRED,), S.UNCORDON_REQUIRED, g.validated),
        _t("validation_failed", (S.VALIDATION_REQUIRED,), S.UPGRADE_FAILED, g.validation_failed),
        _t("uncordoned", (S.UNCORDON_REQUIRED,), S.UPGRADE_DONE, g.may_finish),
        _t("retry", (S.UPGRADE_FAILED,), S.UPGRADE_REQUIRED, g.retry_wanted),
        _t("recovered", (S.UPGRADE_FAILED,), S.UNCORDON_REQUIRED, g.recovered),
    )
    enter = named("stamp_state_clock", _on_enter)
    extra = {
        S.UPGRADE_FAILED: (named("record_failure", _on_enter_failed),),
        S.UPGRADE_DONE: (named("forget_upgrade_record", _on_enter_done),),
    }
    states = tuple(StateDef(s.value, on_enter=(enter, *extra.get(s, ()))) for s in UpgradeState)
    return MachineDef(
        name="driver-upgrade",
        states=states,
        transitions=transitions,
        initial=S.UNKNOWN.value,
    )


UPGRADE_DEFINITION = _definition()
_MACHINE = SharedMachine(UPGRADE_DEFINITION)


# --- decisions ------------------------------------------------------------------------


def _is_time(raw: str | None) -> bool:
    return parse_time(raw) is not None


def _normalize(model: _NodeModel, state: S) -> None:
    """Make the bookkeeping fit the final state, whatever the node came in with.

    Covers resumes from labels written by hand or by another operator: missing clocks
    start now, clocks and records of other states are dropped.
    """
    ann, view = model.annotations, model.base.view
    now = _stamp(view.now)
    if state is S.UNKNOWN:
        ann[STATE_SINCE_ANNOTATION] = None
    elif not _is_time(ann[STATE_SINCE_ANNOTATION]):
        ann[STATE_SINCE_ANNOTATION] = now
    for timed_state, key in TIMER_ANNOTATIONS.items():
        if timed_state is not state:
            ann[key] = None
        elif not _is_time(ann[key]):
            ann[key] = now
    if state is S.UPGRADE_FAILED:
        if ann[FAILED_REVISION_ANNOTATION] is None:
            ann[FAILED_REVISION_ANNOTATION] = view.newest_revision
    else:
        ann[FAILED_REVISION_ANNOTATION] = None
        ann[REASON_ANNOTATION] = None
    if state in (S.UNKNOWN, S.UPGRADE_DONE):
        ann[INITIAL_UNSCHEDULABLE_ANNOTATION] = None
        ann[REPLACE_POD_ANNOTATION] = None


def _remaining(view: NodeUpgradeView, state: S, timeout_seconds: int) -> float | None:
    if timeout_seconds <= 0:
        return None
    return max(0.0, g.state_started_at(view, state) + timeout_seconds - view.now)


def _action(ctx: g.GuardContext, state: S, failure: str) -> tuple[Action, str, float | None]:
    """The side effect for the state the node rests in: (action, reason, requeue)."""
    view, policy = ctx.view, ctx.policy
    if state is S.UNKNOWN:
        return Action.NONE, "no driver pod or revision to compare yet", None
    if state is S.UPGRADE_DONE:
        return Action.NONE, "driver is up to date", None
    if state is S.UPGRADE_REQUIRED:
        if view.skip:
            why = "skip label set"
        else:
            why = "not Ready" if not view.node_ready else "waiting for an upgrade slot"
        return Action.NONE, why, None
    if state is S.CORDON_REQUIRED:
        return Action.CORDON, "cordoning node", None
    if state is S.WAIT_FOR_JOBS_REQUIRED:
        wait = policy.wait_for_completion
        left = _remaining(view, state, wait.timeout_seconds)
        return Action.WAIT_JOBS, f"waiting for {view.wait_pods_running} job pods", left
    if state is S.POD_DELETION_REQUIRED:
        deletion = policy.pod_deletion
        left = _remaining(view, state, deletion.timeout_seconds if deletion else 0)
        return Action.DELETE_GPU_PODS, f"deleting {view.gpu_pods} GPU pods", left
    if state is S.DRAIN_REQUIRED:
        left = _remaining(view, state, policy.drain.timeout_seconds)
        return Action.DRAIN, f"draining {view.drain_pods} pods", left
    if state is S.POD_RESTART_REQUIRED:
        left = _remaining(view, state, policy.driver_ready_timeout_seconds)
        pod = view.driver_pod
        if pod is not None and g.new_driver_pod(ctx) is None:
            return Action.RESTART_DRIVER_POD, "restarting the driver pod", left
        return Action.WAIT_DRIVER_POD, "waiting for the new driver pod", left
    if state is S.VALIDATION_REQUIRED:
        left = _remaining(view, state, policy.validation_timeout_seconds)
        return Action.WAIT_VALIDATION, "waiting for validator pods", left
    if state is S.UNCORDON_REQUIRED:
        return Action.UNCORDON, "uncordoning node", None
    return Action.NONE, failure or view.annotations.get(REASON_ANNOTATION, "failed"), None


def _diff(view: NodeUpgradeView, wanted: dict[str, str | None]) -> dict[str, str | None]:
    return {k: v for k, v in wanted.items() if view.annotations.get(k) != v}


def _label_patch(view: NodeUpgradeView, state: S) -> dict[str, str | None]:
    wanted = state.label_value
    return {} if view.state_label == wanted else {STATE_LABEL: wanted}


def next_step(
    view: NodeUpgradeView, policy: UpgradePolicyView, *, may_start: bool = False
) -> Decision:
    """Decide one node's next step.

    `may_start` is the fleet budget's verdict for this node (see `budget.select_nodes`);
    without it, or with the skip label, a node waits in `upgrade-required`. Auto-upgrade
    off delegates to `cleanup_step`, skip label or not.
    """
    current = view.state
    if not policy.auto_upgrade:
        return cleanup_step(view)

    model = _NodeModel(g.GuardContext(view, policy, may_start))
    with _MACHINE.attached(model, current.value):
        hops = _MACHINE.run_to_rest(model)
        target = S(model.state)
    _normalize(model, target)
    action, reason, requeue = _action(model.ctx, target, model.failure)
    return Decision(
        node=view.name,
        current=current,
        target=target,
        action=action,
        reason=reason,
        hops=tuple((trigger, S(src), S(dst)) for trigger, src, dst in hops),
        labels=_label_patch(view, target),
        annotations=_diff(view, model.annotations),
        requeue_after=requeue,
        failure=model.failure,
        notice=model.notice,
    )


def holds_cordon(view: NodeUpgradeView) -> bool:
    """We cordoned this node for an upgrade (and it was not cordoned before)."""
    state = view.state
    ours = state in IN_PROGRESS_STATES or state is S.UPGRADE_FAILED
    return ours and view.unschedulable and not view.initial_unschedulable


def cleanup_step(view: NodeUpgradeView) -> Decision:
    """Auto-upgrade is off: hand the node back and drop our state.

    If we hold its cordon, uncordon first and keep the label (so a crash in between
    still knows the cordon is ours); once schedulable, remove label and bookkeeping.
    """
    current = view.state
    if holds_cordon(view):
        return Decision(view.name, current, current, Action.UNCORDON, "auto-upgrade disabled")
    labels: dict[str, str | None] = {STATE_LABEL: None} if STATE_LABEL in view.labels else {}
    annotations: dict[str, str | None] = {
        k: None for k in MANAGED_ANNOTATIONS if k in view.annotations
    }
    return Decision(
        node=view.name,
        current=current,
        target=S.UNKNOWN,
        action=Action.NONE,
        reason="auto-upgrade disabled",
        labels=labels,
        annotations=annotations,
    )
