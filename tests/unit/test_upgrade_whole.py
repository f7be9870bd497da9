"""Whole upgrades, step by step against a simulated controller: each ends done,
uncordoned and at a fixpoint, and a restart mid-way redoes nothing."""

from __future__ import annotations

from dataclasses import replace

from statemachine.upgrade import next_step
from statemachine.upgrade_keys import (
    FAILED_REVISION_ANNOTATION,
    INITIAL_UNSCHEDULABLE_ANNOTATION,
    REQUESTED_ANNOTATION,
    STATE_LABEL,
    STATE_SINCE_ANNOTATION,
)
from statemachine.upgrade_views import (
    Action,
    DriverPodView,
)
from tests.unit.upgrade_fixtures import (
    DRAIN,
    NEW,
    NEW_POD,
    WAIT,
    S,
    World,
)

# --- whole upgrades, with a simulated controller -------------------------------------------------


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
