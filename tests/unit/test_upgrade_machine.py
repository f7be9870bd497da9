"""The per-node driver upgrade rulebook: every transition, guard, resume and policy knob."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from transitions import Event, EventData, Machine

import crd
from statemachine import upgrade
from statemachine.cordon import CORDON_REASON_ANNOTATION, CORDONED_BY_ANNOTATION
from statemachine.upgrade import cleanup_step, holds_cordon, next_step
from statemachine.upgrade_guards import GuardContext
from statemachine.upgrade_keys import (
    DRAIN_START_ANNOTATION,
    FAILED_REVISION_ANNOTATION,
    IN_PROGRESS_STATES,
    INITIAL_UNSCHEDULABLE_ANNOTATION,
    MANAGED_ANNOTATIONS,
    POD_DELETION_START_ANNOTATION,
    POD_RESTART_START_ANNOTATION,
    REASON_ANNOTATION,
    REPLACE_POD_ANNOTATION,
    REQUESTED_ANNOTATION,
    SKIP_LABEL,
    STATE_LABEL,
    STATE_SINCE_ANNOTATION,
    VALIDATION_START_ANNOTATION,
    WAIT_FOR_COMPLETION_START_ANNOTATION,
    UpgradeState,
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

S = UpgradeState
NOW = 1_700_000_000.0
T = str(int(NOW))
OLD, NEW = "rev-old", "rev-new"

POLICY = UpgradePolicyView(auto_upgrade=True)
DRAIN = replace(POLICY, drain=DrainView(enable=True, timeout_seconds=300))
WAIT = replace(
    POLICY,
    wait_for_completion=WaitForCompletionView(pod_selector={"app": "train"}, timeout_seconds=600),
)

OLD_POD = DriverPodView(uid="pod-old", revision_hash=OLD, running=True, ready=True)
NEW_POD = DriverPodView(uid="pod-new", revision_hash=NEW, running=True, ready=True)
NEW_POD_STARTING = replace(NEW_POD, running=False, ready=False)
#: The owner record of a cordon the upgrade set (written with the cordon).
OURS = {CORDONED_BY_ANNOTATION: "driver-upgrade", CORDON_REASON_ANNOTATION: "driver upgrade"}


def view(
    state: S | str | None = None,
    *,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    **kw: Any,
) -> NodeUpgradeView:
    all_labels = dict(labels or {})
    if isinstance(state, S):
        if state is not S.UNKNOWN:
            all_labels[STATE_LABEL] = state.value
    elif state is not None:
        all_labels[STATE_LABEL] = state
    kw.setdefault("driver_pod", OLD_POD)
    kw.setdefault("newest_revision", NEW)
    return NodeUpgradeView(
        name="gpu-1", now=NOW, labels=all_labels, annotations=dict(annotations or {}), **kw
    )


def since(seconds_ago: float) -> str:
    return str(int(NOW - seconds_ago))


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


# --- cordon-required ----------------------------------------------------------------------


def test_cordon_required_cordons() -> None:
    d = next_step(view(S.CORDON_REQUIRED), POLICY)
    assert d.target is S.CORDON_REQUIRED
    assert d.action is Action.CORDON


def test_cordoned_node_moves_to_wait_for_jobs() -> None:
    d = next_step(view(S.CORDON_REQUIRED, unschedulable=True, wait_pods_running=2), WAIT)
    assert d.triggers == ("cordoned",)
    assert d.target is S.WAIT_FOR_JOBS_REQUIRED
    assert d.action is Action.WAIT_JOBS
    assert d.annotations[WAIT_FOR_COMPLETION_START_ANNOTATION] == T
    assert d.requeue_after == 600


# --- wait-for-jobs-required ------------------------------------------------------------------


def test_waits_for_matching_job_pods() -> None:
    v = view(
        S.WAIT_FOR_JOBS_REQUIRED,
        unschedulable=True,
        wait_pods_running=3,
        annotations={WAIT_FOR_COMPLETION_START_ANNOTATION: since(100)},
    )
    d = next_step(v, WAIT)
    assert d.target is S.WAIT_FOR_JOBS_REQUIRED
    assert d.action is Action.WAIT_JOBS
    assert d.reason == "waiting for 3 job pods"
    assert d.requeue_after == 500


def test_jobs_done_moves_on() -> None:
    v = view(S.WAIT_FOR_JOBS_REQUIRED, unschedulable=True, wait_pods_running=0, gpu_pods=1)
    d = next_step(v, WAIT)
    assert d.triggers == ("jobs_finished",)
    assert d.target is S.POD_DELETION_REQUIRED
    assert d.action is Action.DELETE_GPU_PODS


def test_wait_timeout_moves_on() -> None:
    v = view(
        S.WAIT_FOR_JOBS_REQUIRED,
        unschedulable=True,
        wait_pods_running=3,
        gpu_pods=1,
        annotations={WAIT_FOR_COMPLETION_START_ANNOTATION: since(600)},
    )
    d = next_step(v, WAIT)
    assert d.target is S.POD_DELETION_REQUIRED
    assert d.annotations[WAIT_FOR_COMPLETION_START_ANNOTATION] is None


def test_wait_timeout_zero_waits_forever() -> None:
    policy = replace(WAIT, wait_for_completion=WaitForCompletionView("app=train", 0))
    v = view(
        S.WAIT_FOR_JOBS_REQUIRED,
        unschedulable=True,
        wait_pods_running=1,
        annotations={WAIT_FOR_COMPLETION_START_ANNOTATION: since(10**7)},
    )
    d = next_step(v, policy)
    assert d.target is S.WAIT_FOR_JOBS_REQUIRED
    assert d.requeue_after is None


def test_no_selector_means_no_wait() -> None:
    v = view(S.WAIT_FOR_JOBS_REQUIRED, unschedulable=True, wait_pods_running=5, gpu_pods=1)
    assert next_step(v, POLICY).target is S.POD_DELETION_REQUIRED


# --- pod-deletion-required ---------------------------------------------------------------------


def _deleting(seconds_ago: float, pods: int = 2, **kw: Any) -> NodeUpgradeView:
    return view(
        S.POD_DELETION_REQUIRED,
        unschedulable=True,
        gpu_pods=pods,
        annotations={**OURS, POD_DELETION_START_ANNOTATION: since(seconds_ago)},
        **kw,
    )


def test_deletes_gpu_pods() -> None:
    d = next_step(_deleting(10), POLICY)
    assert d.target is S.POD_DELETION_REQUIRED
    assert d.action is Action.DELETE_GPU_PODS
    assert d.requeue_after == 290
    assert d.annotations == {STATE_SINCE_ANNOTATION: T}  # only the missing state clock


def test_gpu_pods_gone_moves_to_drain() -> None:
    d = next_step(_deleting(10, pods=0, drain_pods=4), DRAIN)
    assert d.triggers == ("gpu_pods_deleted",)
    assert d.target is S.DRAIN_REQUIRED
    assert d.action is Action.DRAIN
    assert d.annotations[POD_DELETION_START_ANNOTATION] is None
    assert d.annotations[DRAIN_START_ANNOTATION] == T


def test_pod_deletion_timeout_fails() -> None:
    d = next_step(_deleting(300), POLICY)
    assert d.triggers == ("pod_deletion_failed",)
    assert d.target is S.UPGRADE_FAILED
    assert d.entered_failed is True
    assert d.action is Action.NONE
    assert d.reason == "GPU pod deletion timed out after 300s with 2 pods left"
    assert d.annotations[REASON_ANNOTATION] == d.reason
    assert d.annotations[FAILED_REVISION_ANNOTATION] == NEW
    assert d.labels == {STATE_LABEL: "upgrade-failed"}
    assert d.failure == d.reason


def test_pod_deletion_timeout_names_the_pods_and_why() -> None:
    left = ("ml/trainer (Cannot evict pod as it would violate the pod's disruption budget)",)
    d = next_step(_deleting(300, pods=1, pods_left=left), POLICY)
    assert d.target is S.UPGRADE_FAILED
    assert d.reason == f"GPU pod deletion timed out after 300s with 1 pods left: {left[0]}"


@pytest.mark.parametrize("force", [False, True])
def test_pod_deletion_timeout_never_escalates_to_a_forced_delete(force: bool) -> None:
    """Upstream's `force` lets unmanaged pods go, it never bypasses a budget: past the
    timeout the node fails (it used to DELETE with grace 0 for ever)."""
    policy = replace(POLICY, pod_deletion=PodDeletionView(force=force, timeout_seconds=300))
    d = next_step(_deleting(301), policy)
    assert d.target is S.UPGRADE_FAILED
    assert d.action is Action.NONE


def test_pod_deletion_refused_fails_at_once_naming_the_pods() -> None:
    refused = ("ml/a (no controller manages it, it would not come back; needs force)",)
    d = next_step(_deleting(1, pods=1, gpu_pods_refused=refused), POLICY)
    assert d.triggers == ("pod_deletion_failed",)
    assert d.target is S.UPGRADE_FAILED
    assert d.reason == f"GPU pods may not be deleted: {refused[0]}"
    assert not d.notice


def test_pod_deletion_refused_with_nothing_else_left_still_fails() -> None:
    refused = ("ml/a (uses emptyDir, its data would be lost; needs deleteEmptyDir)",)
    d = next_step(_deleting(1, pods=0, gpu_pods_refused=refused), POLICY)
    assert d.target is S.UPGRADE_FAILED


def test_failed_pod_deletion_falls_back_to_drain_when_enabled() -> None:
    """Upstream: pod deletion that cannot finish hands the node to the drain."""
    refused = ("ml/a (no controller manages it, it would not come back; needs force)",)
    d = next_step(_deleting(1, pods=1, gpu_pods_refused=refused, drain_pods=1), DRAIN)
    assert d.triggers == ("pod_deletion_failed",)
    assert d.target is S.DRAIN_REQUIRED
    assert d.action is Action.DRAIN
    assert not d.entered_failed
    assert d.notice == f"GPU pods may not be deleted: {refused[0]}; draining the node instead"
    timed_out = next_step(_deleting(300, drain_pods=2), DRAIN)
    assert timed_out.target is S.DRAIN_REQUIRED
    assert "timed out after 300s" in timed_out.notice


def test_pod_deletion_and_drain_both_refusing_fail_in_one_pass() -> None:
    refused = ("ml/a (no controller manages it, it would not come back; needs force)",)
    v = _deleting(1, pods=1, gpu_pods_refused=refused, drain_pods=1, drain_refused=refused)
    d = next_step(v, DRAIN)
    assert d.triggers == ("pod_deletion_failed", "drain_failed")
    assert d.target is S.UPGRADE_FAILED
    assert d.notice
    assert d.failure == f"drain may not evict: {refused[0]}"


def test_pod_deletion_disabled_skips_the_state() -> None:
    policy = replace(POLICY, pod_deletion=None)
    d = next_step(_deleting(10**6, pods=5), policy)
    assert d.target is S.POD_RESTART_REQUIRED
    assert d.triggers == ("gpu_pods_deleted", "drained")


def test_pod_deletion_timeout_zero_never_fails() -> None:
    policy = replace(POLICY, pod_deletion=PodDeletionView(timeout_seconds=0))
    d = next_step(_deleting(10**7), policy)
    assert d.target is S.POD_DELETION_REQUIRED
    assert d.requeue_after is None


# --- drain-required -------------------------------------------------------------------------


def _draining(seconds_ago: float, pods: int = 3, **kw: Any) -> NodeUpgradeView:
    return view(
        S.DRAIN_REQUIRED,
        unschedulable=True,
        drain_pods=pods,
        annotations={DRAIN_START_ANNOTATION: since(seconds_ago)},
        **kw,
    )


def test_drains() -> None:
    d = next_step(_draining(60), DRAIN)
    assert d.action is Action.DRAIN
    assert d.requeue_after == 240
    assert d.reason == "draining 3 pods"


def test_drained_moves_to_restart() -> None:
    d = next_step(_draining(60, pods=0), DRAIN)
    assert d.triggers == ("drained",)
    assert d.target is S.POD_RESTART_REQUIRED
    assert d.action is Action.RESTART_DRIVER_POD


def test_drain_disabled_skips_the_state() -> None:
    d = next_step(_draining(60, pods=9), POLICY)
    assert d.target is S.POD_RESTART_REQUIRED


def test_drain_timeout_fails() -> None:
    d = next_step(_draining(300), DRAIN)
    assert d.triggers == ("drain_failed",)
    assert d.target is S.UPGRADE_FAILED
    assert d.reason == "drain timed out after 300s with 3 pods left"


def test_drain_timeout_with_force_fails_too() -> None:
    """`drain.force` is kubectl's --force (unmanaged pods may go), not a licence to
    delete past a PodDisruptionBudget once the timeout is up."""
    policy = replace(DRAIN, drain=DrainView(enable=True, force=True, timeout_seconds=300))
    left = ("ml/db-0 (Cannot evict pod as it would violate the pod's disruption budget)",)
    d = next_step(_draining(400, pods=1, pods_left=left), policy)
    assert d.target is S.UPGRADE_FAILED
    assert d.reason == f"drain timed out after 300s with 1 pods left: {left[0]}"


def test_drain_refusal_fails_at_once_without_evicting() -> None:
    refused = (
        "ml/a (no controller manages it, it would not come back; needs force)",
        "ml/b (uses emptyDir, its data would be lost; needs deleteEmptyDir)",
    )
    d = next_step(_draining(1, pods=2, drain_refused=refused), DRAIN)
    assert d.triggers == ("drain_failed",)
    assert d.target is S.UPGRADE_FAILED
    assert d.action is Action.NONE
    assert d.reason == f"drain may not evict: {refused[0]}; {refused[1]}"


def test_failure_reason_lists_at_most_five_pods() -> None:
    refused = tuple(f"ml/p{i} (x)" for i in range(7))
    d = next_step(_draining(1, pods=7, drain_refused=refused), DRAIN)
    assert d.reason.endswith("ml/p4 (x); and 2 more")


def test_refusals_do_not_matter_with_drain_disabled() -> None:
    d = next_step(_draining(1, pods=1, drain_refused=("ml/a (x)",)), POLICY)
    assert d.target is S.POD_RESTART_REQUIRED


@pytest.mark.parametrize("stamp", ["yesterday", "inf", "nan", ""])
def test_drain_clock_restarts_when_stamp_is_garbage(stamp: str) -> None:
    v = view(
        S.DRAIN_REQUIRED,
        unschedulable=True,
        drain_pods=3,
        annotations={DRAIN_START_ANNOTATION: stamp},
    )
    d = next_step(v, DRAIN)
    assert d.target is S.DRAIN_REQUIRED
    assert d.annotations[DRAIN_START_ANNOTATION] == T


# --- pod-restart-required -----------------------------------------------------------------------


def _restarting(pod: DriverPodView | None, **kw: Any) -> NodeUpgradeView:
    annotations = {
        **OURS,
        REPLACE_POD_ANNOTATION: "pod-old",
        POD_RESTART_START_ANNOTATION: since(30),
    }
    annotations.update(kw.pop("annotations", {}))
    return view(
        S.POD_RESTART_REQUIRED,
        unschedulable=True,
        driver_pod=pod,
        annotations=annotations,
        **kw,
    )


def test_restart_deletes_the_old_pod() -> None:
    d = next_step(_restarting(OLD_POD), POLICY)
    assert d.target is S.POD_RESTART_REQUIRED
    assert d.action is Action.RESTART_DRIVER_POD
    assert d.annotations == {STATE_SINCE_ANNOTATION: T}


def test_restart_deletes_an_outdated_pod_even_if_not_the_recorded_one() -> None:
    d = next_step(_restarting(replace(OLD_POD, uid="other")), POLICY)
    assert d.action is Action.RESTART_DRIVER_POD


def test_forced_upgrade_restarts_a_current_pod() -> None:
    pod = replace(NEW_POD, uid="pod-old")  # current revision, but the pod we must replace
    d = next_step(_restarting(pod), POLICY)
    assert d.action is Action.RESTART_DRIVER_POD


def test_waits_while_no_driver_pod_exists() -> None:
    d = next_step(_restarting(None), POLICY)
    assert d.action is Action.WAIT_DRIVER_POD


def test_waits_for_the_new_pod_to_become_ready() -> None:
    d = next_step(_restarting(NEW_POD_STARTING), POLICY)
    assert d.target is S.POD_RESTART_REQUIRED
    assert d.action is Action.WAIT_DRIVER_POD
    assert d.requeue_after == 1230  # the default startup probe's budget, 1,260 s


def test_new_ready_pod_moves_to_validation() -> None:
    d = next_step(_restarting(NEW_POD), POLICY)
    assert d.triggers == ("driver_restarted",)
    assert d.target is S.VALIDATION_REQUIRED
    assert d.action is Action.WAIT_VALIDATION
    assert d.annotations[VALIDATION_START_ANNOTATION] == T
    assert d.requeue_after == 600


def test_without_validation_goes_straight_to_uncordon() -> None:
    d = next_step(_restarting(NEW_POD), replace(POLICY, validation_enabled=False))
    assert d.target is S.UNCORDON_REQUIRED
    assert d.action is Action.UNCORDON


def test_crash_looping_new_pod_fails_the_node() -> None:
    pod = replace(NEW_POD, ready=False, restart_count=11)
    d = next_step(_restarting(pod), POLICY)
    assert d.triggers == ("driver_failed",)
    assert d.target is S.UPGRADE_FAILED
    assert d.reason == "driver pod restarted 11 times (limit 10)"


def test_restarts_within_limit_keep_waiting() -> None:
    pod = replace(NEW_POD, ready=False, restart_count=10)
    assert next_step(_restarting(pod), POLICY).target is S.POD_RESTART_REQUIRED


def test_old_pod_restart_count_is_not_held_against_the_upgrade() -> None:
    pod = replace(OLD_POD, restart_count=500)
    d = next_step(_restarting(pod), POLICY)
    assert d.action is Action.RESTART_DRIVER_POD


def test_driver_ready_timeout_fails_the_node_when_configured() -> None:
    policy = replace(POLICY, driver_ready_timeout_seconds=900)
    v = _restarting(None, annotations={POD_RESTART_START_ANNOTATION: since(900)})
    d = next_step(v, policy)
    assert d.target is S.UPGRADE_FAILED
    assert d.reason == "new driver pod not ready after 900s (no new driver pod on the node)"
    waiting = next_step(_restarting(None), policy)
    assert waiting.requeue_after == 870


def test_a_new_driver_pod_that_never_turns_ready_fails_by_default() -> None:
    """ImagePullBackOff with no restarts used to hold the node cordoned for ever."""
    pod = replace(NEW_POD_STARTING, waiting_reason="ImagePullBackOff")
    assert POLICY.driver_ready_timeout_seconds == 1260
    waiting = next_step(_restarting(pod), POLICY)
    assert waiting.target is S.POD_RESTART_REQUIRED
    assert waiting.requeue_after == 1230
    # A slow driver build within the startup probe's budget is not failed.
    v = _restarting(pod, annotations={POD_RESTART_START_ANNOTATION: since(1200)})
    assert next_step(v, POLICY).target is S.POD_RESTART_REQUIRED
    v = _restarting(pod, annotations={POD_RESTART_START_ANNOTATION: since(1260)})
    d = next_step(v, POLICY)
    assert d.target is S.UPGRADE_FAILED
    assert (
        d.reason
        == "new driver pod not ready after 1260s (new driver pod waiting: ImagePullBackOff)"
    )
    assert d.annotations[REASON_ANNOTATION] == d.reason


def test_driver_ready_timeout_zero_waits_forever() -> None:
    policy = replace(POLICY, driver_ready_timeout_seconds=0)
    v = _restarting(NEW_POD_STARTING, annotations={POD_RESTART_START_ANNOTATION: since(10**6)})
    assert next_step(v, policy).target is S.POD_RESTART_REQUIRED


# --- validation-required ---------------------------------------------------------------------


def _validating(seconds_ago: float, **kw: Any) -> NodeUpgradeView:
    kw.setdefault("driver_pod", NEW_POD)
    return view(
        S.VALIDATION_REQUIRED,
        unschedulable=True,
        annotations={
            REPLACE_POD_ANNOTATION: "pod-old",
            VALIDATION_START_ANNOTATION: since(seconds_ago),
        },
        **kw,
    )


def test_waits_for_validators() -> None:
    d = next_step(_validating(100), POLICY)
    assert d.action is Action.WAIT_VALIDATION
    assert d.requeue_after == 500


def test_validators_ready_moves_to_uncordon() -> None:
    d = next_step(_validating(100, validators_ready=True), POLICY)
    assert d.triggers == ("validated",)
    assert d.target is S.UNCORDON_REQUIRED
    assert d.action is Action.UNCORDON
    assert d.annotations[VALIDATION_START_ANNOTATION] is None


def test_validation_timeout_fails() -> None:
    d = next_step(_validating(600), POLICY)
    assert d.triggers == ("validation_failed",)
    assert d.target is S.UPGRADE_FAILED
    assert d.reason == "validation did not pass within 600s"


def test_crash_loop_during_validation_fails() -> None:
    pod = replace(NEW_POD, restart_count=12)
    d = next_step(_validating(10, driver_pod=pod, validators_ready=True), POLICY)
    assert d.target is S.UPGRADE_FAILED
    assert d.reason.startswith("driver pod restarted 12 times")


def test_newer_revision_during_validation_restarts_again() -> None:
    d = next_step(_validating(10, newest_revision="rev-newer"), POLICY)
    assert d.triggers == ("driver_changed",)
    assert d.target is S.POD_RESTART_REQUIRED
    assert d.action is Action.RESTART_DRIVER_POD


# --- uncordon-required -----------------------------------------------------------------------


def test_uncordons_a_node_we_cordoned() -> None:
    v = view(S.UNCORDON_REQUIRED, driver_pod=NEW_POD, unschedulable=True)
    d = next_step(v, POLICY)
    assert d.target is S.UNCORDON_REQUIRED
    assert d.action is Action.UNCORDON


def test_uncordoned_node_is_done_and_records_are_dropped() -> None:
    v = view(
        S.UNCORDON_REQUIRED,
        driver_pod=NEW_POD,
        annotations={REPLACE_POD_ANNOTATION: "pod-old", STATE_SINCE_ANNOTATION: since(5)},
    )
    d = next_step(v, POLICY)
    assert d.triggers == ("uncordoned",)
    assert d.target is S.UPGRADE_DONE
    assert d.action is Action.NONE
    assert d.annotations == {REPLACE_POD_ANNOTATION: None, STATE_SINCE_ANNOTATION: T}


def test_node_cordoned_before_the_upgrade_stays_cordoned() -> None:
    v = view(
        S.UNCORDON_REQUIRED,
        driver_pod=NEW_POD,
        unschedulable=True,
        annotations={INITIAL_UNSCHEDULABLE_ANNOTATION: "true"},
    )
    d = next_step(v, POLICY)
    assert d.target is S.UPGRADE_DONE
    assert d.action is Action.NONE  # no uncordon
    assert d.annotations[INITIAL_UNSCHEDULABLE_ANNOTATION] is None


# --- upgrade-failed ---------------------------------------------------------------------------


def _failed(**kw: Any) -> NodeUpgradeView:
    annotations = {
        **OURS,
        FAILED_REVISION_ANNOTATION: NEW,
        REASON_ANNOTATION: "drain timed out after 300s with 3 pods left",
        REPLACE_POD_ANNOTATION: "pod-old",
        STATE_SINCE_ANNOTATION: since(50),
    }
    annotations.update(kw.pop("annotations", {}))
    kw.setdefault("unschedulable", True)
    return view(S.UPGRADE_FAILED, annotations=annotations, **kw)


def test_failed_node_stays_failed_and_quiet() -> None:
    d = next_step(_failed(), POLICY)
    assert d.target is S.UPGRADE_FAILED
    assert d.action is Action.NONE
    assert d.reason == "drain timed out after 300s with 3 pods left"
    assert not d.has_patch
    assert d.entered_failed is False


def test_failed_node_is_retried_on_a_new_revision() -> None:
    d = next_step(_failed(newest_revision="rev-newer"), POLICY)
    assert d.triggers == ("retry",)
    assert d.target is S.UPGRADE_REQUIRED
    assert d.annotations[FAILED_REVISION_ANNOTATION] is None
    assert d.annotations[REASON_ANNOTATION] is None


def test_failed_node_is_retried_on_request() -> None:
    d = next_step(_failed(annotations={REQUESTED_ANNOTATION: "true"}), POLICY, may_start=True)
    assert d.triggers[:2] == ("retry", "start")
    assert d.annotations[REQUESTED_ANNOTATION] is None


def test_failed_node_recovers_when_driver_is_current_and_valid() -> None:
    v = _failed(driver_pod=NEW_POD, validators_ready=True)
    d = next_step(v, POLICY)
    assert d.triggers == ("recovered",)
    assert d.target is S.UNCORDON_REQUIRED
    assert d.action is Action.UNCORDON


def test_failed_node_does_not_recover_with_invalid_driver() -> None:
    assert next_step(_failed(driver_pod=NEW_POD), POLICY).target is S.UPGRADE_FAILED


def test_failed_node_without_record_gets_one() -> None:
    v = view(S.UPGRADE_FAILED, annotations={STATE_SINCE_ANNOTATION: since(5)})
    d = next_step(v, POLICY)
    assert d.target is S.UPGRADE_FAILED
    assert d.annotations == {FAILED_REVISION_ANNOTATION: NEW}
    # ...so the next revision change retries it
    later = view(
        S.UPGRADE_FAILED,
        annotations={STATE_SINCE_ANNOTATION: since(5), FAILED_REVISION_ANNOTATION: NEW},
        newest_revision="rev-newer",
    )
    assert next_step(later, POLICY).target is S.UPGRADE_REQUIRED


# --- skip label ----------------------------------------------------------------------------------


def test_skip_label_keeps_a_node_from_starting() -> None:
    v = view(
        S.UPGRADE_REQUIRED, labels={SKIP_LABEL: "true"}, annotations={STATE_SINCE_ANNOTATION: T}
    )
    d = next_step(v, POLICY, may_start=True)
    assert d.target is S.UPGRADE_REQUIRED
    assert d.action is Action.NONE
    assert not d.has_patch
    assert d.reason == "skip label set"


@pytest.mark.parametrize(
    ("state", "kw", "target"),
    [
        (S.CORDON_REQUIRED, {"unschedulable": False}, S.CORDON_REQUIRED),
        (S.DRAIN_REQUIRED, {"unschedulable": True}, S.POD_RESTART_REQUIRED),
        (S.UNCORDON_REQUIRED, {"unschedulable": True}, S.UNCORDON_REQUIRED),
    ],
)
def test_skip_label_set_mid_upgrade_does_not_freeze_the_node(
    state: S, kw: dict[str, Any], target: S
) -> None:
    """It used to stop every step: still cordoned, still holding its slot, for ever."""
    v = view(state, labels={SKIP_LABEL: "true"}, annotations={REPLACE_POD_ANNOTATION: "p"}, **kw)
    d = next_step(v, POLICY)
    assert d.target is target
    assert d.action is not Action.NONE


def test_skipped_node_in_progress_finishes_and_is_uncordoned() -> None:
    v = view(
        S.VALIDATION_REQUIRED,
        labels={SKIP_LABEL: "true"},
        unschedulable=True,
        driver_pod=NEW_POD,
        validators_ready=True,
        annotations={REPLACE_POD_ANNOTATION: "pod-old", VALIDATION_START_ANNOTATION: T},
    )
    d = next_step(v, POLICY)
    assert d.target is S.UNCORDON_REQUIRED
    assert d.action is Action.UNCORDON
    done = next_step(replace(_applied(v, d), unschedulable=False), POLICY)
    assert done.target is S.UPGRADE_DONE


def test_skip_label_does_not_stop_the_cleanup_when_upgrades_are_off() -> None:
    """With the policy deleted (or autoUpgrade off) a skipped node is handed back too."""
    v = view(S.DRAIN_REQUIRED, labels={SKIP_LABEL: "true"}, unschedulable=True)
    d = next_step(v, UpgradePolicyView(auto_upgrade=False))
    assert d.action is Action.UNCORDON
    later = next_step(replace(v, unschedulable=False), UpgradePolicyView(auto_upgrade=False))
    assert later.labels == {STATE_LABEL: None}


def test_skip_label_must_be_true() -> None:
    v = view(labels={SKIP_LABEL: "false"})
    assert next_step(v, POLICY).target is S.UPGRADE_REQUIRED


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
    again = next_step(_applied(v, d), WAIT if state is S.WAIT_FOR_JOBS_REQUIRED else DRAIN)
    assert not again.has_patch
    assert again.target is d.target


# --- whole upgrades, with a simulated controller -------------------------------------------------


@dataclass
class World:
    """A node plus a toy controller that performs actions the way the real one will."""

    policy: UpgradePolicyView = POLICY
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    unschedulable: bool = False
    pod: DriverPodView | None = OLD_POD
    newest: str = NEW
    gpu_pods: int = 2
    drain_pods: int = 3
    wait_pods: int = 0
    validators_ready: bool = False
    digest: str = ""
    now: float = NOW
    effects: list[Action] = field(default_factory=list)
    patches: int = 0
    restarts: int = 0

    def view(self) -> NodeUpgradeView:
        return NodeUpgradeView(
            name="gpu-1",
            now=self.now,
            labels=dict(self.labels),
            annotations=dict(self.annotations),
            unschedulable=self.unschedulable,
            driver_pod=self.pod,
            newest_revision=self.newest,
            wait_pods_running=self.wait_pods,
            gpu_pods=self.gpu_pods,
            drain_pods=self.drain_pods,
            validators_ready=self.validators_ready,
            newest_config_digest=self.digest,
        )

    def persist(self, d: Decision) -> None:
        if d.has_patch:
            self.patches += 1
        for target, patch in ((self.labels, d.labels), (self.annotations, d.annotations)):
            for k, v in patch.items():
                if v is None:
                    target.pop(k, None)
                else:
                    target[k] = v

    def perform(self, d: Decision) -> None:
        self.effects.append(d.action)
        if d.action is Action.CORDON:
            self.unschedulable = True
        elif d.action is Action.UNCORDON:
            self.unschedulable = False
        elif d.action is Action.DELETE_GPU_PODS:
            self.gpu_pods = 0
        elif d.action is Action.DRAIN:
            self.drain_pods = 0
        elif d.action is Action.WAIT_JOBS:
            self.wait_pods = 0
        elif d.action is Action.RESTART_DRIVER_POD:
            self.restarts += 1
            self.pod = DriverPodView(uid=f"pod-{self.restarts}", revision_hash=self.newest)
        elif d.action is Action.WAIT_DRIVER_POD and self.pod is not None:
            self.pod = replace(self.pod, running=True, ready=True)
        elif d.action is Action.WAIT_VALIDATION:
            self.validators_ready = True

    def step(self) -> Decision:
        view = self.view()
        # the fleet budget only ever grants slots to queued nodes
        may_start = view.state is S.UPGRADE_REQUIRED
        d = next_step(view, self.policy, may_start=may_start)
        self.persist(d)  # persist first ...
        self.perform(d)  # ... then act
        self.now += 1
        return d

    def run(self, limit: int = 30) -> list[Decision]:
        steps = []
        for _ in range(limit):
            d = self.step()
            steps.append(d)
            if d.target is S.UPGRADE_DONE and d.action is Action.NONE:
                return steps
        raise AssertionError(f"no convergence: {[s.target for s in steps]}")


def _applied(v: NodeUpgradeView, d: Decision) -> NodeUpgradeView:
    labels = dict(v.labels)
    annotations = dict(v.annotations)
    for target, patch in ((labels, d.labels), (annotations, d.annotations)):
        for k, val in patch.items():
            if val is None:
                target.pop(k, None)
            else:
                target[k] = val
    return replace(v, labels=labels, annotations=annotations)


def test_full_upgrade_with_drain() -> None:
    world = World(policy=DRAIN)
    steps = world.run()
    visited = [s.target for s in steps]
    assert visited == [
        S.UPGRADE_REQUIRED,  # unknown -> required (fleet gives the slot next pass)
        S.CORDON_REQUIRED,
        S.POD_DELETION_REQUIRED,
        S.DRAIN_REQUIRED,
        S.POD_RESTART_REQUIRED,
        S.POD_RESTART_REQUIRED,  # waiting for the new pod
        S.VALIDATION_REQUIRED,
        S.UNCORDON_REQUIRED,
        S.UPGRADE_DONE,
    ]
    assert world.effects.count(Action.DRAIN) == 1
    assert world.effects.count(Action.RESTART_DRIVER_POD) == 1
    assert world.unschedulable is False
    assert world.labels == {STATE_LABEL: "upgrade-done"}
    assert world.annotations == {STATE_SINCE_ANNOTATION: str(int(world.now - 1))}
    assert world.pod is not None
    assert world.pod.revision_hash == NEW


def test_full_upgrade_then_fixpoint() -> None:
    world = World(policy=DRAIN)
    world.run()
    patches = world.patches
    for _ in range(3):
        d = world.step()
        assert d.target is S.UPGRADE_DONE
        assert d.action is Action.NONE
    assert world.patches == patches, "a converged node must cause no writes"


def test_full_upgrade_of_a_node_cordoned_by_someone_else() -> None:
    world = World(policy=DRAIN, unschedulable=True)
    world.run()
    assert Action.CORDON not in world.effects
    assert Action.UNCORDON not in world.effects
    assert world.unschedulable is True
    assert INITIAL_UNSCHEDULABLE_ANNOTATION not in world.annotations


def test_full_forced_upgrade_restarts_a_current_driver() -> None:
    world = World(pod=NEW_POD, annotations={REQUESTED_ANNOTATION: "true"})
    world.run()
    assert world.restarts == 1
    assert REQUESTED_ANNOTATION not in world.annotations


def test_full_upgrade_with_wait_for_jobs_and_no_validation() -> None:
    world = World(policy=replace(WAIT, validation_enabled=False), wait_pods=2)
    steps = world.run()
    assert S.WAIT_FOR_JOBS_REQUIRED in [s.target for s in steps]
    assert S.VALIDATION_REQUIRED not in [s.target for s in steps]


def test_restart_mid_drain_resumes_without_redoing_earlier_steps() -> None:
    world = World(policy=DRAIN)
    while True:
        d = world.step()
        if d.target is S.DRAIN_REQUIRED:
            break
    effects_before = list(world.effects)
    # "operator restart": nothing but the node survives; a fresh pass resumes the drain
    d = next_step(world.view(), world.policy)
    assert d.target is S.POD_RESTART_REQUIRED  # drain already happened
    assert effects_before.count(Action.CORDON) == 1
    assert effects_before.count(Action.DRAIN) == 1


def test_crash_loop_fails_and_recovers_after_fix() -> None:
    world = World()
    for _ in range(5):
        d = world.step()
        if d.action is Action.RESTART_DRIVER_POD:
            break
    # the new driver pod crash-loops
    assert world.pod is not None
    world.pod = replace(world.pod, restart_count=20)
    d = world.step()
    assert d.target is S.UPGRADE_FAILED
    assert d.entered_failed
    assert world.unschedulable is True  # failed nodes stay cordoned
    assert world.step().target is S.UPGRADE_FAILED
    # the admin deletes the pod; a healthy one comes up and validates
    world.pod = DriverPodView(uid="pod-fixed", revision_hash=NEW, running=True, ready=True)
    world.validators_ready = True
    steps = world.run()
    assert steps[0].triggers == ("recovered",)
    assert world.unschedulable is False
    assert FAILED_REVISION_ANNOTATION not in world.annotations


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
    model = upgrade._NodeModel(GuardContext(v, policy, may_start))
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
    assert next_step(_applied(v, d), POLICY, may_start=True).target is S.UPGRADE_FAILED


@settings(max_examples=1000)
@given(v=views, policy=policies, may_start=st.booleans())
def test_decisions_reach_a_fixpoint(
    v: NodeUpgradeView, policy: UpgradePolicyView, may_start: bool
) -> None:
    """Persisting a decision and asking again (nothing else changed) changes nothing:
    a reconcile pass with no news makes no writes and never double-fires an effect.

    Excluded: a node hand-labelled into an in-progress state (no record of the pod to
    replace) that also carries an upgrade request. Its first pass finishes the
    unrecorded upgrade and takes the request as a new one, recording the pod to
    replace; the second pass then moves on. Two passes, both correct, but not a
    fixpoint after one (found by hypothesis)."""
    assume(
        not (v.state in IN_PROGRESS_STATES and v.upgrade_requested and v.replace_pod_uid is None)
    )
    d = next_step(v, policy, may_start=may_start)
    again = next_step(_applied(v, d), policy, may_start=may_start)
    assert again.target is d.target
    assert again.triggers == ()
    assert not again.has_patch
    assert again.action is d.action


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


# --- restart without drain -------------------------------------------------------------------

SAME = replace(OLD_POD, config_digest="d1")


def test_only_the_pod_changed_restarts_it_without_emptying_the_node() -> None:
    """Same DRIVER_CONFIG_DIGEST in the old pod and the new template: cordon, restart the
    pod, validate, uncordon; no job wait, no GPU pod deletion, no drain."""
    drain_all = replace(
        DRAIN,
        wait_for_completion=WaitForCompletionView(pod_selector="app=x", timeout_seconds=0),
    )
    v = view(
        S.CORDON_REQUIRED,
        driver_pod=SAME,
        newest_config_digest="d1",
        unschedulable=True,
        wait_pods_running=2,
        gpu_pods=2,
        drain_pods=3,
        annotations={REPLACE_POD_ANNOTATION: "pod-old"},
    )
    d = next_step(v, drain_all)
    assert d.target is S.POD_RESTART_REQUIRED
    assert d.action is Action.RESTART_DRIVER_POD
    assert d.triggers == ("cordoned",)


def test_a_restart_only_upgrade_never_cordons_nor_empties_the_node() -> None:
    """Same DRIVER_CONFIG_DIGEST from the start: the slot goes straight to the pod
    restart; the node is never cordoned, no GPU pod deleted, nothing drained."""
    world = World(policy=DRAIN, pod=SAME, digest="d1")
    steps = world.run()
    assert steps[1].hops[0] == ("start", S.UPGRADE_REQUIRED, S.POD_RESTART_REQUIRED)
    assert steps[1].action is Action.RESTART_DRIVER_POD
    assert S.CORDON_REQUIRED not in [s.target for s in steps]
    assert not {Action.CORDON, Action.DELETE_GPU_PODS, Action.DRAIN} & set(world.effects)
    assert world.restarts == 1
    assert world.unschedulable is False
    assert world.labels == {STATE_LABEL: "upgrade-done"}


def test_a_changed_digest_or_a_request_takes_the_full_way() -> None:
    base = view(
        S.CORDON_REQUIRED,
        driver_pod=SAME,
        unschedulable=True,
        annotations={REPLACE_POD_ANNOTATION: "pod-old"},
    )
    asked = replace(
        base,
        newest_config_digest="d1",
        annotations={**base.annotations, REQUESTED_ANNOTATION: "true"},
    )
    changed = replace(base, newest_config_digest="d2")
    unknown = replace(base, newest_config_digest="")
    for v in (changed, unknown, asked):
        # The first hop empties the node (jobs, GPU pods, drain) before the restart.
        assert next_step(v, DRAIN).hops[0][2] is S.WAIT_FOR_JOBS_REQUIRED


def test_the_driver_ready_bound_is_the_startup_probes_budget() -> None:
    """Issue 31 item 4: the default probe allows 60 + 10 x 120 s; a policy's own probe
    gives its own budget, through the policy view the controller builds."""
    from components.driver import startup_budget_seconds
    from gpuop.controller._upgrade_inputs import policy_view

    default = crd.ClusterPolicySpec()
    assert startup_budget_seconds(default.driver) == 1260
    assert policy_view(default).driver_ready_timeout_seconds == 1260
    short = crd.ClusterPolicySpec.model_validate(
        {
            "driver": {
                "startupProbe": {
                    "initialDelaySeconds": 0,
                    "periodSeconds": 2,
                    "failureThreshold": 10,
                }
            }
        }
    )
    assert policy_view(short).driver_ready_timeout_seconds == 20
    partial = crd.ClusterPolicySpec.model_validate(
        {"driver": {"startupProbe": {"periodSeconds": 5}}}
    )
    assert startup_budget_seconds(partial.driver) == 60 + 5 * 120
