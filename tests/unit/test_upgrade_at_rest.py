"""A node at rest is not put through the rulebook again for a view it has answered.

During a rollout every driver and validator pod event queues that node's pass, and
nearly all of them find the node at ``upgrade-done`` with nothing to do. The answer
is remembered with the view it was given (its clock left out); anything the rulebook
reads changing, or a policy change, asks it again.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

import statemachine._node_upgrade as plan_module
from gpuop.kube.informer import Informer, key_of
from gpuop.operator.controller.views.node_views import trim_node
from gpuop.operator.controller.views.pod_records import trim_pod
from gpuop.operator.controller.writers.upgrade import Upgrades
from statemachine.upgrade import next_step
from statemachine.upgrade_bookkeeping import NO_CHANGES
from statemachine.upgrade_keys import UpgradeState
from tests.unit.test_upgrade_slots import POLICY, _driver_pod, _operator, _Server, node_step


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []

    def counted(view: Any, policy: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(view.name)
        return next_step(view, policy, *args, **kwargs)

    monkeypatch.setattr(plan_module, "next_step", counted)
    return seen


def _done_at(revision: str) -> tuple[_Server, Upgrades, Informer]:
    """One node at ``upgrade-done`` whose driver pod runs ``revision``."""
    server = _Server(["n0"], state="upgrade-done")
    upgrades, nodes, _ = _operator(server)
    pod = trim_pod(_driver_pod("n0", revision=revision))
    upgrades._pods._put(key_of(pod), pod)  # the operand pods cache
    return server, upgrades, nodes


async def test_the_same_view_at_rest_is_answered_from_memory(calls: list[str]) -> None:
    server, upgrades, nodes = _done_at("new")

    stamped = await node_step(upgrades, nodes.get("n0") or {}, POLICY, "new")  # writes its clock
    rest = await node_step(upgrades, nodes.get("n0") or {}, POLICY, "new")
    again = await node_step(upgrades, nodes.get("n0") or {}, POLICY, "new")

    assert stamped.has_patch
    assert rest.target is UpgradeState.UPGRADE_DONE
    assert not rest.has_patch
    assert again == rest
    assert calls == ["n0", "n0"]
    assert len(server.patches) == 1


async def test_a_changed_input_or_policy_asks_the_rulebook_again(calls: list[str]) -> None:
    server, upgrades, nodes = _done_at("new")
    await node_step(upgrades, nodes.get("n0") or {}, POLICY, "new")
    await node_step(upgrades, nodes.get("n0") or {}, POLICY, "new")  # at rest, remembered
    assert len(calls) == 2

    await node_step(
        upgrades, nodes.get("n0") or {}, replace(POLICY, max_parallel_upgrades=5), "new"
    )
    assert len(calls) == 3

    # A new driver revision: the same node now needs an upgrade.
    decision = await node_step(upgrades, nodes.get("n0") or {}, POLICY, "newer")
    assert len(calls) == 4
    assert decision.target is UpgradeState.UPGRADE_REQUIRED
    # That decision wrote the new state; the pass on the fresh node asks again too.
    node = trim_node(server.nodes["n0"])
    await node_step(upgrades, node, POLICY, "newer")
    assert len(calls) == 5


async def test_a_decision_that_acts_or_waits_is_never_remembered(calls: list[str]) -> None:
    server = _Server(["n0"])  # upgrade-required: waits for a slot, asks every time
    upgrades, nodes, _ = _operator(server)

    await node_step(upgrades, nodes.get("n0") or {}, POLICY, "new")
    await upgrades.grant(nodes.values(), POLICY)
    node = nodes.get("n0") or {}
    first = await node_step(upgrades, node, POLICY, "new")
    assert first.changed_state  # cordon-required onwards: acted, so not remembered

    assert len(calls) == 2
    upgrades.forget_node("n0")
    assert "n0" not in upgrades._resting


async def test_nodes_at_rest_under_equal_policies_hold_one_policy(calls: list[str]) -> None:
    """Each node pass builds its own policy view; the memo keeps one per distinct policy
    (a thousand resting nodes held a thousand equal copies)."""
    server = _Server(["n0", "n1"], state="upgrade-done")
    upgrades, _nodes, _ = _operator(server)
    for name in ("n0", "n1"):
        pod = trim_pod(_driver_pod(name, revision="new"))
        upgrades._pods._put(key_of(pod), pod)
    for name in ("n0", "n1"):
        for _ in range(2):  # the first writes the state clock, the second rests
            node = trim_node(server.nodes[name])
            await node_step(upgrades, node, replace(POLICY), "new")

    held = [upgrades._resting.entry(name).policy for name in ("n0", "n1")]  # type: ignore[union-attr]
    assert held[0] == POLICY
    assert held[0] is held[1]


async def test_a_resting_decision_holds_the_shared_empty_patch(calls: list[str]) -> None:
    """A decision that changes nothing is remembered for every node at rest; its
    label and annotation changes are one shared empty mapping, not two dicts a node."""
    _server, upgrades, nodes = _done_at("new")
    await node_step(upgrades, nodes.get("n0") or {}, POLICY, "new")
    rest = await node_step(upgrades, nodes.get("n0") or {}, POLICY, "new")
    assert not rest.has_patch
    assert rest.labels is NO_CHANGES
    assert rest.annotations is NO_CHANGES
    assert rest.merge_patch() == {}


async def test_a_new_pod_record_the_rulebook_reads_alike_is_answered_from_memory(
    calls: list[str],
) -> None:
    """The memo keeps the cache's driver pod record, not a view of its own (0.17 KiB a
    node): a new record of the same pod (a new resourceVersion) reads the same, is
    answered without the rulebook, and replaces the old one in the memo."""
    _server, upgrades, nodes = _done_at("new")
    await node_step(upgrades, nodes.get("n0") or {}, POLICY, "new")
    await node_step(upgrades, nodes.get("n0") or {}, POLICY, "new")
    assert len(calls) == 2
    old = upgrades.driver_record("n0")

    raw = _driver_pod("n0", revision="new")
    raw["metadata"]["resourceVersion"] = "999"
    pod = trim_pod(raw)
    upgrades._pods._put(key_of(pod), pod)
    assert upgrades.driver_record("n0") is pod
    assert pod != old

    again = await node_step(upgrades, nodes.get("n0") or {}, POLICY, "new")
    assert len(calls) == 2
    assert again.node == "n0"
    assert again.target is UpgradeState.UPGRADE_DONE
    assert upgrades._resting.entry("n0").driver is pod  # type: ignore[union-attr]


async def test_a_driver_pod_the_rulebook_reads_otherwise_asks_again(calls: list[str]) -> None:
    _server, upgrades, nodes = _done_at("new")
    await node_step(upgrades, nodes.get("n0") or {}, POLICY, "new")
    await node_step(upgrades, nodes.get("n0") or {}, POLICY, "new")
    assert len(calls) == 2

    raw = _driver_pod("n0", revision="new")
    raw["status"]["containerStatuses"] = [{"restartCount": 3}]
    pod = trim_pod(raw)
    upgrades._pods._put(key_of(pod), pod)
    await node_step(upgrades, nodes.get("n0") or {}, POLICY, "new")
    assert len(calls) == 3


async def test_nodes_resting_alike_share_one_decision(calls: list[str]) -> None:
    """The remembered decision carries no node name (one instance per state and
    reason); each answer carries its own node's."""
    server = _Server(["n0", "n1"], state="upgrade-done")
    upgrades, _nodes, _ = _operator(server)
    for name in ("n0", "n1"):
        pod = trim_pod(_driver_pod(name, revision="new"))
        upgrades._pods._put(key_of(pod), pod)
    answers = {}
    for name in ("n0", "n1"):
        for _ in range(3):
            node = trim_node(server.nodes[name])
            answers[name] = await node_step(upgrades, node, POLICY, "new")
    kept = [upgrades._resting.entry(name).decision for name in ("n0", "n1")]  # type: ignore[union-attr]
    assert kept[0] is kept[1]
    assert kept[0].node == ""
    assert [answers[n].node for n in ("n0", "n1")] == ["n0", "n1"]
    assert answers["n0"] == replace(answers["n1"], node="n0")
