"""Which NVIDIADriver owns each GPU node's driver: a pure function of labels and resources.

Every GPU node is driven by exactly one NVIDIADriver, named by the node label
``nvidia.com/gpu-operator.driver.owner``; the driver DaemonSets select on it. A
non-default resource whose ``nodeSelector`` matches the node wins, otherwise the single
default one. Ambiguity never moves a driver: when two non-default resources match one
node, every resource of that overlapping set is reported (``ConflictingNodeSelector``)
and no node any of them matches changes its label; with two default resources
(``ReconcileFailed``) nodes that would fall back to "the" default keep theirs. Resources
being deleted take part in nothing.

The owner label is also the hand-over token between drivers: a node in ``held`` (it still
runs a driver pod, e.g. the ClusterPolicy's or a former owner's) gets no owner label
until that pod is gone, so two driver pods never share a node. A node never goes from
one owner straight to another: its label is removed first (the old DaemonSet lets go
of it), and given to the new owner once the old pod has left.

When the new owner upgrades automatically (``managed``), a move is a driver upgrade:
the node keeps its owner and carries the new one in ``NEXT_OWNER_LABEL``; the upgrade
machine, under the new owner's budget, cordons and drains it and only then removes the
owner label (``statemachine.upgrade_views.NodeUpgradeView.moving``). The next owner
stays recorded through the hand-over, so a restarted operator knows the node is still
the new owner's upgrade.

When it does not (``autoUpgrade: false``), there is no cordon or drain, but the hand-overs
still keep to the new owner's ``upgradePolicy.maxUnavailable``
(``statemachine.max_unavailable.resolve_max_unavailable`` of the nodes it is to own, at
least one: with upgrades off 0 is allowed, and the move must still end). A node of the
new owner counts against it while it has no working driver: no owner label (the old
pod still leaving, or the new owner given in this very pass) or the new owner's label
but no Ready driver pod (``unready``). Counting the new pods until they are Ready is
what makes it a budget: the gap between the old pod leaving and the new one being
created is seconds, and a new driver that never comes up must not take every node.
Moving nodes over the budget keep their owner (and any move record) for a later pass,
in name order. Nothing is remembered between passes, so the budget holds across
restarts; for the same reason a node without an owner counts whatever it ran before
(from its labels, one whose old pod just left and a new node look alike), but it is
never held back: it has no driver to keep.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from statemachine.max_unavailable import resolve_max_unavailable

OWNER_LABEL = "nvidia.com/gpu-operator.driver.owner"
NEXT_OWNER_LABEL = "nvidia.com/gpu-operator.driver.next-owner"
REASON_CONFLICT = "ConflictingNodeSelector"
REASON_FAILED = "ReconcileFailed"


@dataclass(frozen=True)
class DriverResource:
    """What assignment needs of one NVIDIADriver."""

    name: str
    default: bool = False
    node_selector: Mapping[str, str] = field(default_factory=dict)
    deleting: bool = False
    max_unavailable: int | str = "25%"
    """Its ``upgradePolicy.maxUnavailable``: how many of its nodes may be mid hand-over
    at once when it does not upgrade automatically."""

    def selects(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.node_selector.items())


@dataclass(frozen=True)
class Problem:
    reason: str
    message: str


@dataclass(frozen=True)
class Assignment:
    """Owner label changes (None removes the label) and the resources that cannot act."""

    changes: dict[str, str | None]
    owners: dict[str, str]
    """Node -> owner after the changes (nodes without an owner left out)."""
    problems: dict[str, Problem]
    moves: dict[str, str | None] = field(default_factory=dict)
    """``NEXT_OWNER_LABEL`` changes (None removes the label)."""
    targets: dict[str, str] = field(default_factory=dict)
    """Node -> owner once every hand-over is done (nodes without one left out)."""
    deferred: frozenset[str] = frozenset()
    """Nodes whose move waits for room in the new owner's hand-over budget."""


