"""Cluster rollout summary: where the fleet stands in the upstream component order.

The controller applies every enabled component on every pass (each node orders itself,
see :mod:`statemachine.node_rollout`); this machine only says which component the fleet
as a whole is at, for `status.state` and its message. It is fed one snapshot per pass
(component -> enabled/ready), starts where the last pass left it (from the ClusterPolicy
status), first rewinds to the earliest component that is no longer settled, then
advances through ready or disabled components and stops at the first one that is
enabled but not ready. Nothing is remembered between calls: the caller persists `state`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from transitions import EventData

from components import registry
from statemachine._fsm import MachineDef, SharedMachine, StateDef, TransitionDef, named

ROLLOUT_ORDER: tuple[str, ...] = registry.ROLLOUT_ORDER
"""Upstream state order, the operand registry's: the order status reports components in."""

ROLLOUT_COMPLETE = "ready"
"""Terminal machine state: every component is ready or disabled."""

ROLLOUT_STATES: tuple[str, ...] = (*ROLLOUT_ORDER, ROLLOUT_COMPLETE)


@dataclass(frozen=True)
class ComponentStatus:
    """What the controller observed for one component in this pass."""

    enabled: bool
    ready: bool = False
    message: str = ""

    @property
    def settled(self) -> bool:
        """Nothing to wait for: either ready, or disabled (its objects get deleted)."""
        return (not self.enabled) or self.ready


class StatePhase(StrEnum):
    """Per-component progress, spelled the way ClusterPolicy status spells states."""

    READY = "ready"
    DISABLED = "disabled"
    NOT_READY = "notReady"
    PENDING = "pending"


@dataclass(frozen=True)
class StateProgress:
    name: str
    phase: StatePhase
    message: str = ""

    def as_status(self) -> dict[str, str]:
        entry = {"name": self.name, "state": self.phase.value}
        if self.message:
            entry["message"] = self.message
        return entry


@dataclass(frozen=True)
class RolloutPlan:
    """The outcome of one pass; `state` is what the caller should persist."""

    state: str
    previous: str | None
    current: str | None
    done: tuple[str, ...]
    pending: tuple[str, ...]
    disabled: tuple[str, ...]
    progress: tuple[StateProgress, ...]
    moved_back: bool
    triggers: tuple[str, ...]

    @property
    def ready(self) -> bool:
        return self.current is None

    @property
    def message(self) -> str:
        if self.current is None:
            return "all components ready"
        blocking = next(p for p in self.progress if p.name == self.current)
        detail = f": {blocking.message}" if blocking.message else ""
        return f"{self.current} is not ready{detail}"

    def status_progress(self) -> list[dict[str, str]]:
        return [p.as_status() for p in self.progress]


class _RolloutModel:
    state: str
    trigger: Any

    def __init__(self, snapshot: Mapping[str, ComponentStatus]) -> None:
        self.snapshot = snapshot

    def first_unsettled(self) -> str:
        for name in ROLLOUT_ORDER:
            if not self.snapshot[name].settled:
                return name
        return ROLLOUT_COMPLETE


def _model(event: EventData) -> _RolloutModel:
    model = event.model
    assert isinstance(model, _RolloutModel)
    return model


def _settled_up_to_here(event: EventData) -> bool:
    """Advance only when this component and every earlier one is settled."""
    model = _model(event)
    return ROLLOUT_STATES.index(model.first_unsettled()) > ROLLOUT_STATES.index(model.state)


def _first_unsettled_is(target: str) -> Any:
    def guard(event: EventData) -> bool:
        return _model(event).first_unsettled() == target

    return named(f"first_unsettled_is_{target.replace('-', '_')}", guard)


def _definition() -> MachineDef:
    transitions: list[TransitionDef] = []
    for index, target in enumerate(ROLLOUT_ORDER):
        later = ROLLOUT_STATES[index + 1 :]
        transitions.append(
            TransitionDef("rewind", later, target, conditions=(_first_unsettled_is(target),))
        )
    guard = named("settled_up_to_here", _settled_up_to_here)
    for index, source in enumerate(ROLLOUT_ORDER):
        transitions.append(
            TransitionDef("advance", (source,), ROLLOUT_STATES[index + 1], conditions=(guard,))
        )
    return MachineDef(
        name="rollout",
        states=tuple(StateDef(name) for name in ROLLOUT_STATES),
        transitions=tuple(transitions),
        initial=ROLLOUT_ORDER[0],
    )


ROLLOUT_DEFINITION = _definition()
_MACHINE = SharedMachine(ROLLOUT_DEFINITION)


def _validate(snapshot: Mapping[str, ComponentStatus]) -> None:
    missing = [n for n in ROLLOUT_ORDER if n not in snapshot]
    unknown = sorted(set(snapshot) - set(ROLLOUT_ORDER))
    if missing or unknown:
        raise ValueError(
            f"rollout snapshot must name exactly the rollout states: missing={missing} "
            f"unknown={unknown}"
        )


def plan_rollout(
    snapshot: Mapping[str, ComponentStatus], previous: str | None = None
) -> RolloutPlan:
    """Run the rollout machine over one snapshot.

    `previous` is the state persisted by the last pass (unknown or None: start at the
    beginning). The snapshot must hold every name in `ROLLOUT_ORDER`, no others:
    a missing component is a controller bug, not a disabled one.
    """
    _validate(snapshot)
    start = previous if previous in ROLLOUT_STATES else ROLLOUT_ORDER[0]
    assert start is not None
    model = _RolloutModel(snapshot)
    with _MACHINE.attached(model, start):
        hops = _MACHINE.run_to_rest(model)
        state = model.state

    current = None if state == ROLLOUT_COMPLETE else state
    cut = ROLLOUT_STATES.index(state)
    done = ROLLOUT_ORDER[:cut]
    pending = ROLLOUT_ORDER[cut + 1 :]
    progress: list[StateProgress] = []
    for name in ROLLOUT_ORDER:
        status = snapshot[name]
        if name == current:
            phase = StatePhase.NOT_READY
        elif name in pending:
            phase = StatePhase.PENDING
        else:
            phase = StatePhase.READY if status.enabled else StatePhase.DISABLED
        progress.append(StateProgress(name, phase, status.message))

    return RolloutPlan(
        state=state,
        previous=previous,
        current=current,
        done=done,
        pending=pending,
        disabled=tuple(n for n in ROLLOUT_ORDER if not snapshot[n].enabled),
        progress=tuple(progress),
        moved_back=any(trigger == "rewind" for trigger, _, _ in hops),
        triggers=tuple(trigger for trigger, _, _ in hops),
    )
