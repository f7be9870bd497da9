"""Guards of the driver upgrade machine: pure predicates over one node's snapshot.

Guards leaving the same state are written to be mutually exclusive, so the outcome
never depends on the order triggers are tried (a property test checks this).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from statemachine.cordon import CordonOwner, recorded_owner, remediation_needs_cordon
from statemachine.upgrade_keys import FAILED_REVISION_ANNOTATION, TIMER_ANNOTATIONS, UpgradeState
from statemachine.upgrade_views import DriverPodView, NodeUpgradeView, UpgradePolicyView


@dataclass(frozen=True)
class GuardContext:
    view: NodeUpgradeView
    policy: UpgradePolicyView
    may_start: bool = False


def _has_selector(selector: Mapping[str, str] | str) -> bool:
    return bool(selector.strip()) if isinstance(selector, str) else bool(selector)


def state_started_at(view: NodeUpgradeView, state: UpgradeState) -> float:
    """When the node entered a timed state; a missing stamp starts the clock now, and
    so does one in the future (a typo, a skewed clock): it would disable the timeout."""
    key = TIMER_ANNOTATIONS.get(state)
    started = view.annotation_time(key) if key else None
    return view.now if started is None else min(started, view.now)


def timed_out(view: NodeUpgradeView, state: UpgradeState, timeout_seconds: int) -> bool:
    if timeout_seconds <= 0:
        return False
    return view.now - state_started_at(view, state) >= timeout_seconds


# --- the driver pod -----------------------------------------------------------------


def driver_current(ctx: GuardContext) -> bool:
    """The driver pod runs the DaemonSet's newest revision."""
    pod, newest = ctx.view.driver_pod, ctx.view.newest_revision
    return pod is not None and newest is not None and pod.revision_hash == newest


def driver_outdated(ctx: GuardContext) -> bool:
    pod, newest = ctx.view.driver_pod, ctx.view.newest_revision
    return pod is not None and newest is not None and pod.revision_hash != newest


def needs_upgrade(ctx: GuardContext) -> bool:
    return driver_outdated(ctx) or ctx.view.upgrade_requested or ctx.view.moving


def up_to_date(ctx: GuardContext) -> bool:
    return driver_current(ctx) and not ctx.view.upgrade_requested and not ctx.view.moving


def enrolled(ctx: GuardContext) -> bool:
    """A new GPU node with no driver pod: the pod the DaemonSet creates is the newest."""
    view = ctx.view
    return view.enrolling and view.driver_pod is None and not view.upgrade_requested


def new_driver_pod(ctx: GuardContext) -> DriverPodView | None:
    """The replacement pod: current revision and not the pod we set out to replace."""
    pod = ctx.view.driver_pod
    if pod is None or not driver_current(ctx) or pod.uid == ctx.view.replace_pod_uid:
        return None
    return pod


def driver_crash_looping(ctx: GuardContext) -> bool:
    pod = new_driver_pod(ctx)
    return pod is not None and pod.restart_count > ctx.policy.driver_restart_limit


def new_driver_ready(ctx: GuardContext) -> bool:
    pod = new_driver_pod(ctx)
    return pod is not None and pod.running and pod.ready and not driver_crash_looping(ctx)


def driver_ready_timed_out(ctx: GuardContext) -> bool:
    return (
        not new_driver_ready(ctx)
        and not driver_crash_looping(ctx)
        and timed_out(
            ctx.view, UpgradeState.POD_RESTART_REQUIRED, ctx.policy.driver_ready_timeout_seconds
        )
    )


# --- the cordon ---------------------------------------------------------------------


def owns_cordon(ctx: GuardContext) -> bool:
    """The node is cordoned and its record (`statemachine.cordon`) names the upgrade.

    The record only: `upgrade.next_step` writes one for a cordon from before records
    existed before any guard runs, so no guard reads the (then stale) state label.
    """
    view = ctx.view
    return view.unschedulable and recorded_owner(view.annotations) is CordonOwner.DRIVER_UPGRADE


def cordon_orphaned(ctx: GuardContext) -> bool:
    """Cordoned by the upgrade, yet its state says no upgrade (the label was removed or
    mistyped): left alone, it would stay cordoned for ever, using up maxUnavailable."""
    return owns_cordon(ctx)


