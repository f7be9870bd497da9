"""Per-node rollout: where one node stands in the upstream component order.

Upstream applies every component on every pass and lets each node order itself: an
operand's init container waits for that node's validation file of the layer below
(`/run/nvidia/validations/*-ready`). So the operator never holds a component back
for the whole fleet; it only *observes* each node's progress. This machine turns one
node's observation (for every component that runs pods: is its pod there, Ready, on
the current revision?) into the state the node is at: the first component in order
it is still waiting for, or ``ready``. A stuck node then holds back only itself, and
the counts over all nodes are what the ClusterPolicy status reports.

Nothing is remembered here; the caller may pass the state it last saw (for the log of
moves back) and gets the same answer for the same observation, so results are cached.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from typing import Any

from transitions import EventData

from components import registry
from statemachine._fsm import MachineDef, SharedMachine, StateDef, TransitionDef, named

NODE_ORDER: tuple[str, ...] = registry.NODE_ORDER
"""Per-node states, in upstream order (driver, container-toolkit, operator-validation, ...):
the operands that run pods on nodes; cluster-wide ones (pre-requisites, operator-metrics)
are never a node's state."""

NODE_DONE = "ready"
"""Terminal state: every component this node runs is Ready on the current revision."""

NODE_STATES: tuple[str, ...] = (*NODE_ORDER, NODE_DONE)


class PodState(StrEnum):
    """One component's pod on one node, as the watch caches show it."""

    ABSENT = "absent"
    """The component does not run here (disabled, or its DaemonSet does not select
    the node): nothing to wait for."""
    READY = "ready"
    MISSING = "missing"
    """Wanted here but no pod is bound to the node (not created, or unschedulable)."""
    NOT_READY = "notReady"
    """A pod is there but not Ready (Pending, crashing, waiting in an init container)."""
    OUTDATED = "outdated"
    """Ready, but on an older revision: the DaemonSet's rolling update has not reached
    it yet. Paced by ``maxUnavailable``, so never counted as stuck."""

    @property
    def settled(self) -> bool:
        return self in (PodState.ABSENT, PodState.READY)

    @property
    def failing(self) -> bool:
        """The node itself fails to run the pod (what can make a node stuck)."""
        return self in (PodState.MISSING, PodState.NOT_READY)


@dataclass(frozen=True, slots=True)
class NodeStep:
    """One node's place in the rollout after one observation."""

    state: str
    """The component the node waits for, or ``ready``."""
    waiting: PodState | None
    """Why it waits (the pod state of ``state``); None when ready."""
    moved_back: bool = False
    """An earlier component stopped being ready since the state the caller passed."""

    @property
    def done(self) -> bool:
        return self.state == NODE_DONE


class _NodeModel:
    state: str
    trigger: Any

    def __init__(self, observed: Mapping[str, PodState]) -> None:
        self.observed = observed

    def first_unsettled(self) -> str:
        for name in NODE_ORDER:
            if not self.observed.get(name, PodState.ABSENT).settled:
                return name
        return NODE_DONE


def _model(event: EventData) -> _NodeModel:
    model = event.model
    assert isinstance(model, _NodeModel)
    return model


def _settled_up_to_here(event: EventData) -> bool:
    """Advance when this component, and every earlier one, is settled on the node."""
    model = _model(event)
    return NODE_STATES.index(model.first_unsettled()) > NODE_STATES.index(model.state)


def _first_unsettled_is(target: str) -> Any:
    def guard(event: EventData) -> bool:
        return _model(event).first_unsettled() == target

    return named(f"node_waits_for_{target.replace('-', '_')}", guard)


def _definition() -> MachineDef:
    transitions: list[TransitionDef] = []
    for index, target in enumerate(NODE_ORDER):
        later = NODE_STATES[index + 1 :]
        transitions.append(
            TransitionDef("rewind", later, target, conditions=(_first_unsettled_is(target),))
        )
    guard = named("node_settled_up_to_here", _settled_up_to_here)
    for index, source in enumerate(NODE_ORDER):
        transitions.append(
            TransitionDef("advance", (source,), NODE_STATES[index + 1], conditions=(guard,))
        )
    return MachineDef(
        name="node-rollout",
        states=tuple(StateDef(name) for name in NODE_STATES),
        transitions=tuple(transitions),
        initial=NODE_ORDER[0],
    )


NODE_ROLLOUT_DEFINITION = _definition()
_MACHINE = SharedMachine(NODE_ROLLOUT_DEFINITION)


def node_step(observed: Mapping[str, PodState], previous: str | None = None) -> NodeStep:
    """Run the per-node machine over one node's observation.

    ``observed`` maps component names of :data:`NODE_ORDER` to pod states; a name left
    out is :attr:`PodState.ABSENT`. ``previous`` is the state last seen (None or unknown:
    start at the first component)."""
    unknown = sorted(set(observed) - set(NODE_ORDER))
    if unknown:
        raise ValueError(f"not per-node rollout states: {unknown}")
    key = tuple(observed.get(name, PodState.ABSENT) for name in NODE_ORDER)
    return _step(key, previous if previous in NODE_STATES else None)


