"""The per-node driver upgrade rulebook as a machine: exactly upstream's states and
transitions, and properties that hold for every view and policy (one enabled transition,
a fixpoint, the decision invariants, enrolment)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transitions import Event, EventData, Machine

from statemachine import upgrade
from statemachine.cordon import CORDONED_BY_ANNOTATION
from statemachine.driver_owner import NEXT_OWNER_LABEL, OWNER_LABEL
from statemachine.remediation import ACTION_ANNOTATION, QUARANTINED_ANNOTATION
from statemachine.upgrade import next_step
from statemachine.upgrade_bookkeeping import NodeModel
from statemachine.upgrade_guards import GuardContext
from statemachine.upgrade_keys import (
    DRAIN_START_ANNOTATION,
    FAILED_REVISION_ANNOTATION,
    IN_PROGRESS_STATES,
    INITIAL_UNSCHEDULABLE_ANNOTATION,
    POD_DELETION_START_ANNOTATION,
    POD_RESTART_START_ANNOTATION,
    REPLACE_POD_ANNOTATION,
    REQUESTED_ANNOTATION,
    SKIP_LABEL,
    STATE_LABEL,
    STATE_SINCE_ANNOTATION,
    VALIDATION_START_ANNOTATION,
    WAIT_FOR_COMPLETION_START_ANNOTATION,
    parse_state,
)
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
from tests.unit.upgrade_fixtures import (
    NEW,
    NEW_POD,
    OLD,
    OLD_POD,
    OURS,
    POLICY,
    S,
    applied,
    since,
    view,
)

# --- the machine itself ----------------------------------------------------------------


def test_one_real_machine_with_exactly_the_upstream_states() -> None:
    machine = upgrade._MACHINE.machine
    assert isinstance(machine, Machine)
    assert list(machine.states) == [
        "unknown",
        "upgrade-required",
        "cordon-required",
        "wait-for-jobs-required",
        "pod-deletion-required",
        "drain-required",
        "pod-restart-required",
        "validation-required",
        "uncordon-required",
        "upgrade-done",
        "upgrade-failed",
    ]
    assert machine.auto_transitions is False
    assert machine.send_event is True
    assert not machine.models, "next_step must detach its scratch models"


def test_every_declared_transition() -> None:
    edges = {
        (t.trigger, src, t.dest) for t in upgrade.UPGRADE_DEFINITION.transitions for src in t.source
    }
    assert edges == {
        ("upgrade_needed", "unknown", "upgrade-required"),
        ("upgrade_needed", "upgrade-done", "upgrade-required"),
        ("driver_up_to_date", "unknown", "upgrade-done"),
        ("enrolled", "unknown", "upgrade-done"),
        ("start", "upgrade-required", "cordon-required"),
        ("start", "upgrade-required", "pod-restart-required"),
        ("cancel", "upgrade-required", "upgrade-done"),
        ("cordoned", "cordon-required", "wait-for-jobs-required"),
        ("cordoned", "cordon-required", "pod-restart-required"),
        ("jobs_finished", "wait-for-jobs-required", "pod-deletion-required"),
        ("gpu_pods_deleted", "pod-deletion-required", "drain-required"),
        ("pod_deletion_failed", "pod-deletion-required", "upgrade-failed"),
        ("pod_deletion_failed", "pod-deletion-required", "drain-required"),
        ("drained", "drain-required", "pod-restart-required"),
        ("drain_failed", "drain-required", "upgrade-failed"),
        ("driver_restarted", "pod-restart-required", "validation-required"),
        ("driver_restarted", "pod-restart-required", "uncordon-required"),
        ("driver_failed", "pod-restart-required", "upgrade-failed"),
        ("driver_changed", "validation-required", "pod-restart-required"),
        ("validated", "validation-required", "uncordon-required"),
        ("validation_failed", "validation-required", "upgrade-failed"),
        ("uncordoned", "uncordon-required", "upgrade-done"),
        ("handed_over", "uncordon-required", "upgrade-done"),
        ("resume_cordoned", "unknown", "uncordon-required"),
        ("resume_cordoned", "unknown", "upgrade-required"),
        ("resume_cordoned", "upgrade-done", "uncordon-required"),
        ("resume_cordoned", "upgrade-done", "upgrade-required"),
        ("retry", "upgrade-failed", "upgrade-required"),
        ("recovered", "upgrade-failed", "uncordon-required"),
    }


@pytest.mark.parametrize(
    ("label", "expected"),
    [
        (None, S.UNKNOWN),
        ("", S.UNKNOWN),
        ("unknown", S.UNKNOWN),
        ("node-maintenance-required", S.UNKNOWN),
        ("drain-required", S.DRAIN_REQUIRED),
        ("upgrade-failed", S.UPGRADE_FAILED),
    ],
)
def test_parse_state(label: str | None, expected: S) -> None:
    assert parse_state(label) is expected


def test_unknown_is_never_written_as_a_label() -> None:
    assert S.UNKNOWN.label_value is None
    assert S.UPGRADE_DONE.label_value == "upgrade-done"


# --- properties ------------------------------------------------------------------------------

pods = st.one_of(
    st.none(),
    st.builds(
        DriverPodView,
        uid=st.sampled_from(["pod-old", "pod-new", "pod-x"]),
        revision_hash=st.sampled_from([OLD, NEW]),
        running=st.booleans(),
        ready=st.booleans(),
        restart_count=st.integers(0, 15),
        config_digest=st.sampled_from(["", "d1", "d2"]),
    ),
)
times = st.one_of(st.none(), st.integers(0, 2000).map(lambda ago: since(ago)))
annotation_sets = st.fixed_dictionaries(
    {},
    optional={
        REQUESTED_ANNOTATION: st.sampled_from(["true", "false"]),
        INITIAL_UNSCHEDULABLE_ANNOTATION: st.just("true"),
        REPLACE_POD_ANNOTATION: st.sampled_from(["pod-old", "pod-new"]),
        FAILED_REVISION_ANNOTATION: st.sampled_from([OLD, NEW]),
        WAIT_FOR_COMPLETION_START_ANNOTATION: st.integers(0, 2000).map(since),
        POD_DELETION_START_ANNOTATION: st.integers(0, 2000).map(since),
        DRAIN_START_ANNOTATION: st.integers(0, 2000).map(since),
        POD_RESTART_START_ANNOTATION: st.integers(0, 2000).map(since),
        VALIDATION_START_ANNOTATION: st.integers(0, 2000).map(since),
        STATE_SINCE_ANNOTATION: st.integers(0, 2000).map(since),
    },
)
views = st.builds(
    view,
    st.sampled_from([*S, "garbage"]),
    labels=st.sampled_from([{}, {SKIP_LABEL: "true"}]),
    annotations=annotation_sets,
    unschedulable=st.booleans(),
    node_ready=st.booleans(),
    driver_pod=pods,
    newest_revision=st.sampled_from([None, OLD, NEW]),
    enrolling=st.booleans(),
    wait_pods_running=st.integers(0, 2),
    gpu_pods=st.integers(0, 2),
    gpu_pods_refused=st.sampled_from([(), ("ns/a (x)",)]),
    drain_pods=st.integers(0, 2),
    drain_refused=st.sampled_from([(), ("ns/a (x)",)]),
    validators_ready=st.booleans(),
    newest_config_digest=st.sampled_from(["", "d1"]),
)
policies = st.builds(
    UpgradePolicyView,
    auto_upgrade=st.just(True),
    wait_for_completion=st.builds(
        WaitForCompletionView,
        pod_selector=st.sampled_from(["", "app=x", {"app": "x"}]),
        timeout_seconds=st.sampled_from([0, 600]),
    ),
    pod_deletion=st.one_of(
        st.none(),
        st.builds(PodDeletionView, force=st.booleans(), timeout_seconds=st.sampled_from([0, 300])),
    ),
    drain=st.builds(
        DrainView,
        enable=st.booleans(),
        force=st.booleans(),
        timeout_seconds=st.sampled_from([0, 300]),
    ),
    validation_enabled=st.booleans(),
    driver_ready_timeout_seconds=st.sampled_from([0, 900]),
)


@settings(max_examples=400)
@given(v=views, policy=policies, may_start=st.booleans())
def test_at_most_one_transition_is_enabled_per_state(
    v: NodeUpgradeView, policy: UpgradePolicyView, may_start: bool
) -> None:
    """Guards leaving a state are mutually exclusive: trigger order never matters."""
    machine = upgrade._MACHINE.machine
    model = NodeModel(GuardContext(v, policy, may_start))
    state = machine.get_state(v.state.value)
    for source in machine.states:
        enabled = []
        for name, event in machine.events.items():
            for transition in event.transitions.get(source, []):
                data = EventData(state, Event(name, machine), machine, model, (), {})
                if all(c.check(data) for c in transition.conditions):
                    enabled.append((name, transition.dest))
        assert len(enabled) <= 1, (source, enabled)


def test_a_node_enrolled_without_a_driver_pod_starts_upgrade_done() -> None:
    """Its deploy labels and its first state go in one write: the pod the DaemonSet
    creates there is the newest revision, so there is nothing to upgrade."""
    d = next_step(view(S.UNKNOWN, driver_pod=None, enrolling=True), POLICY)
    assert d.target is S.UPGRADE_DONE
    assert d.action is Action.NONE
    assert d.labels == {STATE_LABEL: "upgrade-done"}
    assert d.hops == (("enrolled", S.UNKNOWN, S.UPGRADE_DONE),)


@pytest.mark.parametrize(
    "case",
    [
        {"driver_pod": None},  # not enrolling: no news until the pod appears
        {"driver_pod": OLD_POD, "enrolling": True},  # a pod is there: the rulebook decides
        {
            "driver_pod": None,
            "enrolling": True,
            "annotations": {REQUESTED_ANNOTATION: "true"},  # asked for an upgrade
        },
    ],
)
def test_enrolment_needs_a_new_node_with_no_driver_pod(case: dict[str, Any]) -> None:
    d = next_step(view(S.UNKNOWN, **case), POLICY)
    assert ("enrolled", S.UNKNOWN, S.UPGRADE_DONE) not in d.hops


def test_enrolled_node_stays_done_when_its_new_driver_pod_arrives() -> None:
    enrolled = view(S.UPGRADE_DONE, driver_pod=None)
    assert next_step(enrolled, POLICY).changed_state is False
    with_pod = replace(enrolled, driver_pod=NEW_POD)
    d = next_step(with_pod, POLICY)
    assert d.target is S.UPGRADE_DONE
    assert not d.labels
    assert not d.changed_state


def test_request_made_during_a_failing_attempt_is_used_up() -> None:
    """A crash-looping driver with a lingering request must not retry in a loop."""
    pod = replace(NEW_POD, uid="pod-x", restart_count=30)
    v = view(
        S.POD_RESTART_REQUIRED,
        driver_pod=pod,
        unschedulable=True,
        annotations={REQUESTED_ANNOTATION: "true", REPLACE_POD_ANNOTATION: "pod-old"},
    )
    d = next_step(v, POLICY, may_start=True)
    assert d.target is S.UPGRADE_FAILED
    assert d.entered_failed
    assert d.annotations[REQUESTED_ANNOTATION] is None
    assert next_step(applied(v, d), POLICY, may_start=True).target is S.UPGRADE_FAILED


def _stopped_on_a_repeat(d: Decision) -> bool:
    """The pass came back to a state it had already been in, and `run_to_rest` stopped it
    there (so that a guard set can never spin) rather than at rest."""
    visited = {d.current, *(dest for _, _, dest in d.hops[:-1])}
    return bool(d.hops) and d.target in visited


def _assert_settled(d: Decision, again: Decision) -> None:
    assert again.target is d.target
    assert again.triggers == ()
    assert not again.has_patch
    assert again.action is d.action


@settings(max_examples=1000)
@given(v=views, policy=policies, may_start=st.booleans())
def test_decisions_reach_a_fixpoint(
    v: NodeUpgradeView, policy: UpgradePolicyView, may_start: bool
) -> None:
    """Persisting a decision and asking again (nothing else changed) changes nothing:
    a reconcile pass with no news makes no writes and never double-fires an effect.

    One exception, bounded: a pass that finishes an upgrade (or hands its cordon over)
    and sets off again on a request or a move made meanwhile can come back to a state
    it passed, where `run_to_rest` stops it so that guards can never spin. Its patch
    re-queues the node, and the next pass settles (found by hypothesis; the two
    examples below)."""
    d = next_step(v, policy, may_start=may_start)
    again = next_step(applied(v, d), policy, may_start=may_start)
    if _stopped_on_a_repeat(d):
        assert d.has_patch, "a pass stopped short writes, so the node is looked at again"
        v, d = applied(v, d), again
        again = next_step(applied(v, d), policy, may_start=may_start)
        assert not _stopped_on_a_repeat(d)
    _assert_settled(d, again)


def test_a_pass_that_starts_the_next_upgrade_settles_next() -> None:
    """Hypothesis's example: a node waiting in cordon-required, cordoned by someone else,
    whose driver pod was replaced meanwhile (not the recorded one, at the newest
    revision) and that was asked for another upgrade."""
    v = view(
        S.CORDON_REQUIRED,
        unschedulable=True,
        driver_pod=NEW_POD,
        validators_ready=True,
        annotations={
            REQUESTED_ANNOTATION: "true",
            REPLACE_POD_ANNOTATION: "pod-old",
            INITIAL_UNSCHEDULABLE_ANNOTATION: "true",
        },
    )
    # As node keys ask (never may_start): the recorded upgrade is done, the request queued.
    d = next_step(v, POLICY)
    assert d.target is S.UPGRADE_REQUIRED
    assert d.triggers[-2:] == ("uncordoned", "upgrade_needed")
    assert REQUESTED_ANNOTATION not in d.annotations
    assert d.annotations[REPLACE_POD_ANNOTATION] is None
    _assert_settled(d, next_step(applied(v, d), POLICY))

    # With may_start the same pass starts the request's upgrade and, back in
    # cordon-required, stops; the start's record makes the next pass restart the pod.
    first = next_step(v, POLICY, may_start=True)
    assert first.target is S.CORDON_REQUIRED
    assert first.triggers[-3:] == ("uncordoned", "upgrade_needed", "start")
    assert _stopped_on_a_repeat(first)
    assert first.annotations[REPLACE_POD_ANNOTATION] == NEW_POD.uid
    assert first.annotations[REQUESTED_ANNOTATION] is None
    second = next_step(applied(v, first), POLICY, may_start=True)
    assert second.target is S.POD_RESTART_REQUIRED
    assert second.action is Action.RESTART_DRIVER_POD
    assert not _stopped_on_a_repeat(second)
    after = applied(applied(v, first), second)
    _assert_settled(second, next_step(after, POLICY, may_start=True))


def test_a_cordon_handed_over_then_a_move_settles_next() -> None:
    """The same stop on the node keys' way: a node done with our cordon, its driver
    proven, quarantined meanwhile and moving to another NVIDIADriver. The pass hands the
    cordon over and is back in upgrade-done; the next queues the move."""
    v = view(
        S.UPGRADE_DONE,
        labels={OWNER_LABEL: "a", NEXT_OWNER_LABEL: "b"},
        unschedulable=True,
        driver_pod=NEW_POD,
        validators_ready=True,
        annotations={**OURS, QUARANTINED_ANNOTATION: "XID 79", ACTION_ANNOTATION: "cordon"},
    )
    first = next_step(v, POLICY)
    assert first.triggers == ("resume_cordoned", "handed_over")
    assert _stopped_on_a_repeat(first)
    assert first.annotations[CORDONED_BY_ANNOTATION] == "health-remediation"
    second = next_step(applied(v, first), POLICY)
    assert second.target is S.UPGRADE_REQUIRED
    assert second.triggers == ("upgrade_needed",)
    _assert_settled(second, next_step(applied(applied(v, first), second), POLICY))


@settings(max_examples=300)
@given(v=views, policy=policies, may_start=st.booleans())
def test_decision_invariants(
    v: NodeUpgradeView, policy: UpgradePolicyView, may_start: bool
) -> None:
    d = next_step(v, policy, may_start=may_start)
    # only a granted slot ever moves a node into the in-progress states
    if v.state in (S.UNKNOWN, S.UPGRADE_DONE, S.UPGRADE_REQUIRED, S.UPGRADE_FAILED) and not (
        may_start and v.node_ready and not v.skip
    ):
        assert d.target in (S.UNKNOWN, S.UPGRADE_DONE, S.UPGRADE_REQUIRED, S.UPGRADE_FAILED) or (
            v.state is S.UPGRADE_FAILED and d.target in (S.UNCORDON_REQUIRED,)
        )
    # the state label is written exactly when the state changes (or was garbage)
    if d.labels:
        assert d.labels == {STATE_LABEL: d.target.label_value}
    # a node in progress never rests without a way out: a timeout or an action
    if d.target in IN_PROGRESS_STATES and d.action in (Action.WAIT_DRIVER_POD,):
        assert d.requeue_after is not None or policy.driver_ready_timeout_seconds == 0
    # nodes we did not cordon are never uncordoned
    if d.action is Action.UNCORDON:
        assert not v.initial_unschedulable
    # the requested annotation is only ever removed: when an upgrade starts or fails
    if REQUESTED_ANNOTATION in d.annotations:
        assert d.annotations[REQUESTED_ANNOTATION] is None
        assert "start" in d.triggers or d.entered_failed
    assert bool(d.failure) is d.entered_failed
    assert d.requeue_after is None or d.requeue_after >= 0
