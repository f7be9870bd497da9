"""Status helpers: same observation, equal status (so a no-op reconcile writes nothing)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import crd

T0 = datetime(2025, 1, 2, 3, 4, 5, 678, tzinfo=UTC)
T1 = T0 + timedelta(minutes=5)


def cond(type_: str, status: str, reason: str = "R", when: datetime = T0) -> crd.Condition:
    return crd.Condition(
        type=type_,
        status=status,  # type: ignore[arg-type]
        reason=reason,
        message="m",
        last_transition_time=crd.format_time(when),
    )


def test_format_time_is_utc_whole_seconds() -> None:
    assert crd.format_time(T0) == "2025-01-02T03:04:05Z"
    plus_two = timezone(timedelta(hours=2))
    assert crd.format_time(datetime(2025, 1, 2, 5, 4, 5, tzinfo=plus_two)) == "2025-01-02T03:04:05Z"
    assert crd.format_time(datetime(2025, 1, 2, 3, 4, 5)) == "2025-01-02T03:04:05Z"


def test_set_condition_keeps_transition_time_when_status_is_unchanged() -> None:
    old = [cond("Ready", "True", when=T0)]
    new = crd.set_condition(old, cond("Ready", "True", reason="Other", when=T1))
    assert new[0].last_transition_time == crd.format_time(T0)
    assert new[0].reason == "Other"


def test_set_condition_moves_transition_time_when_status_flips() -> None:
    old = [cond("Ready", "True", when=T0)]
    new = crd.set_condition(old, cond("Ready", "False", when=T1))
    assert new[0].last_transition_time == crd.format_time(T1)


def test_set_condition_keeps_order_appends_new_types_and_drops_duplicates() -> None:
    old = [cond("A", "True"), cond("Ready", "True"), cond("Ready", "False")]
    new = crd.set_conditions(old, cond("Ready", "True", when=T1), cond("Error", "False"))
    assert [c.type for c in new] == ["A", "Ready", "Error"]
    assert crd.find_condition(new, "Error") is not None
    assert crd.find_condition(new, "Missing") is None
    assert crd.set_condition(None, cond("X", "True")) == [cond("X", "True")]


def test_no_op_reconcile_yields_an_identical_status() -> None:
    first = crd.ready_status("gpu-operator", generation=3, now=T0)
    again = crd.ready_status("gpu-operator", generation=3, now=T1, previous=first)
    assert again == first
    assert again.model_dump(by_alias=True) == first.model_dump(by_alias=True)


def test_ready_status_shape() -> None:
    status = crd.ready_status("gpu-operator", generation=2, now=T0)
    assert status.state == crd.STATE_READY
    assert status.namespace == "gpu-operator"
    ready = crd.find_condition(status.conditions, crd.CONDITION_READY)
    error = crd.find_condition(status.conditions, crd.CONDITION_ERROR)
    assert ready is not None
    assert error is not None
    assert (ready.status, ready.reason, ready.observed_generation) == ("True", "Reconciled", 2)
    assert (error.status, error.reason) == ("False", crd.REASON_NO_ERROR)
    wire = status.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert set(wire["conditions"][0]) == {
        "type",
        "status",
        "reason",
        "message",
        "lastTransitionTime",
        "observedGeneration",
    }


def test_error_then_recovery_moves_both_conditions_once() -> None:
    failing = crd.not_ready_status(
        "gpu-operator",
        reason=crd.REASON_INVALID_SPEC,
        message="spec.driver.upgradePolicy.drain.podSelector: cannot parse",
        error=True,
        generation=4,
        now=T0,
    )
    assert failing.state == crd.STATE_NOT_READY
    error = crd.find_condition(failing.conditions, crd.CONDITION_ERROR)
    assert error is not None
    assert error.status == "True"
    assert "podSelector" in error.message
    recovered = crd.ready_status("gpu-operator", generation=5, now=T1, previous=failing)
    for condition in recovered.conditions or ():
        assert condition.last_transition_time == crd.format_time(T1)


def test_not_ready_without_error_is_progress_not_failure() -> None:
    status = crd.not_ready_status(
        "gpu-operator",
        reason=crd.REASON_OPERAND_NOT_READY,
        message="driver not ready on 2 nodes",
        error=False,
        generation=1,
        now=T0,
    )
    error = crd.find_condition(status.conditions, crd.CONDITION_ERROR)
    assert error is not None
    assert error.status == "False"


def test_ignored_status_names_the_active_policy() -> None:
    status = crd.ignored_status("cluster-policy", generation=1, now=T0)
    assert status.state == crd.STATE_IGNORED
    ready = crd.find_condition(status.conditions, crd.CONDITION_READY)
    assert ready is not None
    assert ready.status == "False"
    assert ready.reason == crd.REASON_IGNORED
    assert "cluster-policy" in ready.message
    assert crd.ignored_status("cluster-policy", generation=1, now=T1, previous=status) == status


def test_status_round_trips_through_the_wire_format() -> None:
    status = crd.ready_status("gpu-operator", generation=1, now=T0)
    wire = status.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert crd.ClusterPolicyStatus.model_validate(wire) == status
