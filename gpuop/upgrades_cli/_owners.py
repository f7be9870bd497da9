"""The reports per driver owner: the ClusterPolicy's nodes and each NVIDIADriver's.

The operator runs one budget, one rollout gate and one set of maintenance windows per
owner (``NodeReconciler._reconcile_upgrades``); the reports split the same way, with the
same pure functions (`plan_upgrade`, `plan_windows`), so a plan shows the waves each
owner's own `upgradePolicy` allows and when its window lets them start.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from crd import ClusterPolicySpec
from gpuop.operator.controller import drain_rules, gpu_pod_rules, policy_view
from gpuop.upgrades_cli._render import plan_json, render_plan
from gpuop.upgrades_cli._snapshot import Snapshot
from gpuop.upgrades_cli._windows import Window, window_line
from statemachine.fleet_plan import UpgradePlan, plan_upgrade
from statemachine.fleet_report import NodeFacts, Rules
from statemachine.rollout_gate import GatePolicy


@dataclass(frozen=True)
class OwnerPlan:
    """One owner's plan: its title (`ClusterPolicy NAME`, `NVIDIADriver NAME`)."""

    owner: str | None
    title: str
    plan: UpgradePlan
    window: Window | None


def _plan(
    snap: Snapshot,
    spec: ClusterPolicySpec,
    nodes: Sequence[NodeFacts],
    owner: str | None,
    proposed: bool,
) -> UpgradePlan:
    """``owner``'s nodes under its own policy; an NVIDIADriver's nodes are compared with
    their own DaemonSets' revisions only (the ClusterPolicy's target is not theirs)."""
    view = policy_view(spec)
    canary = spec.driver.upgrade_policy.canary
    gate = GatePolicy(
        canary_nodes=canary.nodes if canary else 0,
        soak_seconds=canary.soak_seconds if canary else 0,
    )
    rules = Rules(
        gpu_pods=gpu_pod_rules(view) if view.pod_deletion is not None else None,
        drain=drain_rules(view) if view.drain.enable else None,
    )
    return plan_upgrade(
        nodes,
        view,
        gate,
        rules,
        snap.pdbs,
        namespace=snap.namespace,
        target=snap.target if owner is None else None,
        template_digest=snap.template_digest if owner is None else "",
        proposed=proposed,
    )


def owner_plans(snap: Snapshot, *, proposed: bool) -> list[OwnerPlan]:
    """The ClusterPolicy's plan, then one per NVIDIADriver that has nodes. ``proposed``
    (a ``--set`` on the ClusterPolicy) changes only the ClusterPolicy's driver."""
    mine = [f for f in snap.nodes if f.name not in snap.owners]
    plans = [
        OwnerPlan(
            None,
            f"ClusterPolicy {snap.policy_name}",
            _plan(snap, snap.spec, mine, None, proposed),
            snap.windows.get(None),
        )
    ]
    for name, spec in sorted(snap.nvd_specs.items()):
        nodes = [f for f in snap.nodes if snap.owners.get(f.name) == name]
        if nodes:
            plan = _plan(snap, spec, nodes, name, False)
            plans.append(OwnerPlan(name, f"NVIDIADriver {name}", plan, snap.windows.get(name)))
    return plans


def plans_json(plans: Sequence[OwnerPlan]) -> dict[str, Any]:
    """The ClusterPolicy's plan at the top (as before NVIDIADrivers were split), each
    NVIDIADriver's under ``nvidiaDrivers``; each with its ``window`` when it has one."""

    def one(p: OwnerPlan) -> dict[str, Any]:
        data = plan_json(p.plan)
        if p.window is not None:
            data["window"] = dict(p.window)
        return data

    data = one(plans[0])
    data["nvidiaDrivers"] = {p.owner: one(p) for p in plans[1:]}
    return data


def render_plans(plans: Sequence[OwnerPlan], proposal: str) -> str:
    """The ClusterPolicy's plan as before; with NVIDIADrivers, one section per owner."""
    if len(plans) == 1:
        only = plans[0]
        text = render_plan(only.plan, proposal=proposal)
        return text + (window_line(only.title, only.window) + "\n" if only.window else "")
    lines = [f"proposed: {proposal}" if proposal else "pending driver rollout (no change proposed)"]
    for p in plans:
        lines += ["", f"{p.title}:"]
        body = render_plan(p.plan).split("\n", 1)[1].rstrip("\n")
        lines += [f"  {line}" if line else "" for line in body.split("\n")]
        if p.window is not None:
            lines.append("  " + window_line(p.title, p.window))
    return "\n".join(lines) + "\n"