@lru_cache(maxsize=4096)
def _step(key: tuple[PodState, ...], previous: str | None) -> NodeStep:
    """Memoised: thousands of nodes share a handful of observations, and attaching a
    model to a `transitions` machine costs far more than a dict lookup."""
    observed = dict(zip(NODE_ORDER, key, strict=True))
    model = _NodeModel(observed)
    with _MACHINE.attached(model, previous or NODE_ORDER[0]):
        hops = _MACHINE.run_to_rest(model)
        state = model.state
    return NodeStep(
        state=state,
        waiting=None if state == NODE_DONE else observed[state],
        moved_back=any(trigger == "rewind" for trigger, _, _ in hops),
    )


@dataclass(frozen=True, slots=True)
class StuckNode:
    name: str
    state: str
    waiting: PodState


@dataclass(frozen=True, slots=True)
class ComponentCounts:
    """Nodes per component: its pod Ready there, not (yet), and nodes whose rollout
    stands at it (the per-node machine's state)."""

    ready: int = 0
    not_ready: int = 0
    at: int = 0


def count_components(
    observed: Mapping[str, Mapping[str, PodState]], steps: Mapping[str, NodeStep]
) -> dict[str, ComponentCounts]:
    """Counts per component over all nodes (``observed`` and ``steps`` keyed by node;
    a node without a step counts as done)."""
    tally = ComponentTally()
    for node, pods in observed.items():
        tally.observe(node, pods, steps.get(node, _DONE))
    return tally.counts()


_DONE = NodeStep(state=NODE_DONE, waiting=None)


class ComponentTally:
    """Counts per component kept up to date node by node: a rollout's pass sees a
    thousand nodes, of which only those whose pods changed since the last pass need
    counting again (the caller says which by handing over a new observation)."""

    def __init__(self) -> None:
        self._nodes: dict[str, tuple[Mapping[str, PodState], str]] = {}
        self._ready = dict.fromkeys(NODE_ORDER, 0)
        self._not_ready = dict.fromkeys(NODE_ORDER, 0)
        self._at = dict.fromkeys(NODE_ORDER, 0)

    def observe(self, node: str, pods: Mapping[str, PodState], step: NodeStep) -> None:
        """Count ``node`` as observed ``pods`` (compared by identity: a node passes
        the same mapping while nothing changed) at ``step``."""
        known = self._nodes.get(node)
        if known is not None and known[0] is pods and known[1] == step.state:
            return
        if known is not None:
            self._add(*known, -1)
        self._nodes[node] = (pods, step.state)
        self._add(pods, step.state, 1)

    def keep_only(self, nodes: set[str]) -> None:
        """Forget the nodes not in ``nodes`` (gone, or no longer GPU nodes)."""
        for gone in set(self._nodes) - nodes:
            self._add(*self._nodes.pop(gone), -1)

    def counts(self) -> dict[str, ComponentCounts]:
        return {
            n: ComponentCounts(self._ready[n], self._not_ready[n], self._at[n]) for n in NODE_ORDER
        }

    def _add(self, pods: Mapping[str, PodState], state: str, sign: int) -> None:
        for name, pod in pods.items():
            if pod is PodState.READY:
                self._ready[name] += sign
            elif pod is not PodState.ABSENT:
                self._not_ready[name] += sign
        if state != NODE_DONE:
            self._at[state] += sign


def stuck_after(step: NodeStep, since: float, threshold: float) -> float | None:
    """When a node waiting at ``step`` since ``since`` counts as stuck; None: never
    (done, or only waiting for the DaemonSet's rolling update to reach it)."""
    if step.done or step.waiting is None or not step.waiting.failing:
        return None
    return since + threshold


_WHY = {
    PodState.MISSING: "no pod",
    PodState.NOT_READY: "pod not ready",
    PodState.OUTDATED: "old revision",
}


def stuck_message(stuck: Sequence[StuckNode], shown: int = 5) -> str:
    """``2 nodes not ready for too long: a (driver: no pod), b (dcgm: pod not ready)``;
    the first ``shown`` by name, then a count of the rest."""
    ordered = sorted(stuck, key=lambda s: s.name)
    parts = [f"{s.name} ({s.state}: {_WHY.get(s.waiting, s.waiting.value)})" for s in ordered]
    more = f" and {len(parts) - shown} more" if len(parts) > shown else ""
    noun = "node" if len(parts) == 1 else "nodes"
    return f"{len(parts)} {noun} stuck: {', '.join(parts[:shown])}{more}"


UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
"""The node lifecycle controller's taint on a node whose kubelet stopped reporting. The
operator acts on nothing because of it (see :mod:`statemachine.stale_pods`)."""
