"""The bookkeeping an upgrade keeps beside its state label, on the rulebook's scratch
model: the intended annotations (clocks, the pre-upgrade cordon, the pod to replace,
the failure record, the cordon owner), how they are made to fit the state a node comes
to rest in (also one resumed from a label set by hand), and the alerts about them.
`statemachine.upgrade` runs the machine; this module only writes down.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from statemachine import cordon
from statemachine import upgrade_guards as g
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
from statemachine.upgrade_views import Action, NodeUpgradeView, parse_time

S = UpgradeState
DRIVER_UPGRADE = cordon.CordonOwner.DRIVER_UPGRADE
#: A clock stamp this far ahead is rewritten to now and reported; a smaller lead (clock
#: skew between operator replicas) only counts from now until it is reached.
FUTURE_TOLERANCE_SECONDS = 60
#: Event reasons of `Decision.alerts`.
ALERT_INVALID_STATE = "DriverUpgradeStateInvalid"
ALERT_CLOCK_IN_FUTURE = "DriverUpgradeClockInFuture"


class NodeModel:
    """Scratch model for one evaluation: the context plus the annotations we intend.

    Guards read `ctx`, whose view carries the intended annotations, so a clock or a
    record written earlier in the same pass is what later guards see.
    """

    state: str
    trigger: Any

    def __init__(self, ctx: g.GuardContext) -> None:
        self.base = ctx
        self.ctx = ctx
        keys = (*MANAGED_ANNOTATIONS, REQUESTED_ANNOTATION, *cordon.CLEARED)
        self.annotations: dict[str, str | None] = {k: ctx.view.annotations.get(k) for k in keys}
        self.failure: str = ""
        self.notice: str = ""
        self.alerts: list[tuple[str, str]] = []
        self.hops: list[tuple[str, str, str]] = []
        view = ctx.view
        if (
            view.unschedulable
            and cordon.CORDONED_BY_ANNOTATION not in view.annotations
            and cordon.cordon_owner(view.labels, view.annotations) is DRIVER_UPGRADE
        ):
            # A cordon from before the owner record existed: write down whose it is.
            for key, value in cordon.record(DRIVER_UPGRADE, cordon_reason(view)).items():
                self.set(key, value)

    def set(self, key: str, value: str | None) -> None:
        self.annotations[key] = value
        merged = dict(self.base.view.annotations)
        merged.update({k: v for k, v in self.annotations.items() if v is not None})
        for k, v in self.annotations.items():
            if v is None:
                merged.pop(k, None)
        self.ctx = replace(self.base, view=replace(self.base.view, annotations=merged))


def time_stamp(ts: float) -> str:
    return str(int(ts))


def cordon_reason(view: NodeUpgradeView) -> str:
    """The words recorded beside our cordon."""
    target = f" to revision {view.newest_revision}" if view.newest_revision else ""
    return f"driver upgrade{target}"


def _clock(model: NodeModel, key: str) -> None:
    """Start a missing or unreadable clock now; rewrite (and report) one set ahead."""
    ann, view = model.annotations, model.base.view
    stamp = parse_time(ann[key])
    if stamp is None:
        ann[key] = time_stamp(view.now)
    elif stamp > view.now + FUTURE_TOLERANCE_SECONDS:
        model.alerts.append(
            (
                ALERT_CLOCK_IN_FUTURE,
                f"node {view.name}: {key}={ann[key]} is {int(stamp - view.now)}s in the "
                "future, which would disable the state's timeout; counting from now",
            )
        )
        ann[key] = time_stamp(view.now)


def normalize(model: NodeModel, state: S) -> None:
    """Make the bookkeeping fit the final state, whatever the node came in with.

    Covers resumes from labels written by hand or by another operator: missing clocks
    start now, clocks in the future are brought back to now, clocks and records of
    other states are dropped.
    """
    ann, view = model.annotations, model.base.view
    if state is S.UNKNOWN:
        ann[STATE_SINCE_ANNOTATION] = None
    else:
        _clock(model, STATE_SINCE_ANNOTATION)
    for timed_state, key in TIMER_ANNOTATIONS.items():
        if timed_state is not state:
            ann[key] = None
        else:
            _clock(model, key)
    if state is S.UPGRADE_FAILED:
        if ann[FAILED_REVISION_ANNOTATION] is None:
            ann[FAILED_REVISION_ANNOTATION] = view.newest_revision
    else:
        ann[FAILED_REVISION_ANNOTATION] = None
        ann[REASON_ANNOTATION] = None
    if state in (S.UNKNOWN, S.UPGRADE_DONE):
        ann[INITIAL_UNSCHEDULABLE_ANNOTATION] = None
        ann[REPLACE_POD_ANNOTATION] = None


def record_cordon(model: NodeModel, action: Action) -> None:
    """The owner record travels in the patch that changes the cordon: written with our
    cordon, dropped with our uncordon, and dropped when stale (the node is schedulable)."""
    ann, view = model.annotations, model.base.view
    if action is Action.CORDON and not view.unschedulable:
        ann.update(cordon.record(DRIVER_UPGRADE, cordon_reason(view)))
    elif ann[cordon.CORDONED_BY_ANNOTATION] == DRIVER_UPGRADE.value and (
        action is Action.UNCORDON or not view.unschedulable
    ):
        ann.update(cordon.CLEARED)


def state_alert(view: NodeUpgradeView, model: NodeModel, target: S) -> None:
    """A state label that is no state, or a lost one on a node we cordoned, is told."""
    raw = view.state_label
    resumed = "resume_cordoned" in (t for t, _, _ in model.hops)
    if raw is not None and view.state is S.UNKNOWN:
        what = f"{STATE_LABEL}={raw!r} is not an upgrade state"
    elif resumed:
        what = f"{STATE_LABEL} is missing"
    else:
        return
    if resumed:
        what += " on a node cordoned for a driver upgrade"
    model.alerts.append((ALERT_INVALID_STATE, f"node {view.name}: {what}; now {target.value}"))


def remaining(view: NodeUpgradeView, state: S, timeout_seconds: int) -> float | None:
    if timeout_seconds <= 0:
        return None
    return max(0.0, g.state_started_at(view, state) + timeout_seconds - view.now)


#: The patch of a decision that changes nothing, shared: the controller remembers the
#: decision of every node at rest, and an empty dict each was 64 bytes a node.
NO_CHANGES: Mapping[str, str | None] = MappingProxyType({})


def annotation_patch(
    view: NodeUpgradeView, wanted: dict[str, str | None]
) -> Mapping[str, str | None]:
    changes = {k: v for k, v in wanted.items() if view.annotations.get(k) != v}
    return changes or NO_CHANGES


def label_patch(view: NodeUpgradeView, state: S) -> Mapping[str, str | None]:
    wanted = state.label_value
    return NO_CHANGES if view.state_label == wanted else {STATE_LABEL: wanted}
