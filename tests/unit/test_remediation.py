"""The remediation planner: quarantine, release after settling, the circuit breaker."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statemachine.remediation import (
    TAINT_KEY,
    FleetHealthView,
    Health,
    HealthNodeView,
    RemediationAction,
    RemediationPolicyView,
    plan_remediation,
    quarantined_taints,
    released_taints,
    resolve_max_unhealthy,
)

NOW = 1_000_000.0
ON = RemediationPolicyView(enabled=True, max_unhealthy="25%", settle_seconds=60)


def healthy(name: str, **kw: object) -> HealthNodeView:
    return HealthNodeView(name, Health.HEALTHY, since=NOW - 3600, **kw)  # type: ignore[arg-type]


def sick(name: str, since: float = NOW - 10, **kw: object) -> HealthNodeView:
    return HealthNodeView(
        name,
        Health.UNHEALTHY,
        since=since,
        reason="XidCritical",
        message="GPU 0: XID 79",
        **kw,  # type: ignore[arg-type]
    )


def fleet(*nodes: HealthNodeView, **kw: object) -> FleetHealthView:
    return FleetHealthView(nodes=tuple(nodes), now=NOW, **kw)  # type: ignore[arg-type]


def test_one_unhealthy_node_is_quarantined_healthy_ones_are_not() -> None:
    plan = plan_remediation(fleet(healthy("a"), sick("b"), healthy("c"), healthy("d")), ON)
    assert [q.node for q in plan.quarantine] == ["b"]
    assert plan.quarantine[0].why == "XidCritical: GPU 0: XID 79"
    assert not plan.quarantine[0].cordon
    assert not plan.quarantine[0].drain
    assert plan.release == ()
    assert not plan.paused
    assert not plan.tripped


@pytest.mark.parametrize(
    ("action", "unschedulable", "cordon", "drain"),
    [
        (RemediationAction.TAINT, False, False, False),
        (RemediationAction.CORDON, False, True, False),
        (RemediationAction.DRAIN, False, True, True),
        # Already cordoned (by an administrator): we do not take the cordon over.
        (RemediationAction.DRAIN, True, False, True),
    ],
)
def test_action_decides_cordon_and_drain(
    action: RemediationAction, unschedulable: bool, cordon: bool, drain: bool
) -> None:
    policy = RemediationPolicyView(enabled=True, action=action, max_unhealthy=4)
    plan = plan_remediation(fleet(sick("a", unschedulable=unschedulable)), policy)
    assert (plan.quarantine[0].cordon, plan.quarantine[0].drain) == (cordon, drain)


def test_disabled_quarantines_nothing_and_releases_what_we_hold() -> None:
    nodes = fleet(sick("a"), sick("b", quarantined=True, cordoned_by_us=True))
    plan = plan_remediation(nodes, RemediationPolicyView(enabled=False))
    assert plan.quarantine == ()
    assert [(r.node, r.uncordon) for r in plan.release] == [("b", True)]
    assert not plan.paused


def test_release_waits_for_the_settle_time_and_requeues_once_at_its_end() -> None:
    recovering = HealthNodeView("a", Health.HEALTHY, healthy_seen=NOW - 20, quarantined=True)
    plan = plan_remediation(fleet(recovering, healthy("b")), ON)
    assert plan.release == ()
    assert plan.requeue_after == pytest.approx(40.0)
    settled = HealthNodeView("a", Health.HEALTHY, healthy_seen=NOW - 60, quarantined=True)
    plan = plan_remediation(fleet(settled, healthy("b")), ON)
    assert [r.node for r in plan.release] == ["a"]
    assert plan.requeue_after is None


@pytest.mark.parametrize("skew", [365 * 86400.0, -365 * 86400.0], ids=["ahead", "behind"])
def test_settle_time_is_the_operators_not_the_nodes_clock(skew: float) -> None:
    """Issue 43, item 6: the agent's lastTransitionTime (the node's clock) times nothing;
    a first sighting is recorded and the wait runs settleSeconds from it."""
    first = HealthNodeView("a", Health.HEALTHY, since=NOW + skew, quarantined=True)
    plan = plan_remediation(fleet(first, healthy("b")), ON)
    assert plan.release == ()
    assert plan.observe == ("a",)
    assert plan.requeue_after == pytest.approx(60.0)
    seen = HealthNodeView(
        "a", Health.HEALTHY, since=NOW + skew, healthy_seen=NOW - 59, quarantined=True
    )
    plan = plan_remediation(fleet(seen, healthy("b")), ON)
    assert (plan.release, plan.observe) == ((), ())
    assert plan.requeue_after == pytest.approx(1.0)
    settled = dataclasses.replace(seen, healthy_seen=NOW - 60)
    assert [r.node for r in plan_remediation(fleet(settled, healthy("b")), ON).release] == ["a"]


def test_a_zero_settle_time_releases_without_recording_a_sighting() -> None:
    back = HealthNodeView("a", Health.HEALTHY, since=NOW + 3600, quarantined=True)
    plan = plan_remediation(fleet(back), dataclasses.replace(ON, settle_seconds=0))
    assert [r.node for r in plan.release] == ["a"]
    assert plan.observe == ()


def test_release_keeps_an_admin_cordon() -> None:
    ours = HealthNodeView(
        "a",
        Health.HEALTHY,
        healthy_seen=0,
        quarantined=True,
        cordoned_by_us=True,
        unschedulable=True,
    )
    admins = HealthNodeView(
        "b", Health.HEALTHY, healthy_seen=0, quarantined=True, unschedulable=True
    )
    plan = plan_remediation(fleet(ours, admins, healthy("c"), healthy("d")), ON)
    assert {r.node: r.uncordon for r in plan.release} == {"a": True, "b": False}


def test_unknown_health_neither_quarantines_nor_releases() -> None:
    """No NVML (a driver being reloaded) or no agent says nothing about the GPUs."""
    nodes = fleet(
        HealthNodeView("a", Health.UNKNOWN),
        HealthNodeView("b", Health.UNKNOWN, quarantined=True),
        healthy("c"),
        healthy("d"),
    )
    plan = plan_remediation(nodes, ON)
    assert plan.quarantine == ()
    assert plan.release == ()
    assert plan.quarantined == 1


def test_nodes_in_a_driver_upgrade_are_left_to_the_upgrade() -> None:
    nodes = fleet(
        sick("a", in_upgrade=True),
        HealthNodeView("b", Health.HEALTHY, since=0, quarantined=True, in_upgrade=True),
        healthy("c"),
        healthy("d"),
    )
    plan = plan_remediation(nodes, ON)
    assert plan.quarantine == ()
    assert plan.release == ()


def test_six_of_twelve_failing_at_25_percent_quarantines_three_and_trips() -> None:
    nodes = [sick(f"n{i:02}", since=NOW - 100 + i) for i in range(6)]
    nodes += [healthy(f"n{i:02}") for i in range(6, 12)]
    plan = plan_remediation(fleet(*nodes), ON)
    assert plan.limit == 3
    # The oldest failures first.
    assert [q.node for q in plan.quarantine] == ["n00", "n01", "n02"]
    assert plan.held == ("n03", "n04", "n05")
    assert plan.tripped
    assert plan.paused
    assert "6 of 12" in plan.pause_message("25%")


def test_paused_quarantines_nothing_more_even_with_room() -> None:
    nodes = [sick("a", quarantined=True), sick("b")] + [healthy(f"h{i}") for i in range(10)]
    plan = plan_remediation(fleet(*nodes, paused=True), ON)
    assert plan.quarantine == ()
    assert plan.held == ("b",)
    assert plan.paused
    assert not plan.tripped


def test_paused_still_releases_recovered_nodes() -> None:
    back = HealthNodeView("a", Health.HEALTHY, healthy_seen=0, quarantined=True)
    plan = plan_remediation(fleet(back, *[healthy(f"h{i}") for i in range(3)], paused=True), ON)
    assert [r.node for r in plan.release] == ["a"]
    assert plan.paused


def test_resume_rearms_the_breaker_within_the_limit() -> None:
    nodes = [sick("a", quarantined=True), sick("b")] + [healthy(f"h{i}") for i in range(10)]
    plan = plan_remediation(fleet(*nodes, paused=True, resume_requested=True), ON)
    assert plan.resumed
    assert not plan.paused
    assert [q.node for q in plan.quarantine] == ["b"]


def test_resume_while_still_over_the_limit_trips_again() -> None:
    nodes = [sick(c, quarantined=c < "d") for c in "abcdef"] + [healthy(f"h{i}") for i in range(6)]
    plan = plan_remediation(fleet(*nodes, paused=True, resume_requested=True), ON)
    assert plan.resumed
    assert plan.tripped
    assert plan.paused
    assert plan.quarantine == ()
    assert plan.held == ("d", "e", "f")


def test_a_resume_annotation_without_a_pause_does_nothing() -> None:
    nodes = fleet(sick("a"), healthy("b"), healthy("c"), healthy("d"), resume_requested=True)
    plan = plan_remediation(nodes, ON)
    assert not plan.resumed
    assert not plan.paused
    assert [q.node for q in plan.quarantine] == ["a"]


def test_releases_in_the_same_pass_make_room() -> None:
    back = HealthNodeView("a", Health.HEALTHY, healthy_seen=0, quarantined=True)
    nodes = [back, sick("b")] + [healthy(f"h{i}") for i in range(2)]  # 25% of 4 = 1
    plan = plan_remediation(fleet(*nodes), ON)
    assert [r.node for r in plan.release] == ["a"]
    assert [q.node for q in plan.quarantine] == ["b"]
    assert not plan.paused


def test_dry_run_plans_the_same() -> None:
    nodes = fleet(sick("a"), healthy("b"), healthy("c"), healthy("d"))
    real = plan_remediation(nodes, ON)
    dry = plan_remediation(nodes, RemediationPolicyView(**{**ON.__dict__, "dry_run": True}))
    assert dry.dry_run
    assert dry.quarantine == real.quarantine


@pytest.mark.parametrize(
    ("value", "nodes", "count"),
    [("10%", 12, 1), ("25%", 12, 3), ("10%", 4, 0), ("100%", 7, 7), (2, 12, 2), ("0%", 9, 0)],
)
def test_max_unhealthy_rounds_percentages_down(value: int | str, nodes: int, count: int) -> None:
    assert resolve_max_unhealthy(value, nodes) == count


@pytest.mark.parametrize("value", [-1, "3", "x%", True])
def test_max_unhealthy_rejects_nonsense(value: object) -> None:
    with pytest.raises(ValueError, match="maxUnhealthy"):
        resolve_max_unhealthy(value, 10)  # type: ignore[arg-type]


def test_taints_are_added_once_and_removed_alone() -> None:
    other = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
    added = quarantined_taints([other])
    assert quarantined_taints(added) == added
    assert [t["key"] for t in added] == ["dedicated", TAINT_KEY]
    assert released_taints(added) == [other]


_node = st.builds(
    HealthNodeView,
    name=st.sampled_from([f"n{i}" for i in range(16)]),
    health=st.sampled_from(list(Health)),
    since=st.one_of(st.none(), st.floats(NOW - 1000, NOW)),
    healthy_seen=st.one_of(st.none(), st.floats(NOW - 1000, NOW)),
    gpu=st.booleans(),
    quarantined=st.booleans(),
    cordoned_by_us=st.booleans(),
    unschedulable=st.booleans(),
    in_upgrade=st.booleans(),
)


@settings(max_examples=300, deadline=None)
@given(
    nodes=st.lists(_node, max_size=16, unique_by=lambda n: n.name),
    max_unhealthy=st.one_of(st.integers(0, 8), st.sampled_from(["0%", "10%", "25%", "50%"])),
    paused=st.booleans(),
    resume=st.booleans(),
    action=st.sampled_from(list(RemediationAction)),
)
def test_plan_invariants(
    nodes: list[HealthNodeView],
    max_unhealthy: int | str,
    paused: bool,
    resume: bool,
    action: RemediationAction,
) -> None:
    policy = RemediationPolicyView(
        enabled=True, action=action, max_unhealthy=max_unhealthy, settle_seconds=60
    )
    view = FleetHealthView(tuple(nodes), NOW, paused=paused, resume_requested=resume)
    plan = plan_remediation(view, policy)
    by_name = {n.name: n for n in nodes}
    chosen = {q.node for q in plan.quarantine}
    released = {r.node for r in plan.release}
    # Only unhealthy GPU nodes not yet held and not upgrading are quarantined.
    for name in chosen:
        node = by_name[name]
        assert node.health is Health.UNHEALTHY
        assert node.gpu
        assert not node.quarantined
        assert not node.in_upgrade
    # Only our quarantined nodes are released, never while in an upgrade, never an
    # admin's cordon.
    for release in plan.release:
        node = by_name[release.node]
        assert node.quarantined
        assert not node.in_upgrade
        assert release.uncordon == node.cordoned_by_us
    # The breaker: new quarantines never take the fleet over the limit.
    still_held = sum(1 for n in nodes if n.quarantined) - len(released)
    if chosen:
        assert still_held + len(chosen) <= plan.limit
        assert not (paused and not resume)
    # Paused exactly when it was and was not resumed, or when this pass tripped.
    assert plan.paused == ((paused and not resume) or plan.tripped)
    assert plan.tripped == (bool(plan.held) and not (paused and not resume))
    # A settle time starts once: only held, healthy, unrecorded nodes are recorded.
    for name in plan.observe:
        node = by_name[name]
        assert node.quarantined
        assert node.health is Health.HEALTHY
        assert node.healthy_seen is None
        assert name not in released
    # Deterministic: the same view gives the same plan.
    assert plan_remediation(view, policy) == plan
