"""A small typed seam over `transitions`.

Machines are declared once as plain data (`MachineDef`) so the runtime machine and
the docs diagram are built from the same definition and cannot drift. The helpers
here keep `transitions`' loosely typed surface (dynamic trigger methods, `EventData`)
out of our public API.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol, TypeVar

from transitions import EventData, Machine

Condition = Callable[[EventData], bool]
Callback = Callable[[EventData], None]
F = TypeVar("F", bound=Callable[..., Any])


class FsmModel(Protocol):
    """What a model looks like once `transitions` has decorated it."""

    state: str

    def trigger(self, name: str) -> bool: ...


@dataclass(frozen=True)
class StateDef:
    name: str
    on_enter: tuple[Callback, ...] = ()

    def describe(self) -> str:
        """What the state does, for the docs diagram ("" when nothing to say)."""
        return ""


@dataclass(frozen=True)
class TransitionDef:
    trigger: str
    source: tuple[str, ...]
    dest: str
    conditions: tuple[Condition, ...] = ()
    after: tuple[Callback, ...] = ()

    def as_config(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "trigger": self.trigger,
            "source": list(self.source),
            "dest": self.dest,
        }
        if self.conditions:
            config["conditions"] = list(self.conditions)
        if self.after:
            config["after"] = list(self.after)
        return config


@dataclass(frozen=True)
class MachineDef:
    """States and transitions of one machine, in the order triggers are tried."""

    name: str
    states: tuple[StateDef, ...]
    transitions: tuple[TransitionDef, ...]
    initial: str

    @property
    def state_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.states)

    @property
    def triggers(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for t in self.transitions:
            seen.setdefault(t.trigger, None)
        return tuple(seen)

    def state_configs(self) -> list[dict[str, Any]]:
        configs: list[dict[str, Any]] = []
        for s in self.states:
            config: dict[str, Any] = {"name": s.name}
            if s.on_enter:
                config["on_enter"] = list(s.on_enter)
            configs.append(config)
        return configs

    def transition_configs(self) -> list[dict[str, Any]]:
        return [t.as_config() for t in self.transitions]


def named(name: str, func: F) -> F:
    """Give a closure a readable name: diagrams label guards by `__name__`."""
    func.__name__ = name
    func.__qualname__ = name
    return func


class SharedMachine:
    """One `transitions.Machine` (the rulebook) shared by short-lived models.

    A model is bound for one evaluation (its state set, ``trigger`` attached) and
    unbound again; the machine never lists it among its models, so it holds no
    per-node memory between calls. The lock makes that safe if a caller ever uses
    threads; under asyncio it is uncontended.
    """

    def __init__(self, definition: MachineDef) -> None:
        self.definition = definition
        self.machine = Machine(
            model=None,
            states=definition.state_configs(),
            transitions=definition.transition_configs(),
            initial=None,
            auto_transitions=False,
            send_event=True,
            ignore_invalid_triggers=True,
            name=definition.name,
        )
        self._lock = threading.Lock()

    @contextmanager
    def attached(self, model: FsmModel, initial: str) -> Iterator[FsmModel]:
        """``model`` in state ``initial``, with ``model.trigger(name)`` bound to the rulebook.

        Not ``Machine.add_model``: that decorates the model with a method per trigger
        and per state (``is_<state>``, ``may_<trigger>``) and takes them off again, most
        of an evaluation's cost (250 us of a node's upgrade step). A trigger only needs
        the event and the model's ``state``, which ``transitions`` reads and sets
        through ``getattr``/``setattr``.
        """
        with self._lock:
            self.machine.set_state(initial, model=model)
            model.trigger = partial(self._fire, model)  # type: ignore[method-assign]
            try:
                yield model
            finally:
                del model.trigger

    def _fire(self, model: FsmModel, name: str) -> bool:
        event = self.machine.events.get(name)
        return bool(event is not None and event.trigger(model))

    def triggers_from(self, state: str) -> list[str]:
        names: list[str] = self.machine.get_triggers(state)
        return names

    def run_to_rest(self, model: FsmModel, limit: int = 32) -> list[tuple[str, str, str]]:
        """Fire the first enabled trigger repeatedly until none is enabled.

        Returns the hops as (trigger, source, dest). Stops early when a state repeats,
        so a misconfigured guard set can never spin.
        """
        hops: list[tuple[str, str, str]] = []
        seen = {model.state}
        for _ in range(limit):
            source = model.state
            for name in self.triggers_from(source):
                if model.trigger(name):
                    hops.append((name, source, model.state))
                    break
            else:
                return hops
            if model.state in seen:
                return hops
            seen.add(model.state)
        return hops
