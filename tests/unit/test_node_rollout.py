"""The per-node rollout machine: where one node stands, moves back, counts, stuck."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from transitions import Machine

from statemachine import node_rollout
from statemachine.node_rollout import (
    NODE_DONE,
    NODE_ORDER,
    ComponentTally,
    NodeStep,
    PodState,
    StuckNode,
    count_components,
    node_step,
    stuck_after,
    stuck_message,
)
from statemachine.rollout import ROLLOUT_ORDER

observations = st.dictionaries(st.sampled_from(NODE_ORDER), st.sampled_from(list(PodState)))


def test_per_node_order_is_the_rollout_order_without_cluster_only_states() -> None:
    assert list(NODE_ORDER) == [
        n for n in ROLLOUT_ORDER if n not in ("pre-requisites", "operator-metrics")
    ]
    assert NODE_ORDER[:4] == ("driver", "container-toolkit", "operator-validation", "device-plugin")


def test_machine_is_a_real_transitions_machine() -> None:
    machine = node_rollout._MACHINE.machine
    assert isinstance(machine, Machine)
    assert list(machine.states) == [*NODE_ORDER, NODE_DONE]
    assert set(machine.events) == {"advance", "rewind"}
    assert machine.auto_transitions is False
    node_step({"driver": PodState.MISSING})
    assert not machine.models


def test_all_ready_or_absent_is_done() -> None:
    step = node_step({"driver": PodState.READY, "dcgm": PodState.ABSENT})
    assert step == NodeStep(NODE_DONE, None)
    assert step.done


def test_waits_at_first_unsettled_component_in_order() -> None:
    step = node_step(
        {
            "driver": PodState.READY,
            "container-toolkit": PodState.NOT_READY,
            "device-plugin": PodState.MISSING,
        }
    )
    assert step.state == "container-toolkit"
    assert step.waiting is PodState.NOT_READY


def test_moves_back_when_an_earlier_component_fails() -> None:
    step = node_step({"driver": PodState.MISSING}, previous=NODE_DONE)
    assert step.state == "driver"
    assert step.moved_back


def test_unknown_component_is_a_bug() -> None:
    with pytest.raises(ValueError, match="pre-requisites"):
        node_step({"pre-requisites": PodState.READY})


@given(observations, st.sampled_from([None, *NODE_ORDER, NODE_DONE]))
def test_state_is_first_unsettled_whatever_the_previous_state(
    observed: dict[str, PodState], previous: str | None
) -> None:
    step = node_step(observed, previous)
    expected = next(
        (n for n in NODE_ORDER if not observed.get(n, PodState.ABSENT).settled), NODE_DONE
    )
    assert step.state == expected
    assert step.done == (expected == NODE_DONE)
    if not step.done:
        assert step.waiting is observed[step.state]
    # a later component's state never changes where the node stands
    if not step.done:
        later = NODE_ORDER[NODE_ORDER.index(step.state) + 1 :]
        changed = {**observed, **dict.fromkeys(later, PodState.MISSING)}
        assert node_step(changed, previous).state == step.state


@given(st.dictionaries(st.text(min_size=1, max_size=5), observations))
def test_counts_add_up(nodes: dict[str, dict[str, PodState]]) -> None:
    steps = {name: node_step(obs) for name, obs in nodes.items()}
    counts = count_components(nodes, steps)
    for name in NODE_ORDER:
        wanted = sum(
            1 for obs in nodes.values() if obs.get(name, PodState.ABSENT).value != "absent"
        )
        assert counts[name].ready + counts[name].not_ready == wanted
    assert sum(c.at for c in counts.values()) == sum(1 for s in steps.values() if not s.done)


@given(
    st.lists(
        st.tuples(st.sampled_from("abcd"), st.one_of(st.none(), observations), st.booleans()),
        max_size=40,
    )
)
def test_the_tally_counts_what_counting_afresh_counts(
    moves: list[tuple[str, dict[str, PodState] | None, bool]],
) -> None:
    """Node by node (a node observed anew, observed again unchanged, or gone), the
    tally always equals :func:`count_components` over the nodes as they stand."""
    tally = ComponentTally()
    nodes: dict[str, dict[str, PodState]] = {}
    for name, observed, again in moves:
        if observed is None:
            nodes.pop(name, None)
            tally.keep_only(set(nodes))
        else:
            if again and name in nodes:
                observed = nodes[name]  # the same mapping: nothing changed
            nodes[name] = observed
            tally.observe(name, observed, node_step(observed))
        steps = {n: node_step(obs) for n, obs in nodes.items()}
        assert tally.counts() == count_components(nodes, steps)


def test_only_failing_pods_make_a_node_stuck() -> None:
    missing = node_step({"driver": PodState.MISSING})
    assert stuck_after(missing, since=100.0, threshold=30.0) == 130.0
    outdated = node_step({"driver": PodState.READY, "device-plugin": PodState.OUTDATED})
    assert stuck_after(outdated, since=100.0, threshold=30.0) is None
    assert stuck_after(node_step({}), since=100.0, threshold=30.0) is None


def test_stuck_message_names_the_first_few_and_counts_the_rest() -> None:
    stuck = [StuckNode(f"n{i}", "driver", PodState.MISSING) for i in range(7)]
    message = stuck_message(stuck, shown=3)
    assert message.startswith("7 nodes stuck: n0 (driver: no pod), n1 (driver: no pod)")
    assert message.endswith("and 4 more")
    one = stuck_message([StuckNode("x", "dcgm", PodState.NOT_READY)])
    assert one == "1 node stuck: x (dcgm: pod not ready)"
