"""Upgrades switched off undo only our own bookkeeping; an operator that restarts (or
finds a label set by hand or by upstream) resumes from the label alone."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from statemachine import upgrade
from statemachine.upgrade import cleanup_step, holds_cordon, next_step
from statemachine.upgrade_keys import (
    DRAIN_START_ANNOTATION,
    FAILED_REVISION_ANNOTATION,
    INITIAL_UNSCHEDULABLE_ANNOTATION,
    MANAGED_ANNOTATIONS,
    REASON_ANNOTATION,
    REPLACE_POD_ANNOTATION,
    REQUESTED_ANNOTATION,
    SKIP_LABEL,
    STATE_LABEL,
    STATE_SINCE_ANNOTATION,
)
from statemachine.upgrade_views import (
    Action,
    UpgradePolicyView,
)
from tests.unit.upgrade_fixtures import (
    DRAIN,
    NEW,
    NEW_POD,
    WAIT,
    S,
    T,
    World,
    applied,
    since,
    view,
)

# --- auto-upgrade off ---------------------------------------------------------------


def test_auto_upgrade_off_touches_nothing_on_a_clean_node() -> None:
    d = next_step(view(), UpgradePolicyView(auto_upgrade=False))
    assert d.action is Action.NONE
    assert not d.has_patch


def test_auto_upgrade_off_uncordons_first_keeping_the_label() -> None:
    v = view(S.DRAIN_REQUIRED, unschedulable=True, annotations={DRAIN_START_ANNOTATION: T})
    assert holds_cordon(v)
    d = next_step(v, UpgradePolicyView(auto_upgrade=False))
    assert d.action is Action.UNCORDON
    assert not d.has_patch


def test_auto_upgrade_off_then_removes_state_but_not_user_input() -> None:
    annotations = {k: "x" for k in MANAGED_ANNOTATIONS}
    annotations[REQUESTED_ANNOTATION] = "true"
    annotations["unrelated"] = "keep"
    v = view(
        S.DRAIN_REQUIRED,
        unschedulable=False,
        annotations=annotations,
        labels={SKIP_LABEL: "false"},
    )
    d = cleanup_step(v)
    assert d.action is Action.NONE
    assert d.target is S.UNKNOWN
    assert d.labels == {STATE_LABEL: None}
    assert d.annotations == {k: None for k in MANAGED_ANNOTATIONS}


def test_auto_upgrade_off_leaves_someone_elses_cordon() -> None:
    v = view(
        S.VALIDATION_REQUIRED,
        unschedulable=True,
        annotations={INITIAL_UNSCHEDULABLE_ANNOTATION: "true"},
    )
    assert not holds_cordon(v)
    d = cleanup_step(v)
    assert d.action is Action.NONE
    assert d.labels == {STATE_LABEL: None}
    assert d.annotations == {INITIAL_UNSCHEDULABLE_ANNOTATION: None}


def test_auto_upgrade_off_removes_done_labels() -> None:
    d = cleanup_step(view(S.UPGRADE_DONE, annotations={STATE_SINCE_ANNOTATION: T}))
    assert d.labels == {STATE_LABEL: None}
    assert d.annotations == {STATE_SINCE_ANNOTATION: None}


# --- resume from a bare label (operator restarted, or label set by hand / by upstream) --------

RESUME_CASES: list[tuple[S, dict[str, Any], S, Action]] = [
    (S.UNKNOWN, {"driver_pod": NEW_POD}, S.UPGRADE_DONE, Action.NONE),
    (S.UPGRADE_REQUIRED, {}, S.UPGRADE_REQUIRED, Action.NONE),
    (S.CORDON_REQUIRED, {}, S.CORDON_REQUIRED, Action.CORDON),
    (
        S.WAIT_FOR_JOBS_REQUIRED,
        {"wait_pods_running": 1},
        S.WAIT_FOR_JOBS_REQUIRED,
        Action.WAIT_JOBS,
    ),
    (S.POD_DELETION_REQUIRED, {"gpu_pods": 1}, S.POD_DELETION_REQUIRED, Action.DELETE_GPU_PODS),
    (S.DRAIN_REQUIRED, {"drain_pods": 1}, S.DRAIN_REQUIRED, Action.DRAIN),
    (S.POD_RESTART_REQUIRED, {}, S.POD_RESTART_REQUIRED, Action.RESTART_DRIVER_POD),
    (S.VALIDATION_REQUIRED, {"driver_pod": NEW_POD}, S.VALIDATION_REQUIRED, Action.WAIT_VALIDATION),
    (S.UNCORDON_REQUIRED, {"driver_pod": NEW_POD}, S.UNCORDON_REQUIRED, Action.UNCORDON),
    (S.UPGRADE_DONE, {"driver_pod": NEW_POD}, S.UPGRADE_DONE, Action.NONE),
    (S.UPGRADE_FAILED, {}, S.UPGRADE_FAILED, Action.NONE),
]


@pytest.mark.parametrize(("state", "kw", "target", "action"), RESUME_CASES, ids=lambda x: str(x))
def test_resume_from_label_alone(state: S, kw: dict[str, Any], target: S, action: Action) -> None:
    """Only the label survived: the step for that state is redone, clocks start now."""
    kw.setdefault(
        "unschedulable",
        state not in (S.UNKNOWN, S.UPGRADE_REQUIRED, S.CORDON_REQUIRED, S.UPGRADE_DONE),
    )
    d = next_step(view(state, **kw), DRAIN if state is S.DRAIN_REQUIRED else WAIT)
    assert d.current is state
    assert d.target is target
    assert d.action is action
    if target is not S.UNKNOWN:
        assert d.annotations.get(STATE_SINCE_ANNOTATION) == T
    timer = upgrade.TIMER_ANNOTATIONS.get(target)
    if timer:
        assert d.annotations[timer] == T


def test_every_state_has_a_resume_case() -> None:
    assert {case[0] for case in RESUME_CASES} == set(S)


@pytest.mark.parametrize("state", list(S))
def test_resume_with_full_bookkeeping_writes_nothing(state: S) -> None:
    """A restarted operator that finds consistent bookkeeping makes zero writes."""
    world = World(policy=DRAIN)
    first = world.view()
    labels: dict[str, str] = {}
    if state is not S.UNKNOWN:
        labels[STATE_LABEL] = state.value
    annotations = {STATE_SINCE_ANNOTATION: since(1), REPLACE_POD_ANNOTATION: "pod-old"}
    timer = upgrade.TIMER_ANNOTATIONS.get(state)
    if timer:
        annotations[timer] = since(1)
    if state is S.UPGRADE_FAILED:
        annotations[FAILED_REVISION_ANNOTATION] = NEW
        annotations[REASON_ANNOTATION] = "x"
    v = replace(
        first,
        labels=labels,
        annotations=annotations,
        unschedulable=True,
        drain_pods=1,
        gpu_pods=1,
        wait_pods_running=1,
    )
    d = next_step(v, WAIT if state is S.WAIT_FOR_JOBS_REQUIRED else DRAIN)
    again = next_step(applied(v, d), WAIT if state is S.WAIT_FOR_JOBS_REQUIRED else DRAIN)
    assert not again.has_patch
    assert again.target is d.target
