"""The upgrade parallelism budget: how many nodes may start upgrading now, and which.

Two limits hold together:
- `maxParallelUpgrades`: nodes in progress (cordon-required .. uncordon-required, and
  upgrade-failed, which keeps its slot as upstream counts it: see `SLOT_STATES`;
  `upgrade-required` is a queue and does not count). 0 means no limit.
- `maxUnavailable` (int, or a percent of GPU nodes rounded up): nodes in progress
  plus nodes unavailable for other reasons (cordoned or NotReady, whatever cordoned
  them) must stay within it.

Unlike upstream, candidates that are NotReady are passed over and reported, so one
sick node never stalls the fleet, and candidates already cordoned go first: starting
them costs a parallel slot but no availability.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from crd import OWNER_LABEL
from statemachine.driver_owner import NEXT_OWNER_LABEL
from statemachine.max_unavailable import resolve_max_unavailable
from statemachine.upgrade_keys import SLOT_STATES, STATE_LABEL, UpgradeState, parse_state, skipped
from statemachine.upgrade_views import NodeUpgradeView


def _check_count(name: str, value: int) -> None:
    if isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")


def available_slots(
    *,
    total_gpu_nodes: int,
    in_progress: int,
    unavailable: int,
    max_parallel_upgrades: int,
    max_unavailable: int | str,
) -> int:
    """How many more nodes may start now, if each start makes one more node unavailable.

    `unavailable` counts nodes that are cordoned or NotReady but NOT in progress (the
    caller must not count a node twice). Never negative.
    """
    _check_count("maxParallelUpgrades", max_parallel_upgrades)
    _check_count("in_progress", in_progress)
    _check_count("unavailable", unavailable)
    limit = resolve_max_unavailable(max_unavailable, total_gpu_nodes)
    slots = limit - in_progress - unavailable
    if max_parallel_upgrades > 0:
        slots = min(slots, max_parallel_upgrades - in_progress)
    return max(0, slots)


@dataclass(frozen=True)
class BudgetNode:
    """One GPU node as the budget sees it; `state` is its upgrade state."""

    name: str
    state: UpgradeState
    ready: bool = True
    unschedulable: bool = False
    skip: bool = False
    driver_pod_present: bool = True
    """Read only for a candidate (it blocks the start); callers may skip the lookup
    for other nodes."""

    @classmethod
    def of(
        cls,
        name: str,
        labels: Mapping[str, str],
        *,
        ready: bool,
        unschedulable: bool,
        has_driver_pod: Callable[[], bool],
    ) -> BudgetNode:
        """The one reading of a node for the budget: state and skip from its labels.

        Whether a driver pod runs there matters only to a candidate (`upgrade-required`),
        so `has_driver_pod` is asked only for one: the fleet pass reads every GPU node.
        A node moving to another NVIDIADriver gets the new owner's pod whether or not the
        old one runs: it is never passed over for lack of one.
        """
        state = parse_state(labels.get(STATE_LABEL))
        moving = labels.get(NEXT_OWNER_LABEL) not in (None, labels.get(OWNER_LABEL))
        return cls(
            name=name,
            state=state,
            ready=ready,
            unschedulable=unschedulable,
            skip=skipped(labels),
            driver_pod_present=state is not UpgradeState.UPGRADE_REQUIRED
            or moving
            or has_driver_pod(),
        )

    @classmethod
    def from_node(
        cls, node: Mapping[str, Any], has_driver_pod: Callable[[str], bool]
    ) -> BudgetNode:
        """`of` a Node object (as the API serves it, or the operator's trimmed copy)."""
        meta = node.get("metadata") or {}
        name = str(meta.get("name", ""))
        conditions = (node.get("status") or {}).get("conditions") or []
        return cls.of(
            name,
            meta.get("labels") or {},
            ready=any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions),
            unschedulable=bool((node.get("spec") or {}).get("unschedulable")),
            has_driver_pod=lambda: has_driver_pod(name),
        )

    @classmethod
    def from_view(cls, view: NodeUpgradeView) -> BudgetNode:
        """`of` the rulebook's view of a node."""
        return cls.of(
            view.name,
            view.labels,
            ready=view.node_ready,
            unschedulable=view.unschedulable,
            has_driver_pod=lambda: view.driver_pod is not None,
        )

    @property
    def in_progress(self) -> bool:
        """Holds a slot (failed nodes included, see `SLOT_STATES`)."""
        return self.state in SLOT_STATES

    @property
    def unavailable(self) -> bool:
        return (not self.ready) or self.unschedulable

    @property
    def candidate(self) -> bool:
        return self.state is UpgradeState.UPGRADE_REQUIRED and not self.skip


@dataclass(frozen=True)
class Selection:
    """`start`: give these a slot now. `waiting`: eligible, no slot left.
    `blocked`: passed over, with why (reported, never stalling others).
    `available`: slots still free once `start` has started (upstream's
    `nodes_upgrades_available`: how many more nodes may start now)."""

    start: tuple[str, ...]
    waiting: tuple[str, ...]
    blocked: Mapping[str, str] = field(default_factory=dict)
    in_progress: int = 0
    unavailable: int = 0
    max_unavailable: int = 0
    available: int = 0


def select_nodes(
    nodes: Iterable[BudgetNode],
    *,
    max_parallel_upgrades: int,
    max_unavailable: int | str,
    held: Mapping[str, str] | None = None,
) -> Selection:
    """Pick the `upgrade-required` nodes that may start now, deterministically.

    Order: already-unschedulable nodes first (free in availability terms), then by
    name. NotReady nodes and nodes without a driver pod are blocked, not waited on.
    If the fleet is already over `maxUnavailable`, nothing starts. `held` names nodes
    the rollout gate keeps back (canary, halt), with why: reported as blocked.
    """
    _check_count("maxParallelUpgrades", max_parallel_upgrades)
    fleet = list(nodes)
    limit = resolve_max_unavailable(max_unavailable, len(fleet))
    in_progress = sum(1 for n in fleet if n.in_progress)
    unavailable = sum(1 for n in fleet if n.unavailable and not n.in_progress)
    parallel_left = max_parallel_upgrades - in_progress if max_parallel_upgrades > 0 else len(fleet)
    unavailable_left = limit - in_progress - unavailable
    over_budget = unavailable_left < 0

    start: list[str] = []
    waiting: list[str] = []
    blocked: dict[str, str] = {}
    cordoned_starts = 0  # were unavailable already; now they count as in progress
    for node in sorted(
        (n for n in fleet if n.candidate), key=lambda n: (not n.unschedulable, n.name)
    ):
        if held and node.name in held:
            blocked[node.name] = held[node.name]
            continue
        if not node.ready:
            blocked[node.name] = "node is NotReady"
            continue
        if not node.driver_pod_present:
            blocked[node.name] = "no driver pod on the node"
            continue
        cost = 0 if node.unschedulable else 1
        if over_budget or parallel_left <= 0 or unavailable_left - cost < 0:
            waiting.append(node.name)
            continue
        start.append(node.name)
        cordoned_starts += 1 - cost
        parallel_left -= 1
        unavailable_left -= cost
    return Selection(
        start=tuple(start),
        waiting=tuple(waiting),
        blocked=blocked,
        in_progress=in_progress,
        unavailable=unavailable,
        max_unavailable=limit,
        available=available_slots(
            total_gpu_nodes=len(fleet),
            in_progress=in_progress + len(start),
            unavailable=unavailable - cordoned_starts,
            max_parallel_upgrades=max_parallel_upgrades,
            max_unavailable=max_unavailable,
        ),
    )
