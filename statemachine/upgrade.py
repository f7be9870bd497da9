"""The per-node driver upgrade rulebook: ONE `transitions.Machine`, many short-lived models.

Each call of `next_step` attaches a model for one node at the state its label names,
fires enabled triggers until none is (guards are pure, see `upgrade_guards`), and
detaches it again. The result says which label/annotation changes to persist and
which side effect to perform. Guards observe effects (node cordoned, pods gone, new
driver pod ready) instead of assuming them, so the machine is level-triggered: a
restarted operator, or a lost write, simply re-runs the step it finds on the node.

The cordon is recorded with its owner (`statemachine.cordon`) in the patch that
cordons, and the upgrade lifts only a cordon recorded as its own, handing it to a
quarantine that still needs it. A node whose record says the upgrade cordoned it, yet
whose state label is gone or garbage, resumes: uncordoned when its driver is proven,
otherwise queued to be upgraded again, never left in `upgrade-done` cordoned.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from transitions import EventData

from statemachine import cordon
from statemachine import upgrade_bookkeeping as bk
from statemachine import upgrade_guards as g
from statemachine._fsm import (
    Callback,
    Condition,
    MachineDef,
    SharedMachine,
    TransitionDef,
    named,
)
from statemachine.upgrade_keys import (
    FAILED_REVISION_ANNOTATION,
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
from statemachine.upgrade_states import STATE_TABLE, pod_deletion_problem
from statemachine.upgrade_views import (
    Action,
    Decision,
    NodeUpgradeView,
    UpgradePolicyView,
)

S = UpgradeState
Guard = Callable[[g.GuardContext], bool]
DRIVER_UPGRADE = bk.DRIVER_UPGRADE


def _model(event: EventData) -> bk.NodeModel:
    model = event.model
    assert isinstance(model, bk.NodeModel)
    return model


def _guard(func: Guard) -> Condition:
    """Adapt a pure guard over `GuardContext` to a `transitions` condition."""

    def condition(event: EventData) -> bool:
        return func(_model(event).ctx)

    return named(func.__name__, condition)


# --- callbacks: bookkeeping only, on the scratch model -------------------------------


def _on_enter(event: EventData) -> None:
    """Every state change restarts the state clock and the per-state timers."""
    model = _model(event)
    now = bk.time_stamp(model.ctx.view.now)
    model.set(STATE_SINCE_ANNOTATION, now)
    state = S(model.state)
    for timed_state, key in TIMER_ANNOTATIONS.items():
        model.set(key, now if timed_state is state else None)


def _on_start(event: EventData) -> None:
    """Remember what a clean finish needs: the pre-upgrade cordon, the pod to replace."""
    model = _model(event)
    view = model.ctx.view
    if not g.owns_cordon(model.ctx):
        # A retry of a node whose cordon is ours keeps the first attempt's record.
        model.set(INITIAL_UNSCHEDULABLE_ANNOTATION, "true" if view.unschedulable else None)
    model.set(REPLACE_POD_ANNOTATION, view.driver_pod.uid if view.driver_pod else None)
    model.set(REQUESTED_ANNOTATION, None)


def _on_enter_failed(event: EventData) -> None:
    model = _model(event)
    assert event.transition is not None
    failure = STATE_TABLE[S(event.transition.source)].failure
    assert failure is not None, "a state that can fail names its failure reason"
    model.failure = failure(model.ctx)
    model.set(REASON_ANNOTATION, model.failure)
    model.set(FAILED_REVISION_ANNOTATION, model.ctx.view.newest_revision)
    # This attempt used up any request; retrying takes a new one (or a new revision),
    # so a node that keeps failing never loops within a pass or across passes.
    model.set(REQUESTED_ANNOTATION, None)


def _on_enter_done(event: EventData) -> None:
    model = _model(event)
    model.set(INITIAL_UNSCHEDULABLE_ANNOTATION, None)
    model.set(REPLACE_POD_ANNOTATION, None)


def _on_deletion_fallback(event: EventData) -> None:
    model = _model(event)
    model.notice = pod_deletion_problem(model.ctx) + "; draining the node instead"


def _on_hand_over(event: EventData) -> None:
    """The quarantine takes our cordon: the record names it, the node stays cordoned."""
    model = _model(event)
    view = model.ctx.view
    owner = cordon.CordonOwner.HEALTH_REMEDIATION
    for key, value in cordon.record(
        owner, cordon.reason_of(owner, view.labels, view.annotations)
    ).items():
        model.set(key, value)


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
    at_rest = (S.UNKNOWN, S.UPGRADE_DONE)
    transitions = (
        _t("upgrade_needed", at_rest, S.UPGRADE_REQUIRED, g.needs_upgrade_no_orphan),
        _t("driver_up_to_date", (S.UNKNOWN,), S.UPGRADE_DONE, g.up_to_date_no_orphan),
        _t("enrolled", (S.UNKNOWN,), S.UPGRADE_DONE, g.enrolled_no_orphan),
        _t("resume_cordoned", at_rest, S.UNCORDON_REQUIRED, g.orphan_proven),
        _t("resume_cordoned", at_rest, S.UPGRADE_REQUIRED, g.orphan_unproven),
        # A restart-only node skips the cordon (and so needs no uncordon).
        _t("start", (S.UPGRADE_REQUIRED,), S.POD_RESTART_REQUIRED, g.restart_slot, _on_start),
        _t("start", (S.UPGRADE_REQUIRED,), S.CORDON_REQUIRED, g.cordon_slot, _on_start),
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
        _t(
            "handed_over",
            (S.UNCORDON_REQUIRED,),
            S.UPGRADE_DONE,
            g.quarantine_takes_cordon,
            named("hand_cordon_to_quarantine", _on_hand_over),
        ),
        _t("retry", (S.UPGRADE_FAILED,), S.UPGRADE_REQUIRED, g.retry_wanted),
        _t("recovered", (S.UPGRADE_FAILED,), S.UNCORDON_REQUIRED, g.recovered),
    )
    enter = named("stamp_state_clock", _on_enter)
    extra = {
        S.UPGRADE_FAILED: (named("record_failure", _on_enter_failed),),
        S.UPGRADE_DONE: (named("forget_upgrade_record", _on_enter_done),),
    }
    states = tuple(
        replace(row, on_enter=(enter, *extra.get(s, ()))) for s, row in STATE_TABLE.items()
    )
    return MachineDef(
        name="driver-upgrade",
        states=states,
        transitions=transitions,
        initial=S.UNKNOWN.value,
    )


UPGRADE_DEFINITION = _definition()
_MACHINE = SharedMachine(UPGRADE_DEFINITION)


# --- decisions ------------------------------------------------------------------------


def next_step(
    view: NodeUpgradeView, policy: UpgradePolicyView, *, may_start: bool = False
) -> Decision:
    """Decide one node's next step.

    Node keys never start an upgrade: without `may_start` a node waits in
    `upgrade-required` until the fleet pass moves it on (`start_step`). `may_start`
    runs the start here too, for a whole path in one call (tests, simulations); the
    skip label still stops it. Auto-upgrade off delegates to `cleanup_step`.
    """
    current = view.state
    if not policy.auto_upgrade:
        return cleanup_step(view)

    model = bk.NodeModel(g.GuardContext(view, policy, may_start))
    with _MACHINE.attached(model, current.value):
        hops = _MACHINE.run_to_rest(model)
    model.hops = hops
    return _decision(view, model, current, hops)


def start_step(view: NodeUpgradeView, policy: UpgradePolicyView) -> Decision | None:
    """The fleet pass's grant: `upgrade-required` -> `cordon-required` (or, restart
    only, `pod-restart-required`), nothing further.

    Only the serial fleet key calls this, for nodes `budget.select_nodes` picked; node
    keys carry the node on from `cordon-required`. The slot is the persisted state, so
    the budget never rests on memory. None when the node cannot start (not in
    `upgrade-required`, skip label, NotReady, nothing to upgrade).
    """
    current = view.state
    if not policy.auto_upgrade or current is not S.UPGRADE_REQUIRED:
        return None
    model = bk.NodeModel(g.GuardContext(view, policy, may_start=True))
    with _MACHINE.attached(model, current.value):
        if not model.trigger("start"):
            return None
    return _decision(view, model, current, [("start", current.value, model.state)])


def _decision(
    view: NodeUpgradeView, model: bk.NodeModel, current: S, hops: list[tuple[str, str, str]]
) -> Decision:
    """The decision for the state the model rests in, its action and clock from the table."""
    target = S(model.state)
    bk.normalize(model, target)
    row = STATE_TABLE[target]
    action, reason = row.act(model.ctx)
    bk.record_cordon(model, action)
    bk.state_alert(view, model, target)
    timeout = row.timeout.seconds(model.ctx.policy) if row.timeout is not None else 0
    return Decision(
        node=view.name,
        current=current,
        target=target,
        action=action,
        reason=reason,
        hops=tuple((trigger, S(src), S(dst)) for trigger, src, dst in hops),
        labels=bk.label_patch(view, target),
        annotations=bk.annotation_patch(view, model.annotations),
        requeue_after=bk.remaining(model.ctx.view, target, timeout),
        failure=model.failure,
        notice=model.notice,
        alerts=tuple(model.alerts),
    )


def holds_cordon(view: NodeUpgradeView) -> bool:
    """The node is cordoned and the cordon is the upgrade's (`statemachine.cordon`)."""
    owner = cordon.cordon_owner(view.labels, view.annotations)
    return view.unschedulable and owner is DRIVER_UPGRADE


def cleanup_step(view: NodeUpgradeView) -> Decision:
    """Auto-upgrade is off: hand the node back and drop our state.

    If we hold its cordon, uncordon first (dropping the owner record in the same
    patch) and keep the label, so a crash in between still knows the cordon was ours;
    a quarantine that still needs the cordon is handed it instead. Once the cordon is
    not ours, remove label and bookkeeping.
    """
    current = view.state
    let_go = cordon.release(DRIVER_UPGRADE, view.labels, view.annotations, view.unschedulable)
    if let_go.uncordon:
        return Decision(
            view.name,
            current,
            current,
            Action.UNCORDON,
            "auto-upgrade disabled",
            annotations=dict(let_go.annotations),
        )
    labels: dict[str, str | None] = {STATE_LABEL: None} if STATE_LABEL in view.labels else {}
    annotations: dict[str, str | None] = {
        k: None for k in MANAGED_ANNOTATIONS if k in view.annotations
    }
    annotations.update(let_go.annotations)
    return Decision(
        node=view.name,
        current=current,
        target=S.UNKNOWN,
        action=Action.NONE,
        reason="auto-upgrade disabled",
        labels=labels,
        annotations=annotations,
    )