def driver_proven(ctx: GuardContext) -> bool:
    """The driver pod is current, is not the one we set out to replace, runs Ready and
    (with validation on) validated: safe to put the node back in service."""
    view = ctx.view
    valid = view.validators_ready or not ctx.policy.validation_enabled
    return new_driver_ready(ctx) and valid and not view.upgrade_requested


def orphan_proven(ctx: GuardContext) -> bool:
    return cordon_orphaned(ctx) and driver_proven(ctx)


def orphan_unproven(ctx: GuardContext) -> bool:
    """Nothing shows the driver works (the label may have said upgrade-failed): never
    uncordoned on a guess; the upgrade is queued again and redone in full."""
    return cordon_orphaned(ctx) and not driver_proven(ctx)


# --- leaving done / unknown / upgrade-required ---------------------------------------


def interrupted_upgrade(ctx: GuardContext) -> bool:
    """An upgrade already started on this node (we recorded the pod to replace, or we
    hold its cordon).

    Seen in `upgrade-required` when an administrator relabels a failed or stuck node
    to retry it, or after a lost label: that node must go through the whole upgrade
    again, even if its driver pod is current, and never be waved through to
    `upgrade-done` still cordoned.
    """
    return ctx.view.replace_pod_uid is not None or owns_cordon(ctx)


# A node at rest that holds our cordon resumes (`resume_cordoned`) instead of these.


def needs_upgrade_no_orphan(ctx: GuardContext) -> bool:
    return needs_upgrade(ctx) and not cordon_orphaned(ctx)


def up_to_date_no_orphan(ctx: GuardContext) -> bool:
    return up_to_date(ctx) and not cordon_orphaned(ctx)


def enrolled_no_orphan(ctx: GuardContext) -> bool:
    return enrolled(ctx) and not cordon_orphaned(ctx)


def slot_granted(ctx: GuardContext) -> bool:
    """The fleet budget gave this node a slot, and the node can take it.

    The skip label only ever stops a start (as upstream): a node already on its way
    finishes, or fails with a reason, rather than staying cordoned in a frozen state.
    """
    wanted = needs_upgrade(ctx) or interrupted_upgrade(ctx)
    return ctx.may_start and ctx.view.node_ready and wanted and not ctx.view.skip


def upgrade_cancelled(ctx: GuardContext) -> bool:
    """Still queued but nothing to do any more (e.g. the driver change was reverted)."""
    return up_to_date(ctx) and not interrupted_upgrade(ctx)


# --- cordon and workload removal -------------------------------------------------------


def restart_only(ctx: GuardContext) -> bool:
    """Only the pod changed, not the driver (same config digest, as upstream 26.7
    compares DRIVER_CONFIG_DIGEST): restart the pod without emptying the node. An
    upgrade an administrator asked for, or a move to another NVIDIADriver, always takes
    the full way."""
    view = ctx.view
    pod = view.driver_pod
    if pod is None or not pod.config_digest:
        return False
    same = pod.config_digest == view.newest_config_digest
    return same and driver_outdated(ctx) and not view.upgrade_requested and not view.moving


def restart_slot(ctx: GuardContext) -> bool:
    """A slot for a node whose driver stays: its pod is restarted without a cordon.

    Upstream 26.7 cordons first, so that a node stays unschedulable if the restart
    fails; here the restarted pod's driver container and manager see the digest they
    installed and keep the loaded driver, so running and new GPU pods keep working
    either way, and a cordon would only stop scheduling (and, during a migration from
    NVIDIA's operator, cordon every GPU node for a label change). A retry of an
    interrupted upgrade takes the full way.
    """
    return slot_granted(ctx) and restart_only(ctx) and not interrupted_upgrade(ctx)


def cordon_slot(ctx: GuardContext) -> bool:
    """A slot for a node that takes the full way (cordon first): every granted start
    that :func:`restart_slot` does not take, so the two never both hold."""
    return slot_granted(ctx) and not restart_slot(ctx)


def node_cordoned(ctx: GuardContext) -> bool:
    return ctx.view.unschedulable and not restart_only(ctx)


def cordoned_for_restart(ctx: GuardContext) -> bool:
    return ctx.view.unschedulable and restart_only(ctx)


def jobs_finished(ctx: GuardContext) -> bool:
    wait = ctx.policy.wait_for_completion
    if not _has_selector(wait.pod_selector) or ctx.view.wait_pods_running == 0:
        return True
    # Upstream semantics: the wait is a courtesy; once it times out we go on.
    return timed_out(ctx.view, UpgradeState.WAIT_FOR_JOBS_REQUIRED, wait.timeout_seconds)


