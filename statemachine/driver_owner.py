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
runs a driver pod of someone the new owner is not, e.g. the ClusterPolicy's) gets no
owner label until that pod is gone, so two driver pods never share a node.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

OWNER_LABEL = "nvidia.com/gpu-operator.driver.owner"
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


def assign_owners(
    nodes: Mapping[str, Mapping[str, str]],
    resources: Sequence[DriverResource],
    held: Collection[str] = (),
) -> Assignment:
    """Owner of every GPU node in ``nodes`` (name -> labels).

    Nodes not in ``nodes`` are not looked at; callers pass GPU nodes only, and remove
    the label from the others themselves.
    """
    live = sorted((r for r in resources if not r.deleting), key=lambda r: r.name)
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
    for node, labels in nodes.items():
        current = labels.get(OWNER_LABEL)
        wanted: str | None
        if any(name in conflicting for name in matches[node]):
            wanted = current  # ambiguous: leave it as it is
        elif matches[node]:
            wanted = matches[node][0]
        elif len(defaults) > 1:
            wanted = current
        else:
            wanted = fallback
        if node in held and wanted is not None and wanted != current:
            wanted = current
        if wanted != current:
            changes[node] = wanted
        if wanted is not None:
            owners[node] = wanted
    return Assignment(changes=changes, owners=owners, problems=problems)
