"""A failed node keeps its upgrade slot, so recovering it never overfills the budget.

`upgrade-failed -> uncordon-required` (the node healed by itself) is taken by a node
pass, without a grant. If a failed node freed its slot, the fleet pass would start
another node meanwhile and the recovery would put one node more in progress than
`maxParallelUpgrades` allows. As upstream (in progress = every managed node not in
unknown, upgrade-done or upgrade-required), a failed node holds its slot until it
recovers, or until a retry sends it back to the queue.

The fleet is simulated with the pure machine only: the fleet pass is `select_nodes`
plus `start_step`, a node pass is `next_step`, and the driver pods change as the
DaemonSet would change them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from statemachine import next_step, select_nodes, start_step
from statemachine.budget import BudgetNode
from statemachine.upgrade_keys import IN_PROGRESS_STATES, STATE_LABEL, UpgradeState
from statemachine.upgrade_views import (
    Action,
    Decision,
    DriverPodView,
    NodeUpgradeView,
    UpgradePolicyView,
)

S = UpgradeState
NOW = 1_700_000_000.0
OLD, NEW = "rev-old", "rev-new"
PARALLEL = 1
POLICY = UpgradePolicyView(
    auto_upgrade=True,
    max_parallel_upgrades=PARALLEL,
    max_unavailable="100%",
    validation_enabled=False,
    driver_restart_limit=3,
)


@dataclass
class _Node:
    """One node as the API server holds it, plus its driver pod."""

    name: str
    labels: dict[str, str] = field(default_factory=lambda: {STATE_LABEL: "upgrade-required"})
    annotations: dict[str, str] = field(default_factory=dict)
    unschedulable: bool = False
    pod: DriverPodView | None = None
    pods_made: int = 0

    def __post_init__(self) -> None:
        self.pod = DriverPodView(uid=f"{self.name}-0", revision_hash=OLD, running=True, ready=True)

    def view(self) -> NodeUpgradeView:
        return NodeUpgradeView(
            name=self.name,
            now=NOW,
            labels=dict(self.labels),
            annotations=dict(self.annotations),
            unschedulable=self.unschedulable,
            driver_pod=self.pod,
            newest_revision=NEW,
        )

    def new_pod(self, *, crash_looping: bool) -> None:
        """The DaemonSet's replacement pod: Ready, or restarting beyond the limit."""
        self.pods_made += 1
        restarts = POLICY.driver_restart_limit + 1 if crash_looping else 0
        self.pod = DriverPodView(
            uid=f"{self.name}-{self.pods_made}",
            revision_hash=NEW,
            running=True,
            ready=not crash_looping,
            restart_count=restarts,
        )


class _Fleet:
    def __init__(self, count: int) -> None:
        self.nodes = {f"n{i}": _Node(f"n{i}") for i in range(count)}
        self.peak = 0

    def in_progress(self) -> int:
        return sum(1 for n in self.nodes.values() if n.view().state in IN_PROGRESS_STATES)

    def apply(self, decision: Decision) -> None:
        node = self.nodes[decision.node]
        for key, value in decision.labels.items():
            if value is None:
                node.labels.pop(key, None)
            else:
                node.labels[key] = value
        for key, value in decision.annotations.items():
            if value is None:
                node.annotations.pop(key, None)
            else:
                node.annotations[key] = value
        if decision.action is Action.CORDON:
            node.unschedulable = True
        elif decision.action is Action.UNCORDON:
            node.unschedulable = False
        elif decision.action is Action.RESTART_DRIVER_POD:
            node.pod = None  # deleted; the DaemonSet brings a new one (`heal`/`crash`)
        self.peak = max(self.peak, self.in_progress())
        assert self.in_progress() <= PARALLEL, {n.name: n.labels for n in self.nodes.values()}

    def fleet_pass(self) -> None:
        views = {name: n.view() for name, n in self.nodes.items()}
        selection = select_nodes(
            (BudgetNode.from_view(v) for v in views.values()),
            max_parallel_upgrades=POLICY.max_parallel_upgrades,
            max_unavailable=POLICY.max_unavailable,
        )
        for name in selection.start:
            decision = start_step(views[name], POLICY)
            if decision is not None:
                self.apply(decision)

    def settle(self) -> None:
        """Node passes until none changes anything (each node rests within a few)."""
        for _ in range(10):
            before = [(dict(n.labels), n.unschedulable, n.pod) for n in self.nodes.values()]
            for name in self.nodes:
                self.node_pass(name)
            if before == [(n.labels, n.unschedulable, n.pod) for n in self.nodes.values()]:
                return

    def node_pass(self, name: str) -> Decision:
        decision = next_step(self.nodes[name].view(), POLICY)
        self.apply(decision)
        return decision


def test_a_recovering_failed_node_never_overfills_the_budget() -> None:
    fleet = _Fleet(2)
    fleet.fleet_pass()
    assert fleet.node_pass("n0").action is Action.RESTART_DRIVER_POD
    fleet.nodes["n0"].new_pod(crash_looping=True)
    assert fleet.node_pass("n0").target is S.UPGRADE_FAILED

    fleet.fleet_pass()  # the failed node still holds the only slot
    assert fleet.nodes["n1"].view().state is S.UPGRADE_REQUIRED

    fleet.nodes["n0"].new_pod(crash_looping=False)  # an administrator fixed the node
    assert fleet.node_pass("n0").target is S.UNCORDON_REQUIRED  # recovered, in its slot
    assert fleet.node_pass("n0").target is S.UPGRADE_DONE
    fleet.fleet_pass()  # ...which freed the slot
    assert fleet.nodes["n1"].view().state is S.CORDON_REQUIRED


def test_a_failed_node_counts_as_in_progress_for_the_budget() -> None:
    failed = BudgetNode("a", S.UPGRADE_FAILED, unschedulable=True)
    queued = BudgetNode("b", S.UPGRADE_REQUIRED)
    selection = select_nodes([failed, queued], max_parallel_upgrades=1, max_unavailable="100%")
    assert selection.start == ()
    assert selection.waiting == ("b",)
    assert selection.in_progress == 1
    assert selection.unavailable == 0  # counted once, as in progress


_EVENTS = st.lists(
    st.tuples(st.sampled_from(("fleet", "heal", "crash")), st.integers(min_value=0, max_value=2)),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(_EVENTS)
def test_in_progress_never_exceeds_max_parallel_upgrades(events: list[tuple[str, int]]) -> None:
    """Any interleaving of fleet passes and driver pods coming up healthy or
    crash-looping keeps the nodes in progress within the budget at every write. After
    each event every node pass runs until it rests, as the operator's watch would."""
    fleet = _Fleet(3)
    for kind, index in events:
        node = fleet.nodes[f"n{index}"]
        if kind == "fleet":
            fleet.fleet_pass()
        elif node.pod is None or node.pod.revision_hash == NEW:
            node.new_pod(crash_looping=kind == "crash")
        fleet.settle()
