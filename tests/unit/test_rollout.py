"""The cluster rollout machine: order, blocking, moving back, status progress."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from transitions import Machine

from statemachine import rollout
from statemachine.rollout import (
    ROLLOUT_COMPLETE,
    ROLLOUT_ORDER,
    ComponentStatus,
    StatePhase,
    plan_rollout,
)

UPSTREAM_ORDER = [
    "pre-requisites",
    "operator-metrics",
    "driver",
    "container-toolkit",
    "operator-validation",
    "device-plugin",
    "mps-control-daemon",
    "dcgm",
    "dcgm-exporter",
    "gpu-feature-discovery",
    "mig-manager",
    "node-status-exporter",
    "vgpu-manager",
    "vgpu-device-manager",
    "vfio-manager",  # upstream's comes after sandbox-validation (see components.registry)
    "sandbox-validation",
    "sandbox-device-plugin",
    "kata-device-plugin",
    "cc-manager",
]


def snapshot(
    not_ready: tuple[str, ...] = (), disabled: tuple[str, ...] = ()
) -> dict[str, ComponentStatus]:
    return {
        name: ComponentStatus(
            enabled=name not in disabled,
            ready=name not in not_ready,
            message=f"{name} pods unavailable" if name in not_ready else "",
        )
        for name in ROLLOUT_ORDER
    }


def test_order_is_upstream_order() -> None:
    assert list(ROLLOUT_ORDER) == UPSTREAM_ORDER


def test_machine_is_a_real_transitions_machine() -> None:
    machine = rollout._MACHINE.machine
    assert isinstance(machine, Machine)
    assert list(machine.states) == [*UPSTREAM_ORDER, ROLLOUT_COMPLETE]
    assert set(machine.events) == {"advance", "rewind"}
    assert machine.auto_transitions is False
    # every component state can advance to its successor and nowhere else
    for index, name in enumerate(UPSTREAM_ORDER):
        dests = [t.dest for t in machine.events["advance"].transitions[name]]
        assert dests == [[*UPSTREAM_ORDER, ROLLOUT_COMPLETE][index + 1]]
    assert not machine.models, "plan_rollout must detach its scratch models"


def test_all_ready_reaches_the_end() -> None:
    plan = plan_rollout(snapshot())
    assert plan.ready is True
    assert plan.state == ROLLOUT_COMPLETE
    assert plan.current is None
    assert plan.done == ROLLOUT_ORDER
    assert plan.pending == ()
    assert plan.message == "all components ready"
    assert plan.triggers == ("advance",) * len(ROLLOUT_ORDER)
    assert {p.phase for p in plan.progress} == {StatePhase.READY}


def test_stops_at_first_enabled_not_ready_state() -> None:
    plan = plan_rollout(snapshot(not_ready=("container-toolkit", "dcgm")))
    assert plan.ready is False
    assert plan.current == "container-toolkit"
    assert plan.state == "container-toolkit"
    assert plan.done == ("pre-requisites", "operator-metrics", "driver")
    assert plan.pending == ROLLOUT_ORDER[4:]
    assert plan.message == "container-toolkit is not ready: container-toolkit pods unavailable"
    phases = {p.name: p.phase for p in plan.progress}
    assert phases["driver"] is StatePhase.READY
    assert phases["container-toolkit"] is StatePhase.NOT_READY
    assert phases["operator-validation"] is StatePhase.PENDING
    # a later not-ready component is still only pending: the machine stopped earlier
    assert phases["dcgm"] is StatePhase.PENDING


def test_disabled_states_are_passed_and_listed_for_deletion() -> None:
    plan = plan_rollout(snapshot(disabled=("driver", "mig-manager"), not_ready=("driver",)))
    assert plan.ready is True
    assert plan.disabled == ("driver", "mig-manager")
    phases = {p.name: p.phase for p in plan.progress}
    assert phases["driver"] is StatePhase.DISABLED
    assert phases["mig-manager"] is StatePhase.DISABLED


def test_disabled_state_after_the_blocker_is_still_reported_for_deletion() -> None:
    plan = plan_rollout(snapshot(not_ready=("driver",), disabled=("dcgm",)))
    assert plan.current == "driver"
    assert plan.disabled == ("dcgm",)
    assert {p.name: p.phase for p in plan.progress}["dcgm"] is StatePhase.PENDING


def test_first_state_not_ready() -> None:
    plan = plan_rollout(snapshot(not_ready=("pre-requisites",)))
    assert plan.current == "pre-requisites"
    assert plan.done == ()
    assert plan.triggers == ()


def test_last_state_not_ready() -> None:
    plan = plan_rollout(snapshot(not_ready=("cc-manager",)))
    assert plan.current == "cc-manager"
    assert plan.pending == ()
    assert plan.done == ROLLOUT_ORDER[:-1]


def test_resume_from_previous_state_moves_forward() -> None:
    plan = plan_rollout(snapshot(not_ready=("dcgm",)), previous="driver")
    assert plan.current == "dcgm"
    assert plan.moved_back is False
    assert plan.triggers == ("advance",) * 5
    assert plan.previous == "driver"


def test_earlier_component_turning_not_ready_moves_back() -> None:
    first = plan_rollout(snapshot())
    assert first.state == ROLLOUT_COMPLETE
    again = plan_rollout(snapshot(not_ready=("driver",)), previous=first.state)
    assert again.moved_back is True
    assert again.current == "driver"
    assert again.triggers == ("rewind",)
    assert again.ready is False


def test_move_back_from_middle_state() -> None:
    plan = plan_rollout(snapshot(not_ready=("operator-metrics", "dcgm")), previous="dcgm")
    assert plan.moved_back is True
    assert plan.current == "operator-metrics"


def test_unchanged_blocker_neither_moves_back_nor_forward() -> None:
    plan = plan_rollout(snapshot(not_ready=("dcgm",)), previous="dcgm")
    assert plan.triggers == ()
    assert plan.moved_back is False
    assert plan.current == "dcgm"


def test_unknown_previous_starts_from_the_beginning() -> None:
    plan = plan_rollout(snapshot(not_ready=("driver",)), previous="kata-manager")
    assert plan.current == "driver"
    assert plan.triggers == ("advance", "advance")


def test_status_progress_shape() -> None:
    plan = plan_rollout(snapshot(not_ready=("driver",), disabled=("operator-metrics",)))
    status = plan.status_progress()
    assert status[0] == {"name": "pre-requisites", "state": "ready"}
    assert status[1] == {"name": "operator-metrics", "state": "disabled"}
    assert status[2] == {
        "name": "driver",
        "state": "notReady",
        "message": "driver pods unavailable",
    }
    assert status[3] == {"name": "container-toolkit", "state": "pending"}
    assert len(status) == len(ROLLOUT_ORDER)


def test_missing_component_is_rejected() -> None:
    snap = snapshot()
    del snap["dcgm"]
    with pytest.raises(ValueError, match="missing=\\['dcgm'\\]"):
        plan_rollout(snap)


def test_unknown_component_is_rejected() -> None:
    snap = snapshot()
    snap["gdrcopy"] = ComponentStatus(enabled=True, ready=True)
    with pytest.raises(ValueError, match="unknown=\\['gdrcopy'\\]"):
        plan_rollout(snap)


statuses = st.builds(ComponentStatus, enabled=st.booleans(), ready=st.booleans())
snapshots = st.fixed_dictionaries({name: statuses for name in ROLLOUT_ORDER})


@given(snap=snapshots, previous=st.sampled_from([None, *ROLLOUT_ORDER, ROLLOUT_COMPLETE]))
def test_result_is_the_first_unsettled_component(
    snap: dict[str, ComponentStatus], previous: str | None
) -> None:
    plan = plan_rollout(snap, previous)
    unsettled = [n for n in ROLLOUT_ORDER if snap[n].enabled and not snap[n].ready]
    assert plan.current == (unsettled[0] if unsettled else None)
    assert plan.ready is (not unsettled)
    assert all(snap[n].settled for n in plan.done)
    # moved back exactly when the persisted state was past the blocker
    order = [*ROLLOUT_ORDER, ROLLOUT_COMPLETE]
    was = order.index(previous) if previous else 0
    assert plan.moved_back is (was > order.index(plan.state))
    assert [p.name for p in plan.progress] == list(ROLLOUT_ORDER)
    assert sum(p.phase is StatePhase.NOT_READY for p in plan.progress) == (0 if plan.ready else 1)
