"""The rollout gate: canary first, soak, halt after failures, resume; record round-trips."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from statemachine.budget import BudgetNode, select_nodes
from statemachine.rollout_gate import (
    RESUME_ANNOTATION,
    GateNode,
    GatePhase,
    GatePolicy,
    GateRecord,
    phase_of,
    plan_gate,
)
from statemachine.upgrade_keys import UpgradeState

S = UpgradeState
OLD, NEW = "rev-old", "rev-new"
NOW = 1_700_000_000.0
CANARY = GatePolicy(canary_nodes=2, soak_seconds=60)
HALT = GatePolicy(halt_after_failures=1)


def fleet(*states: S, revision: str = OLD) -> list[GateNode]:
    return [GateNode(f"gpu-{i}", s, revision=revision) for i, s in enumerate(states)]


def test_off_without_the_extension() -> None:
    d = plan_gate(GatePolicy(), fleet(S.UPGRADE_REQUIRED), NEW, None, now=NOW)
    assert d.phase is GatePhase.OFF
    assert not d.held
    assert d.record is None


def test_canary_picks_n_nodes_and_holds_the_rest() -> None:
    nodes = fleet(*[S.UPGRADE_REQUIRED] * 4)
    d = plan_gate(CANARY, nodes, NEW, None, now=NOW)
    assert d.phase is GatePhase.CANARY
    assert d.record is not None
    assert d.record.canary == ("gpu-0", "gpu-1")
    assert set(d.held) == {"gpu-2", "gpu-3"}
    # Asked again with the record persisted: the same answer and nothing to write.
    again = plan_gate(CANARY, nodes, NEW, d.record, now=NOW + 5)
    assert again.record is None
    assert again.held == d.held


def test_canary_prefers_nodes_already_upgrading_and_cordoned_ones() -> None:
    nodes = [
        GateNode("a", S.UPGRADE_REQUIRED, OLD),
        GateNode("b", S.UPGRADE_REQUIRED, OLD, unschedulable=True),
        GateNode("c", S.DRAIN_REQUIRED, OLD),
        GateNode("d", S.UPGRADE_REQUIRED, OLD, skip=True),
    ]
    d = plan_gate(CANARY, nodes, NEW, None, now=NOW)
    assert d.record is not None
    assert d.record.canary == ("c", "b")


def test_validated_canary_soaks_then_the_rest_proceed() -> None:
    record = GateRecord(revision=NEW, canary=("gpu-0", "gpu-1"))
    nodes = [
        GateNode("gpu-0", S.UPGRADE_DONE, NEW),
        GateNode("gpu-1", S.UPGRADE_DONE, NEW),
        GateNode("gpu-2", S.UPGRADE_REQUIRED, OLD),
    ]
    d = plan_gate(CANARY, nodes, NEW, record, now=NOW)
    assert d.phase is GatePhase.SOAKING
    assert d.record is not None
    assert d.record.validated_at == NOW
    assert d.requeue_after == 60
    assert set(d.held) == {"gpu-2"}
    later = plan_gate(CANARY, nodes, NEW, d.record, now=NOW + 61)
    assert later.phase is GatePhase.PROCEEDING
    assert not later.held
    assert later.record is None
    assert phase_of(d.record, CANARY, NOW + 61) is GatePhase.PROCEEDING


def test_one_failure_halts_new_starts_until_resumed() -> None:
    nodes = [
        replace(GateNode("gpu-0", S.UPGRADE_FAILED, OLD), failed_revision=NEW),
        GateNode("gpu-1", S.UPGRADE_REQUIRED, OLD),
        GateNode("gpu-2", S.DRAIN_REQUIRED, OLD),
    ]
    d = plan_gate(HALT, nodes, NEW, None, now=NOW)
    assert d.phase is GatePhase.HALTED
    assert set(d.held) == {"gpu-1"}  # in progress goes on; only starts stop
    assert RESUME_ANNOTATION in d.message
    assert d.record is not None
    assert d.record.halted
    assert d.record.failed == ("gpu-0",)
    # Survives a restart: the record alone keeps it halted, even once the node recovered.
    healed = [replace(nodes[0], state=S.UPGRADE_DONE, revision=NEW), *nodes[1:]]
    assert plan_gate(HALT, healed, NEW, d.record, now=NOW).phase is GatePhase.HALTED
    resumed = plan_gate(HALT, nodes, NEW, d.record, now=NOW, resume=True)
    assert resumed.phase is not GatePhase.HALTED
    assert not resumed.held
    assert resumed.resumed
    assert resumed.record is not None
    assert resumed.record.acknowledged == ("gpu-0",)


def test_a_failure_at_another_revision_does_not_count_and_a_new_revision_starts_over() -> None:
    stale = replace(GateNode("gpu-0", S.UPGRADE_FAILED, OLD), failed_revision="rev-older")
    assert plan_gate(HALT, [stale], NEW, None, now=NOW).phase is not GatePhase.HALTED
    halted = GateRecord(revision=NEW, failed=("gpu-0",), halted=True)
    fixed = plan_gate(HALT, fleet(S.UPGRADE_REQUIRED), "rev-fixed", halted, now=NOW)
    assert fixed.phase is not GatePhase.HALTED
    assert not fixed.held


DIGEST, OTHER_DIGEST = "1a2b3c4d", "5e6f7a8b"


def test_a_halt_survives_a_template_change_that_keeps_the_driver_digest() -> None:
    """A label or toleration change gives the DaemonSet a new revision but installs the
    same driver: the rollout it halted must stay halted."""
    failed = replace(GateNode("gpu-0", S.UPGRADE_FAILED, OLD), failed_revision=NEW)
    nodes = [failed, GateNode("gpu-1", S.UPGRADE_REQUIRED, OLD)]
    halted = plan_gate(HALT, nodes, NEW, None, now=NOW, digest=DIGEST)
    assert halted.phase is GatePhase.HALTED
    assert halted.record is not None
    relabelled = plan_gate(HALT, nodes, "rev-relabelled", halted.record, now=NOW, digest=DIGEST)
    assert relabelled.phase is GatePhase.HALTED
    assert set(relabelled.held) == {"gpu-1"}
    # A new driver (another digest) is a new rollout with a clean record.
    fixed = plan_gate(HALT, nodes[1:], "rev-fixed", halted.record, now=NOW, digest=OTHER_DIGEST)
    assert fixed.phase is not GatePhase.HALTED
    assert not fixed.held


def test_a_record_written_before_digests_keeps_its_halt_at_the_same_revision() -> None:
    legacy = GateRecord(revision=NEW, failed=("gpu-0",), halted=True)
    again = GateRecord.loads(legacy.dumps())
    d = plan_gate(HALT, fleet(S.UPGRADE_REQUIRED), NEW, again, now=NOW, digest=DIGEST)
    assert d.phase is GatePhase.HALTED
    assert d.record is not None
    assert d.record.digest == DIGEST  # adopted: from now on keyed by the digest


def test_failed_canary_holds_the_rest_and_says_so() -> None:
    record = GateRecord(revision=NEW, canary=("gpu-0",))
    nodes = [
        replace(GateNode("gpu-0", S.UPGRADE_FAILED, OLD), failed_revision=NEW),
        GateNode("gpu-1", S.UPGRADE_REQUIRED, OLD),
    ]
    d = plan_gate(GatePolicy(canary_nodes=1), nodes, NEW, record, now=NOW)
    assert d.phase is GatePhase.CANARY
    assert "gpu-0 (failed)" in d.message
    assert set(d.held) == {"gpu-1"}


def test_held_nodes_are_blocked_in_the_budget() -> None:
    nodes = [BudgetNode(f"n{i}", S.UPGRADE_REQUIRED) for i in range(3)]
    sel = select_nodes(nodes, max_parallel_upgrades=0, max_unavailable="100%", held={"n0": "x"})
    assert sel.start == ("n1", "n2")
    assert sel.blocked == {"n0": "x"}


names = st.lists(st.sampled_from(["a", "b", "c"]), unique=True).map(tuple)


@given(
    canary=names,
    failed=names,
    acknowledged=names,
    halted=st.booleans(),
    at=st.one_of(st.none(), st.integers(0, 2**31)),
)
def test_record_round_trips(
    canary: tuple[str, ...],
    failed: tuple[str, ...],
    acknowledged: tuple[str, ...],
    halted: bool,
    at: int | None,
) -> None:
    record = GateRecord(
        NEW, canary, None if at is None else float(at), failed, acknowledged, halted
    )
    assert GateRecord.loads(record.dumps()) == record


def test_unreadable_records_start_over() -> None:
    for raw in (None, "", "{", "[]", '{"revision": 3}'):
        assert GateRecord.loads(raw) is None
