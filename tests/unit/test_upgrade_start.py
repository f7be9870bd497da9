"""Entering an upgrade: a node without a state label is judged (done, required or left
alone), a done node is sent back on a newer revision or a request, and a queued node
starts only with a slot, recording what finishing needs."""

from __future__ import annotations

from typing import Any

import pytest

from statemachine.cordon import CORDON_REASON_ANNOTATION, CORDONED_BY_ANNOTATION
from statemachine.upgrade import next_step
from statemachine.upgrade_keys import (
    FAILED_REVISION_ANNOTATION,
    INITIAL_UNSCHEDULABLE_ANNOTATION,
    POD_RESTART_START_ANNOTATION,
    REASON_ANNOTATION,
    REPLACE_POD_ANNOTATION,
    REQUESTED_ANNOTATION,
    STATE_LABEL,
    STATE_SINCE_ANNOTATION,
    WAIT_FOR_COMPLETION_START_ANNOTATION,
)
from statemachine.upgrade_views import (
    Action,
)
from tests.unit.upgrade_fixtures import (
    NEW,
    NEW_POD,
    OURS,
    POLICY,
    S,
    T,
    since,
    view,
)

# --- unknown / done ---------------------------------------------------------------------


def test_unlabelled_node_with_current_driver_becomes_done() -> None:
    d = next_step(view(driver_pod=NEW_POD), POLICY)
    assert d.target is S.UPGRADE_DONE
    assert d.triggers == ("driver_up_to_date",)
    assert d.action is Action.NONE
    assert d.labels == {STATE_LABEL: "upgrade-done"}
    assert d.annotations == {STATE_SINCE_ANNOTATION: T}


def test_unlabelled_node_with_outdated_driver_needs_upgrade() -> None:
    d = next_step(view(), POLICY)
    assert d.target is S.UPGRADE_REQUIRED
    assert d.triggers == ("upgrade_needed",)
    assert d.labels == {STATE_LABEL: "upgrade-required"}
    assert d.action is Action.NONE
    assert d.reason == "waiting for an upgrade slot"


def test_unlabelled_node_with_request_annotation_needs_upgrade() -> None:
    d = next_step(view(driver_pod=NEW_POD, annotations={REQUESTED_ANNOTATION: "true"}), POLICY)
    assert d.target is S.UPGRADE_REQUIRED
    # the request is consumed only when the upgrade starts
    assert REQUESTED_ANNOTATION not in d.annotations


def test_request_annotation_must_be_true() -> None:
    d = next_step(view(driver_pod=NEW_POD, annotations={REQUESTED_ANNOTATION: "false"}), POLICY)
    assert d.target is S.UPGRADE_DONE


@pytest.mark.parametrize(
    "kw", [{"driver_pod": None}, {"newest_revision": None}], ids=["no-pod", "no-revision"]
)
def test_unlabelled_node_without_facts_is_left_alone(kw: dict[str, Any]) -> None:
    d = next_step(view(**kw), POLICY)
    assert d.target is S.UNKNOWN
    assert d.action is Action.NONE
    assert not d.has_patch


def test_unrecognised_label_is_replaced() -> None:
    d = next_step(view("bogus", driver_pod=NEW_POD), POLICY)
    assert d.current is S.UNKNOWN
    assert d.labels == {STATE_LABEL: "upgrade-done"}


def test_unrecognised_label_is_removed_when_nothing_is_known() -> None:
    d = next_step(view("bogus", driver_pod=None), POLICY)
    assert d.labels == {STATE_LABEL: None}


def test_done_node_needs_upgrade_again_on_newer_revision() -> None:
    d = next_step(view(S.UPGRADE_DONE, annotations={STATE_SINCE_ANNOTATION: since(99)}), POLICY)
    assert d.target is S.UPGRADE_REQUIRED
    assert d.labels == {STATE_LABEL: "upgrade-required"}
    assert d.annotations == {STATE_SINCE_ANNOTATION: T}


def test_done_node_with_current_driver_stays_without_writes() -> None:
    d = next_step(
        view(S.UPGRADE_DONE, driver_pod=NEW_POD, annotations={STATE_SINCE_ANNOTATION: since(9)}),
        POLICY,
    )
    assert d.target is S.UPGRADE_DONE
    assert not d.has_patch
    assert d.merge_patch() == {}


def test_done_node_with_request_needs_upgrade() -> None:
    v = view(S.UPGRADE_DONE, driver_pod=NEW_POD, annotations={REQUESTED_ANNOTATION: "true"})
    assert next_step(v, POLICY).target is S.UPGRADE_REQUIRED


