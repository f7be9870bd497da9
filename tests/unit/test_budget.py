"""The upgrade parallelism budget: limits, rounding, NotReady nodes, invariants."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statemachine.budget import (
    BudgetNode,
    available_slots,
    resolve_max_unavailable,
    select_nodes,
)
from statemachine.upgrade_keys import IN_PROGRESS_STATES, UpgradeState

S = UpgradeState


# --- maxUnavailable ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "total", "expected"),
    [
        (0, 10, 0),
        (3, 10, 3),
        (30, 10, 30),
        ("25%", 10, 3),  # 2.5 rounds up
        ("25%", 4, 1),
        ("25%", 1, 1),
        ("25%", 0, 0),
        ("1%", 1000, 10),
        ("1%", 1001, 11),
        ("0%", 50, 0),
        ("100%", 7, 7),
        ("20%", 30, 6),
        (" 50 % ", 3, 2),
    ],
)
def test_resolve_max_unavailable(value: int | str, total: int, expected: int) -> None:
    assert resolve_max_unavailable(value, total) == expected


@pytest.mark.parametrize("value", ["25", "abc", "%", "-5%", "2.5%", "", "25%%", "x25%"])
def test_invalid_percent_strings_name_the_field(value: str) -> None:
    with pytest.raises(ValueError, match="maxUnavailable"):
        resolve_max_unavailable(value, 10)


@pytest.mark.parametrize("value", [-1, True, 2.5, None])
def test_invalid_values_name_the_field(value: object) -> None:
    with pytest.raises(ValueError, match="maxUnavailable"):
        resolve_max_unavailable(value, 10)  # type: ignore[arg-type]


def test_invalid_max_unavailable_fails_selection_too() -> None:
    with pytest.raises(ValueError, match="maxUnavailable"):
        select_nodes([], max_parallel_upgrades=1, max_unavailable="lots")


def test_negative_max_parallel_is_rejected() -> None:
    with pytest.raises(ValueError, match="maxParallelUpgrades"):
        available_slots(
            total_gpu_nodes=3,
            in_progress=0,
            unavailable=0,
            max_parallel_upgrades=-1,
            max_unavailable=1,
        )


# --- available_slots --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("total", "in_progress", "unavailable", "parallel", "max_unavailable", "expected"),
    [
        (10, 0, 0, 1, "25%", 1),  # parallel is the tighter limit
        (10, 0, 0, 5, "25%", 3),  # maxUnavailable rounds 2.5 up to 3
        (10, 0, 0, 0, "25%", 3),  # 0 = no parallel limit
        (10, 2, 0, 0, "25%", 1),
        (10, 1, 2, 0, "25%", 0),  # cordoned/NotReady nodes eat the budget
        (10, 0, 5, 3, 2, 0),  # already over budget: none, never negative
        (10, 3, 0, 3, 10, 0),  # parallel slots all taken
        (10, 4, 0, 3, 10, 0),  # over the parallel limit: never negative
        (100, 0, 0, 10, "20%", 10),
        (100, 0, 0, 0, 100, 100),
        (10, 0, 0, 1, 0, 0),  # maxUnavailable 0: nothing may start
    ],
)
def test_available_slots(
    total: int,
    in_progress: int,
    unavailable: int,
    parallel: int,
    max_unavailable: int | str,
    expected: int,
) -> None:
    assert (
        available_slots(
            total_gpu_nodes=total,
            in_progress=in_progress,
            unavailable=unavailable,
            max_parallel_upgrades=parallel,
            max_unavailable=max_unavailable,
        )
        == expected
    )


# --- select_nodes -----------------------------------------------------------------------


def required(name: str, **kw: bool) -> BudgetNode:
    return BudgetNode(name=name, state=S.UPGRADE_REQUIRED, **kw)


def test_picks_in_name_order_within_parallel_limit() -> None:
    nodes = [required("c"), required("a"), required("b"), BudgetNode("d", S.UPGRADE_DONE)]
    sel = select_nodes(nodes, max_parallel_upgrades=2, max_unavailable="100%")
    assert sel.start == ("a", "b")
    assert sel.waiting == ("c",)
    assert sel.blocked == {}


def test_not_ready_node_is_reported_and_does_not_stall_the_fleet() -> None:
    nodes = [required("a", ready=False), required("b"), required("c")]
    sel = select_nodes(nodes, max_parallel_upgrades=1, max_unavailable=2)
    assert sel.start == ("b",)
    assert sel.blocked == {"a": "node is NotReady"}
    assert sel.waiting == ("c",)
    # the NotReady node counts as unavailable: 1 unavailable + 1 started = 2
    assert sel.unavailable == 1


def test_node_without_driver_pod_is_reported() -> None:
    nodes = [required("a", driver_pod_present=False), required("b")]
    sel = select_nodes(nodes, max_parallel_upgrades=0, max_unavailable="100%")
    assert sel.start == ("b",)
    assert sel.blocked == {"a": "no driver pod on the node"}


def test_already_cordoned_candidates_go_first_and_cost_no_availability() -> None:
    nodes = [required("a"), required("z", unschedulable=True), required("b")]
    sel = select_nodes(nodes, max_parallel_upgrades=2, max_unavailable=1)
    # z is already unavailable (1 of 1); starting it keeps 1 unavailable, so it may go
    assert sel.start == ("z",)
    assert sel.waiting == ("a", "b")


def test_in_progress_and_failed_nodes_count() -> None:
    nodes = [
        BudgetNode("p", S.DRAIN_REQUIRED, unschedulable=True),
        BudgetNode("f", S.UPGRADE_FAILED, unschedulable=True),
        required("a"),
        required("b"),
    ]
    sel = select_nodes(nodes, max_parallel_upgrades=3, max_unavailable=3)
    assert sel.in_progress == 2  # the failed node keeps its slot, as upstream
    assert sel.unavailable == 0  # ...and is not counted twice
    assert sel.start == ("a",)
    assert sel.waiting == ("b",)


def test_over_budget_starts_nothing_even_free_candidates() -> None:
    nodes = [
        BudgetNode("x", S.UPGRADE_DONE, ready=False),
        BudgetNode("y", S.UPGRADE_DONE, unschedulable=True),
        required("z", unschedulable=True),
    ]
    sel = select_nodes(nodes, max_parallel_upgrades=0, max_unavailable=1)
    assert sel.start == ()
    assert sel.waiting == ("z",)


def test_skipped_and_other_states_are_not_candidates() -> None:
    nodes = [
        required("a", skip=True),
        BudgetNode("b", S.UNKNOWN),
        BudgetNode("c", S.UPGRADE_FAILED),
        BudgetNode("d", S.UPGRADE_DONE),
    ]
    sel = select_nodes(nodes, max_parallel_upgrades=0, max_unavailable="100%")
    assert sel.start == sel.waiting == ()
    assert sel.blocked == {}


def test_upgrade_required_does_not_count_as_in_progress() -> None:
    assert S.UPGRADE_REQUIRED not in IN_PROGRESS_STATES
    assert S.CORDON_REQUIRED in IN_PROGRESS_STATES
    assert S.UNCORDON_REQUIRED in IN_PROGRESS_STATES
    sel = select_nodes([required("a"), required("b")], max_parallel_upgrades=1, max_unavailable=1)
    assert sel.in_progress == 0
    assert sel.start == ("a",)


def test_percent_is_of_all_gpu_nodes() -> None:
    nodes = [required(f"n{i:02d}") for i in range(30)]
    sel = select_nodes(nodes, max_parallel_upgrades=0, max_unavailable="20%")
    assert sel.max_unavailable == 6
    assert len(sel.start) == 6


def test_selection_is_deterministic_regardless_of_input_order() -> None:
    nodes = [required(n) for n in "edcba"]
    one = select_nodes(nodes, max_parallel_upgrades=2, max_unavailable=5)
    two = select_nodes(list(reversed(nodes)), max_parallel_upgrades=2, max_unavailable=5)
    assert one == two
    assert one.start == ("a", "b")


# --- invariants (hypothesis) -------------------------------------------------------------

states = st.sampled_from(list(UpgradeState))
fleet_nodes = st.builds(
    BudgetNode,
    name=st.text(alphabet="abcdefgh", min_size=1, max_size=4),
    state=states,
    ready=st.booleans(),
    unschedulable=st.booleans(),
    skip=st.booleans(),
    driver_pod_present=st.booleans(),
)
max_unavailables = st.one_of(
    st.integers(min_value=0, max_value=40),
    st.integers(min_value=0, max_value=150).map(lambda p: f"{p}%"),
)


def _unique(nodes: list[BudgetNode]) -> list[BudgetNode]:
    return list({n.name: n for n in nodes}.values())


@settings(max_examples=500)
@given(
    nodes=st.lists(fleet_nodes, max_size=30).map(_unique),
    parallel=st.integers(min_value=0, max_value=10),
    max_unavailable=max_unavailables,
)
def test_starting_the_selection_keeps_both_limits(
    nodes: list[BudgetNode], parallel: int, max_unavailable: int | str
) -> None:
    sel = select_nodes(nodes, max_parallel_upgrades=parallel, max_unavailable=max_unavailable)
    limit = resolve_max_unavailable(max_unavailable, len(nodes))
    started = set(sel.start)
    after = [
        BudgetNode(n.name, S.CORDON_REQUIRED, n.ready, True, n.skip) if n.name in started else n
        for n in nodes
    ]
    in_progress_before = sum(n.in_progress for n in nodes)
    unavailable_before = sum(n.unavailable and not n.in_progress for n in nodes)
    in_progress_after = sum(n.in_progress for n in after)
    unavailable_after = sum(n.unavailable and not n.in_progress for n in after)

    if in_progress_before + unavailable_before > limit:
        assert sel.start == ()
    else:
        assert in_progress_after + unavailable_after <= limit
    if parallel > 0:
        assert len(sel.start) <= max(0, parallel - in_progress_before)
        if sel.start:
            assert in_progress_after <= parallel
    # only ready, unskipped, upgrade-required nodes with a driver pod ever start
    by_name = {n.name: n for n in nodes}
    for name in sel.start:
        node = by_name[name]
        assert node.candidate
        assert node.ready
        assert node.driver_pod_present
    # every candidate is accounted for exactly once
    candidates = {n.name for n in nodes if n.candidate}
    assert started | set(sel.waiting) | set(sel.blocked) == candidates
    assert len(sel.start) + len(sel.waiting) + len(sel.blocked) == len(candidates)
    # NotReady candidates are reported, never waited on
    for n in nodes:
        if n.candidate and not n.ready:
            assert sel.blocked[n.name] == "node is NotReady"


@settings(max_examples=500)
@given(
    total=st.integers(min_value=0, max_value=200),
    in_progress=st.integers(min_value=0, max_value=50),
    unavailable=st.integers(min_value=0, max_value=50),
    parallel=st.integers(min_value=0, max_value=20),
    max_unavailable=max_unavailables,
)
def test_available_slots_invariants(
    total: int, in_progress: int, unavailable: int, parallel: int, max_unavailable: int | str
) -> None:
    n = available_slots(
        total_gpu_nodes=total,
        in_progress=in_progress,
        unavailable=unavailable,
        max_parallel_upgrades=parallel,
        max_unavailable=max_unavailable,
    )
    limit = resolve_max_unavailable(max_unavailable, total)
    assert n >= 0
    if in_progress + unavailable >= limit:
        assert n == 0
    else:
        assert in_progress + n + unavailable <= limit
    if parallel > 0:
        assert in_progress + n <= max(parallel, in_progress)
        if n:
            assert in_progress + n <= parallel
    # it is also the largest such n
    bigger = n + 1
    fits_unavailable = in_progress + bigger + unavailable <= limit
    fits_parallel = parallel == 0 or in_progress + bigger <= parallel
    assert not (fits_unavailable and fits_parallel)


@given(percent=st.integers(min_value=0, max_value=300), total=st.integers(0, 5000))
def test_percent_rounds_up(percent: int, total: int) -> None:
    value = resolve_max_unavailable(f"{percent}%", total)
    assert value * 100 >= percent * total
    assert (value - 1) * 100 < percent * total or value == 0


def test_budget_node_from_view() -> None:
    from statemachine.upgrade_keys import SKIP_LABEL, STATE_LABEL
    from statemachine.upgrade_views import NodeUpgradeView

    view = NodeUpgradeView(
        name="n1",
        now=0,
        labels={STATE_LABEL: "drain-required", SKIP_LABEL: "true"},
        unschedulable=True,
        node_ready=False,
    )
    node = BudgetNode.from_view(view)
    # no driver pod, but only a candidate's pod is looked at: a draining node does not ask
    assert node == BudgetNode(
        "n1", S.DRAIN_REQUIRED, ready=False, unschedulable=True, skip=True, driver_pod_present=True
    )
    assert node.in_progress
    queued = replace(view, labels={STATE_LABEL: "upgrade-required"})
    assert not BudgetNode.from_view(queued).driver_pod_present
