"""Restarting the driver and finishing: the old pod is replaced, the new one must turn
ready (crash loops and the ready bound fail the node), validation, the uncordon that
returns only our own cordon, and the restart-only way that never empties the node."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import crd
from statemachine.upgrade import next_step
from statemachine.upgrade_keys import (
    INITIAL_UNSCHEDULABLE_ANNOTATION,
    POD_RESTART_START_ANNOTATION,
    REASON_ANNOTATION,
    REPLACE_POD_ANNOTATION,
    REQUESTED_ANNOTATION,
    STATE_LABEL,
    STATE_SINCE_ANNOTATION,
    VALIDATION_START_ANNOTATION,
)
from statemachine.upgrade_views import (
    Action,
    DriverPodView,
    NodeUpgradeView,
    WaitForCompletionView,
)
from tests.unit.upgrade_fixtures import (
    DRAIN,
    NEW_POD,
    NEW_POD_STARTING,
    OLD_POD,
    OURS,
    POLICY,
    S,
    T,
    World,
    since,
    view,
)

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
    from gpuop.operator.controller.views.upgrade_inputs import policy_view

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
