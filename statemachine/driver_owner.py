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
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

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


def assign_owners(
    nodes: Mapping[str, Mapping[str, str]],
    resources: Sequence[DriverResource],
    held: Collection[str] = (),
    managed: Collection[str] = (),
    busy: Collection[str] = (),
) -> Assignment:
    """Owner of every GPU node in ``nodes`` (name -> labels).

    Nodes not in ``nodes`` are not looked at; callers pass GPU nodes only, and remove
    the label from the others themselves. ``managed``: the resources whose
    upgradePolicy upgrades automatically (nodes move to them through the upgrades);
    ``busy``: nodes in the middle of their current owner's upgrade, which a move to such
    a resource waits for (its budget would otherwise count a node the other one holds).
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

    changes: dict[str, str | None] = {}
    owners: dict[str, str] = {}
    moves: dict[str, str | None] = {}
    targets: dict[str, str] = {}
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
        if wanted != current:
            changes[node] = wanted
        if after_move != pending:
            moves[node] = after_move
        if wanted is not None:
            owners[node] = wanted
            targets.setdefault(node, wanted)  # ambiguous: it stays
    return Assignment(changes, owners, problems, moves, targets)


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
