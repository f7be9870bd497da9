"""Emptying a node for its new driver: cordon, wait for jobs, GPU pod deletion and drain,
with their timeouts, refusals and the flags that switch each step off."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from statemachine.upgrade import next_step
from statemachine.upgrade_keys import (
    DRAIN_START_ANNOTATION,
    FAILED_REVISION_ANNOTATION,
    POD_DELETION_START_ANNOTATION,
    REASON_ANNOTATION,
    STATE_LABEL,
    STATE_SINCE_ANNOTATION,
    WAIT_FOR_COMPLETION_START_ANNOTATION,
)
from statemachine.upgrade_views import (
    Action,
    DrainView,
    NodeUpgradeView,
    PodDeletionView,
    WaitForCompletionView,
)
from tests.unit.upgrade_fixtures import (
    DRAIN,
    NEW,
    OURS,
    POLICY,
    WAIT,
    S,
    T,
    since,
    view,
)

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