# --- upgrade-required ---------------------------------------------------------------------


def test_upgrade_required_waits_without_a_slot() -> None:
    d = next_step(view(S.UPGRADE_REQUIRED, annotations={STATE_SINCE_ANNOTATION: T}), POLICY)
    assert d.target is S.UPGRADE_REQUIRED
    assert d.action is Action.NONE
    assert not d.has_patch


def test_slot_starts_the_upgrade_and_records_what_finishing_needs() -> None:
    v = view(
        S.UPGRADE_REQUIRED,
        annotations={REQUESTED_ANNOTATION: "true", STATE_SINCE_ANNOTATION: since(5)},
    )
    d = next_step(v, POLICY, may_start=True)
    assert d.triggers == ("start",)
    assert d.target is S.CORDON_REQUIRED
    assert d.action is Action.CORDON
    assert d.labels == {STATE_LABEL: "cordon-required"}
    assert d.annotations == {
        STATE_SINCE_ANNOTATION: T,
        REPLACE_POD_ANNOTATION: "pod-old",
        REQUESTED_ANNOTATION: None,
        # whose cordon it is, in the patch that cordons
        CORDONED_BY_ANNOTATION: "driver-upgrade",
        CORDON_REASON_ANNOTATION: "driver upgrade to revision rev-new",
    }
    assert d.merge_patch()["metadata"]["labels"] == {STATE_LABEL: "cordon-required"}


def test_slot_is_not_taken_by_a_not_ready_node() -> None:
    d = next_step(view(S.UPGRADE_REQUIRED, node_ready=False), POLICY, may_start=True)
    assert d.target is S.UPGRADE_REQUIRED
    assert d.reason == "not Ready"


def test_reverted_driver_change_cancels_a_queued_upgrade() -> None:
    d = next_step(view(S.UPGRADE_REQUIRED, driver_pod=NEW_POD), POLICY, may_start=True)
    assert d.triggers == ("cancel",)
    assert d.target is S.UPGRADE_DONE
    assert d.action is Action.NONE


def test_node_cordoned_by_someone_else_is_recorded_and_chains_forward() -> None:
    v = view(S.UPGRADE_REQUIRED, unschedulable=True)
    d = next_step(v, POLICY, may_start=True)
    assert d.annotations[INITIAL_UNSCHEDULABLE_ANNOTATION] == "true"
    # already cordoned, no jobs, no GPU pods, drain off: straight to the restart
    assert d.triggers == ("start", "cordoned", "jobs_finished", "gpu_pods_deleted", "drained")
    assert d.target is S.POD_RESTART_REQUIRED
    assert d.action is Action.RESTART_DRIVER_POD
    # intermediate clocks do not leak into the patch, only the resting state's
    assert WAIT_FOR_COMPLETION_START_ANNOTATION not in d.annotations
    assert d.annotations[POD_RESTART_START_ANNOTATION] == T
    assert d.hops[0] == ("start", S.UPGRADE_REQUIRED, S.CORDON_REQUIRED)


def test_stale_initial_unschedulable_annotation_is_cleared_on_start() -> None:
    v = view(S.UPGRADE_REQUIRED, annotations={INITIAL_UNSCHEDULABLE_ANNOTATION: "true"})
    d = next_step(v, POLICY, may_start=True)
    assert d.annotations[INITIAL_UNSCHEDULABLE_ANNOTATION] is None


def test_manual_retry_of_a_failed_node_keeps_first_attempt_record() -> None:
    """kubectl label ...=upgrade-required on a failed node we cordoned."""
    v = view(
        S.UPGRADE_REQUIRED,
        driver_pod=NEW_POD,  # current: without the record this would be "cancelled"
        unschedulable=True,
        annotations={
            **OURS,
            REPLACE_POD_ANNOTATION: "pod-old",
            FAILED_REVISION_ANNOTATION: NEW,
            REASON_ANNOTATION: "validation did not pass within 600s",
        },
    )
    waiting = next_step(v, POLICY)
    assert waiting.target is S.UPGRADE_REQUIRED  # not cancelled into done while cordoned
    assert waiting.annotations[FAILED_REVISION_ANNOTATION] is None
    d = next_step(v, POLICY, may_start=True)
    assert d.triggers[0] == "start"
    assert INITIAL_UNSCHEDULABLE_ANNOTATION not in d.annotations  # still "not ours before"
    assert d.annotations[REPLACE_POD_ANNOTATION] == "pod-new"  # restart the current pod
    assert d.target is S.POD_RESTART_REQUIRED
    assert d.action is Action.RESTART_DRIVER_POD