def assign_owners(
    nodes: Mapping[str, Mapping[str, str]],
    resources: Sequence[DriverResource],
    held: Collection[str] = (),
    managed: Collection[str] = (),
    busy: Collection[str] = (),
    unready: Collection[str] = (),
) -> Assignment:
    """Owner of every GPU node in ``nodes`` (name -> labels).

    Nodes not in ``nodes`` are not looked at; callers pass GPU nodes only, and remove
    the label from the others themselves. ``managed``: the resources whose
    upgradePolicy upgrades automatically (nodes move to them through the upgrades);
    ``busy``: nodes in the middle of their current owner's upgrade, which a move to such
    a resource waits for (its budget would otherwise count a node the other one holds);
    ``unready``: nodes meant to run a driver pod that have no Ready one (starting,
    failing, not created yet), which a move to any other resource waits for while they
    carry its label and its budget is spent (see the module's docstring).
    """
    live = sorted((r for r in resources if not r.deleting), key=lambda r: r.name)
    live_names = {r.name for r in live}
    specific = [r for r in live if not r.default]
    defaults = [r for r in live if r.default]
    problems: dict[str, Problem] = {}
    if len(defaults) > 1:
        names = ", ".join(r.name for r in defaults)
        for r in defaults:
            problems[r.name] = Problem(
                REASON_FAILED, f"multiple default NVIDIADrivers exist: {names}"
            )

    matches = {
        node: [r.name for r in specific if r.selects(labels)] for node, labels in nodes.items()
    }
    conflicting: set[str] = set()
    for node, selected in sorted(matches.items()):
        if len(selected) > 1:
            conflicting.update(selected)
            message = (
                f"node {node} is selected by more than one NVIDIADriver: {', '.join(selected)}"
            )
            for name in selected:
                problems.setdefault(name, Problem(REASON_CONFLICT, message))
    fallback = defaults[0].name if len(defaults) == 1 else None

    steps: dict[str, tuple[str | None, str | None]] = {}
    targets: dict[str, str] = {}
    handing: dict[str, list[str]] = {}  # new owner -> its nodes this pass would let go
    for node, labels in nodes.items():
        current = labels.get(OWNER_LABEL)
        pending = labels.get(NEXT_OWNER_LABEL)
        wanted: str | None
        after_move = pending
        if any(name in conflicting for name in matches[node]):
            wanted = current  # ambiguous: leave it (and a move under way) as it is
        elif not matches[node] and len(defaults) > 1:
            wanted = current
        else:
            target = matches[node][0] if matches[node] else fallback
            # From a resource that is gone or going there is no driver to hand over.
            gradual = managed if current is None or current in live_names else ()
            wanted, after_move = _step(current, pending, target, node in held, gradual)
            if pending is None and after_move is not None and node in busy:
                after_move = None  # the current owner's upgrade finishes first
            if target is not None:
                targets[node] = target
                if wanted is None and current in live_names:
                    handing.setdefault(target, []).append(node)  # to one not in managed
        steps[node] = (wanted, after_move)
        if wanted is not None:
            targets.setdefault(node, wanted)  # ambiguous: it stays

    by_name = {r.name: r for r in live}
    deferred = _over_budget(nodes, targets, handing, by_name, unready)
    changes: dict[str, str | None] = {}
    owners: dict[str, str] = {}
    moves: dict[str, str | None] = {}
    for node, labels in nodes.items():
        current = labels.get(OWNER_LABEL)
        pending = labels.get(NEXT_OWNER_LABEL)
        wanted, after_move = (current, pending) if node in deferred else steps[node]
        if wanted != current:
            changes[node] = wanted
        if after_move != pending:
            moves[node] = after_move
        if wanted is not None:
            owners[node] = wanted
    return Assignment(changes, owners, problems, moves, targets, frozenset(deferred))


def _over_budget(
    nodes: Mapping[str, Mapping[str, str]],
    targets: Mapping[str, str],
    handing: Mapping[str, list[str]],
    resources: Mapping[str, DriverResource],
    unready: Collection[str],
) -> set[str]:
    """The nodes of ``handing`` (new owner -> nodes that would lose their owner label
    now) that must keep it: over the new owner's budget, counted over the nodes it is
    to own, with those already without a working driver taking their places first."""
    fleets: dict[str, list[str]] = {}
    for node, target in targets.items():
        fleets.setdefault(target, []).append(node)
    deferred: set[str] = set()
    for target, moving in handing.items():
        fleet = fleets[target]
        limit = max(1, resolve_max_unavailable(resources[target].max_unavailable, len(fleet)))
        starting = set(moving)
        down = 0
        for node in fleet:
            owner = nodes[node].get(OWNER_LABEL)
            if node not in starting and (owner is None or (owner == target and node in unready)):
                down += 1
        room = max(0, limit - down)
        deferred.update(sorted(moving)[room:])
    return deferred


def _step(
    current: str | None,
    pending: str | None,
    wanted: str | None,
    held: bool,
    managed: Collection[str],
) -> tuple[str | None, str | None]:
    """The owner label and the next-owner label one pass may write, towards ``wanted``."""
    if current is not None and wanted is not None and wanted != current:
        if wanted in managed:
            return current, wanted  # the upgrade machine hands it over
        return None, None  # the old driver leaves first
    if current is None and wanted is not None and held:
        # Still the old pod on the node: wait; a move under way keeps its record.
        return None, (wanted if pending is not None and wanted in managed else None)
    return wanted, None
