"""The upgrade machine's table carries each state's action, timeout and failure reason,
and the fleet pass's start (`start_step`) is the table's `start` transition alone."""

from __future__ import annotations

from dataclasses import replace

import pytest

from statemachine import (
    Action,
    DriverPodView,
    NodeUpgradeView,
    PodDeletionView,
    UpgradePolicyView,
    next_step,
)
from statemachine.diagram import upgrade_mermaid
from statemachine.upgrade import UPGRADE_DEFINITION, start_step
from statemachine.upgrade_keys import (
    INITIAL_UNSCHEDULABLE_ANNOTATION,
    REPLACE_POD_ANNOTATION,
    REQUESTED_ANNOTATION,
    SKIP_LABEL,
    STATE_LABEL,
    STATE_SINCE_ANNOTATION,
    TIMER_ANNOTATIONS,
    UpgradeState,
)
from statemachine.upgrade_states import STATE_TABLE, UpgradeStateDef

S = UpgradeState
NOW = 1_000_000.0
POLICY = UpgradePolicyView(auto_upgrade=True)
FAILING = {t.source[0] for t in UPGRADE_DEFINITION.transitions if t.dest == S.UPGRADE_FAILED}


def _view(state: S, **kw: object) -> NodeUpgradeView:
    base = NodeUpgradeView(
        name="n",
        now=NOW,
        labels={STATE_LABEL: state.value},
        driver_pod=DriverPodView(uid="old", revision_hash="r1", running=True, ready=True),
        newest_revision="r2",
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def test_the_machine_is_built_from_the_table() -> None:
    assert [s.name for s in UPGRADE_DEFINITION.states] == [s.value for s in UpgradeState]
    for state in UPGRADE_DEFINITION.states:
        assert isinstance(state, UpgradeStateDef)
        assert state.action is STATE_TABLE[S(state.name)].action
        assert state.on_enter, state.name  # the clock callbacks are added on top


def test_every_state_that_can_fail_has_a_timeout_and_a_failure_reason() -> None:
    assert {
        "pod-deletion-required",
        "drain-required",
        "pod-restart-required",
        "validation-required",
    } == FAILING
    for name in FAILING:
        row = STATE_TABLE[S(name)]
        assert row.timeout is not None, name
        assert row.failure is not None, name
        assert row.failure.__doc__, name  # the diagram words it
    for state, row in STATE_TABLE.items():
        if state.value not in FAILING:
            assert row.failure is None, state


def test_the_timed_states_are_those_with_a_clock() -> None:
    timed = {s for s, row in STATE_TABLE.items() if row.timeout is not None}
    assert timed == set(TIMER_ANNOTATIONS)


POLICY_TIMEOUTS = UpgradePolicyView(
    auto_upgrade=True,
    wait_for_completion=replace(POLICY.wait_for_completion, timeout_seconds=11),
    pod_deletion=PodDeletionView(timeout_seconds=22),
    drain=replace(POLICY.drain, enable=True, timeout_seconds=33),
    driver_ready_timeout_seconds=44,
    validation_timeout_seconds=55,
)


@pytest.mark.parametrize(
    ("state", "seconds"),
    [
        (S.WAIT_FOR_JOBS_REQUIRED, 11),
        (S.POD_DELETION_REQUIRED, 22),
        (S.DRAIN_REQUIRED, 33),
        (S.POD_RESTART_REQUIRED, 44),
        (S.VALIDATION_REQUIRED, 55),
    ],
)
def test_the_table_names_the_policy_field_the_guards_time_out_on(state: S, seconds: int) -> None:
    row = STATE_TABLE[state]
    assert row.timeout is not None
    assert row.timeout.seconds(POLICY_TIMEOUTS) == seconds
    started = {TIMER_ANNOTATIONS[state]: str(int(NOW)), STATE_SINCE_ANNOTATION: str(int(NOW))}
    kw: dict[str, object] = dict(
        annotations={**started, REPLACE_POD_ANNOTATION: "old"},
        unschedulable=True,
        wait_pods_running=1,
        gpu_pods=1,
        drain_pods=1,
    )
    if state is S.VALIDATION_REQUIRED:
        kw["driver_pod"] = DriverPodView(uid="new", revision_hash="r2", running=True, ready=True)
    policy = replace(
        POLICY_TIMEOUTS,
        wait_for_completion=replace(POLICY_TIMEOUTS.wait_for_completion, pod_selector="a=b"),
        # With drain on, a pod deletion that times out falls back to a drain instead.
        drain=replace(POLICY_TIMEOUTS.drain, enable=state is not S.POD_DELETION_REQUIRED),
    )
    waiting = next_step(_view(state, **kw), policy)  # type: ignore[arg-type]
    assert waiting.target is state
    assert waiting.requeue_after == seconds
    late = next_step(_view(state, now=NOW + seconds, **kw), policy)  # type: ignore[arg-type]
    assert late.current is state
    assert late.target is not state
    if state.value in FAILING:
        assert late.entered_failed
        assert late.failure


def test_the_diagram_prints_each_states_behaviour() -> None:
    text = upgrade_mermaid()
    assert "note right of drain_required : action drain, bounded by drain.timeoutSeconds" in text
    assert "note right of cordon_required : action cordon" in text


# --- the fleet pass's start --------------------------------------------------------------


def test_start_step_moves_to_cordon_required_only_and_cordons() -> None:
    view = _view(S.UPGRADE_REQUIRED, annotations={REQUESTED_ANNOTATION: "true"})
    d = start_step(view, POLICY)
    assert d is not None
    assert d.triggers == ("start",)
    assert d.target is S.CORDON_REQUIRED
    assert d.action is Action.CORDON
    assert d.labels == {STATE_LABEL: "cordon-required"}
    assert d.annotations[REPLACE_POD_ANNOTATION] == "old"
    assert d.annotations[REQUESTED_ANNOTATION] is None  # the request is used up
    assert d.annotations[STATE_SINCE_ANNOTATION] == str(int(NOW))
    # An already cordoned node still stops at cordon-required (the node key goes on),
    # remembering it was cordoned before.
    pre = start_step(_view(S.UPGRADE_REQUIRED, unschedulable=True), POLICY)
    assert pre is not None
    assert pre.target is S.CORDON_REQUIRED
    assert pre.annotations[INITIAL_UNSCHEDULABLE_ANNOTATION] == "true"


def test_start_step_is_the_same_start_next_step_takes() -> None:
    view = _view(S.UPGRADE_REQUIRED)
    granted = start_step(view, POLICY)
    whole = next_step(view, POLICY, may_start=True)
    assert granted is not None
    assert whole.target is S.CORDON_REQUIRED
    assert (granted.labels, granted.annotations, granted.action) == (
        whole.labels,
        whole.annotations,
        whole.action,
    )


@pytest.mark.parametrize(
    "view",
    [
        _view(S.UPGRADE_REQUIRED, labels={STATE_LABEL: "upgrade-required", SKIP_LABEL: "true"}),
        _view(S.UPGRADE_REQUIRED, node_ready=False),
        _view(S.UPGRADE_REQUIRED, newest_revision="r1"),  # nothing to upgrade any more
        _view(S.CORDON_REQUIRED),
        _view(S.UPGRADE_DONE),
    ],
)
def test_start_step_starts_nothing_else(view: NodeUpgradeView) -> None:
    assert start_step(view, POLICY) is None
    assert start_step(view, UpgradePolicyView(auto_upgrade=False)) is None


def test_a_node_pass_waits_in_upgrade_required() -> None:
    d = next_step(_view(S.UPGRADE_REQUIRED), POLICY)
    assert d.target is S.UPGRADE_REQUIRED
    assert d.reason == "waiting for an upgrade slot"
