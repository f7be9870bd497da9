"""What `gpuop upgrade plan` reports: the waves the budget allows a driver rollout and
every blocker visible now, from the same node facts and removal rules as
`statemachine.fleet_report`, so a plan never promises what the operator would not do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from statemachine.fleet_report import NodeFacts, Obj, Rules, removal_blockers
from statemachine.max_unavailable import resolve_max_unavailable
from statemachine.rollout_gate import GatePolicy
from statemachine.upgrade_keys import IN_PROGRESS_STATES, SKIP_LABEL, UpgradeState
from statemachine.upgrade_views import UpgradePolicyView

S = UpgradeState


@dataclass(frozen=True)
class PlanNode:
    name: str
    restart_only: bool
    blockers: tuple[str, ...] = ()


@dataclass(frozen=True)
class UpgradePlan:
    waves: tuple[tuple[PlanNode, ...], ...]
    excluded: Mapping[str, str]
    """Nodes that will not start now, with why (NotReady, skip label)."""
    soak_after_wave: int | None
    soak_seconds: int
    wave_seconds: int | None
    """Upper bound of one wave from the configured timeouts; None when one is unbounded."""
    unbounded: tuple[str, ...]
    up_to_date: tuple[str, ...]

    @property
    def blockers(self) -> list[tuple[str, str]]:
        return [(n.name, b) for wave in self.waves for n in wave for b in n.blockers]

    @property
    def estimate_seconds(self) -> int | None:
        if self.wave_seconds is None:
            return None
        return self.wave_seconds * len(self.waves) + (self.soak_seconds if self.waves else 0)


def _step_bound(policy: UpgradePolicyView, restart_only: bool) -> tuple[int | None, list[str]]:
    """Worst case of one node's upgrade from the timeouts; names the unbounded steps."""
    steps: list[tuple[str, int]] = [
        ("driver ready", policy.driver_ready_timeout_seconds),
        ("validation", policy.validation_timeout_seconds if policy.validation_enabled else -1),
    ]
    if not restart_only:
        wait = policy.wait_for_completion
        if wait.pod_selector:
            steps.append(("waitForCompletion", wait.timeout_seconds))
        if policy.pod_deletion is not None:
            steps.append(("podDeletion", policy.pod_deletion.timeout_seconds))
        if policy.drain.enable:
            steps.append(("drain", policy.drain.timeout_seconds))
    unbounded = [name for name, t in steps if t == 0]
    total = sum(t for _, t in steps if t > 0)
    return (None if unbounded else total), unbounded


def plan_upgrade(
    nodes: Sequence[NodeFacts],
    policy: UpgradePolicyView,
    gate: GatePolicy,
    rules: Rules,
    pdbs: Sequence[Obj],
    *,
    namespace: str,
    target: str | None,
    template_digest: str,
    proposed: bool,
) -> UpgradePlan:
    """The order and waves the budget allows, and every blocker visible now.

    `proposed`: a changed driver configuration (`--set`): every node with a driver pod
    upgrades, the whole way. Otherwise the nodes whose driver pod is not at `target`
    (or that are queued, upgrading or failed) do, restart-only where the digests match.
    Waves assume each node takes its slot for the whole upgrade, as the budget does.
    """
    fleet = sorted(nodes, key=lambda f: f.name)
    todo: list[NodeFacts] = []
    current: list[str] = []
    excluded: dict[str, str] = {}
    for f in fleet:
        if f.driver_pod is None:
            excluded[f.name] = "no driver pod on the node"
            continue
        goal = f.target or target
        outdated = proposed or (goal is not None and f.driver_revision != goal)
        if not (outdated or f.state is S.UPGRADE_REQUIRED or f.state in IN_PROGRESS_STATES):
            current.append(f.name)
            continue
        if f.skip:
            excluded[f.name] = f"skip label set ({SKIP_LABEL}=true)"
        elif not f.ready:
            excluded[f.name] = "node is NotReady"
        else:
            todo.append(f)
    todo.sort(key=lambda f: (f.state not in IN_PROGRESS_STATES, not f.unschedulable, f.name))
    total = len(fleet)
    limit = resolve_max_unavailable(policy.max_unavailable, total)
    todo_names = {f.name for f in todo}
    others_unavailable = sum(
        1 for f in fleet if (f.unschedulable or not f.ready) and f.name not in todo_names
    )
    width = max(1, limit - others_unavailable) if limit > others_unavailable else 0
    if policy.max_parallel_upgrades > 0:
        width = min(width, policy.max_parallel_upgrades) if width else 0

    def planned(f: NodeFacts) -> PlanNode:
        digest = f.template_digest or template_digest
        only = not proposed and bool(f.driver_digest) and f.driver_digest == digest
        return PlanNode(f.name, only, tuple(removal_blockers(f, rules, pdbs, namespace)))

    items = [planned(f) for f in todo]
    waves: list[tuple[PlanNode, ...]] = []
    soak_after: int | None = None
    if width == 0 and items:
        excluded.update(
            {n.name: f"maxUnavailable {limit} already used by other nodes" for n in items}
        )
        items = []
    canary = items[: gate.canary_nodes] if gate.canary_nodes else []
    rest = items[len(canary) :]
    for group in ([canary] if canary else []) + [rest]:
        for i in range(0, len(group), width or 1):
            waves.append(tuple(group[i : i + (width or 1)]))
        if group is canary:
            soak_after = len(waves)
    bounds = [_step_bound(policy, n.restart_only) for n in items]
    unbounded = sorted({u for _, names in bounds for u in names})
    wave = None if unbounded else max((b for b, _ in bounds if b is not None), default=0)
    return UpgradePlan(
        waves=tuple(w for w in waves if w),
        excluded=excluded,
        soak_after_wave=soak_after,
        soak_seconds=gate.soak_seconds if canary else 0,
        wave_seconds=wave,
        unbounded=tuple(unbounded),
        up_to_date=tuple(current),
    )