def gpu_pods_gone(ctx: GuardContext) -> bool:
    view = ctx.view
    return ctx.policy.pod_deletion is None or (view.gpu_pods == 0 and not view.gpu_pods_refused)


def pod_deletion_timed_out(ctx: GuardContext) -> bool:
    deletion = ctx.policy.pod_deletion
    return (
        deletion is not None
        and ctx.view.gpu_pods > 0
        and timed_out(ctx.view, UpgradeState.POD_DELETION_REQUIRED, deletion.timeout_seconds)
    )


def pod_deletion_unsuccessful(ctx: GuardContext) -> bool:
    """A GPU pod the flags do not allow removing, or the pods did not go in time."""
    refused = ctx.policy.pod_deletion is not None and bool(ctx.view.gpu_pods_refused)
    return refused or pod_deletion_timed_out(ctx)


def pod_deletion_failed(ctx: GuardContext) -> bool:
    return pod_deletion_unsuccessful(ctx) and not ctx.policy.drain.enable


def pod_deletion_falls_back_to_drain(ctx: GuardContext) -> bool:
    """Upstream: when the GPU pods cannot be deleted and drain is enabled, drain instead."""
    return pod_deletion_unsuccessful(ctx) and ctx.policy.drain.enable


def drained(ctx: GuardContext) -> bool:
    view = ctx.view
    return not ctx.policy.drain.enable or (view.drain_pods == 0 and not view.drain_refused)


def drain_timed_out(ctx: GuardContext) -> bool:
    drain = ctx.policy.drain
    return (
        drain.enable
        and ctx.view.drain_pods > 0
        and timed_out(ctx.view, UpgradeState.DRAIN_REQUIRED, drain.timeout_seconds)
    )


def drain_failed(ctx: GuardContext) -> bool:
    """A pod the flags do not allow evicting (kubectl fails at once), or a timeout."""
    refused = ctx.policy.drain.enable and bool(ctx.view.drain_refused)
    return refused or drain_timed_out(ctx)


# --- restart and validation -------------------------------------------------------------


def restarted_validate(ctx: GuardContext) -> bool:
    return ctx.policy.validation_enabled and new_driver_ready(ctx)


def restarted_no_validation(ctx: GuardContext) -> bool:
    return not ctx.policy.validation_enabled and new_driver_ready(ctx)


def restart_failed(ctx: GuardContext) -> bool:
    return driver_crash_looping(ctx) or driver_ready_timed_out(ctx)


def validated(ctx: GuardContext) -> bool:
    return ctx.view.validators_ready and new_driver_ready(ctx)


def validation_failed(ctx: GuardContext) -> bool:
    if driver_outdated(ctx):
        return False  # a newer driver arrived: restart it rather than fail
    if driver_crash_looping(ctx):
        return True
    return not validated(ctx) and timed_out(
        ctx.view, UpgradeState.VALIDATION_REQUIRED, ctx.policy.validation_timeout_seconds
    )


# --- uncordon and failure recovery -------------------------------------------------------


def may_finish(ctx: GuardContext) -> bool:
    """Schedulable again, or the cordon is not the upgrade's (an administrator's, or a
    quarantine's): the upgrade lifts only its own."""
    return not owns_cordon(ctx)


def quarantine_takes_cordon(ctx: GuardContext) -> bool:
    """Our cordon, but remediation quarantined the node meanwhile with an action that
    cordons: the cordon is handed over, not lifted."""
    return owns_cordon(ctx) and remediation_needs_cordon(ctx.view.annotations)


def retry_wanted(ctx: GuardContext) -> bool:
    """A failed node is retried when asked to, or when the driver changes again."""
    if ctx.view.upgrade_requested:
        return True
    failed_at = ctx.view.annotations.get(FAILED_REVISION_ANNOTATION)
    newest = ctx.view.newest_revision
    return failed_at is not None and newest is not None and newest != failed_at


def recovered(ctx: GuardContext) -> bool:
    """The node healed without us: its driver is current, ready and (if asked) valid."""
    if retry_wanted(ctx) or not new_driver_ready(ctx):
        return False
    return ctx.view.validators_ready or not ctx.policy.validation_enabled
