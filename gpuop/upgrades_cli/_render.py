"""How `gpuop upgrade status|plan` print their reports: tables and lines for a terminal.

The reports themselves (what each node waits for, the waves a plan takes) are pure data
from `statemachine.fleet_report` and `statemachine.fleet_plan`; only their wording for
people lives here, in the CLI.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from statemachine.fleet_plan import UpgradePlan
from statemachine.fleet_report import StatusReport, StatusRow


def status_json(report: StatusReport) -> dict[str, Any]:
    """`-o json`: the report with the budget under the policy's own field names."""
    return {
        "nodes": [r.__dict__ for r in report.rows],
        "totals": dict(report.totals),
        "budget": {
            "inProgress": report.in_progress,
            "maxParallelUpgrades": report.max_parallel,
            "unavailable": report.unavailable,
            "maxUnavailable": report.max_unavailable,
        },
        "gate": report.gate,
        "nvidiaDriverGates": dict(report.nvd_gates),
        "failed": list(report.failed),
    }


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    return f"{s // 3600}h"


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    body = [list(header), *(list(r) for r in rows)]
    widths = [max(len(r[i]) for r in body) for i in range(len(header))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in body]


def render_status(report: StatusReport, wide: bool = False) -> str:
    header = ["NODE", "STATE", "FOR", "DRIVER", "TARGET"]
    if wide:
        header.append("WAITING FOR")

    def cells(r: StatusRow) -> list[str]:
        row = [r.node, r.state, _age(r.since_seconds), r.current, r.target]
        return [*row, r.waits_for or "-"] if wide else row

    lines = _table(header, (cells(r) for r in report.rows))
    if not wide:
        waiting = [(r.node, r.waits_for) for r in report.rows if r.waits_for]
        waiting = [w for w in waiting if w[1] not in ("", "an upgrade slot")]
        if waiting:
            lines.append("")
            lines += [f"{node}: waiting for {what}" for node, what in waiting]
    lines.append("")
    lines.append("totals: " + ", ".join(f"{k} {v}" for k, v in report.totals.items()))
    parallel = str(report.max_parallel) if report.max_parallel else "unlimited"
    lines.append(
        f"budget: in progress {report.in_progress}/{parallel}, "
        f"unavailable {report.unavailable}/{report.max_unavailable}"
    )
    if report.gate:
        lines.append(f"rollout gate: {report.gate}")
    lines += nvd_gate_lines(report.nvd_gates)
    if report.failed:
        lines.append(f"FAILED: {', '.join(report.failed)}")
    return "\n".join(lines) + "\n"


def nvd_gate_lines(gates: Mapping[str, str]) -> list[str]:
    """One line per NVIDIADriver whose own canary or halt is configured."""
    return [f"rollout gate (NVIDIADriver {name}): {text}" for name, text in gates.items()]


def plan_json(plan: UpgradePlan) -> dict[str, Any]:
    """`-o json`: the waves by node name, and what would hold the rollout up."""
    return {
        "waves": [[n.name for n in w] for w in plan.waves],
        "restartOnly": [n.name for w in plan.waves for n in w if n.restart_only],
        "notStarted": dict(plan.excluded),
        "blockers": [{"node": n, "why": b} for n, b in plan.blockers],
        "estimateSeconds": plan.estimate_seconds,
    }


def _duration(seconds: int) -> str:
    if seconds < 120:
        return f"{seconds}s"
    minutes = math.ceil(seconds / 60)
    return f"{minutes}m" if minutes < 120 else f"{minutes / 60:.1f}h"


def render_plan(
    plan: UpgradePlan, *, proposal: str = "", nvd_gates: Mapping[str, str] | None = None
) -> str:
    lines = [f"proposed: {proposal}" if proposal else "pending driver rollout (no change proposed)"]
    nodes = sum(len(w) for w in plan.waves)
    lines.append(f"{nodes} node(s) to upgrade in {len(plan.waves)} wave(s)")
    for i, wave in enumerate(plan.waves, start=1):
        label = "canary " if plan.soak_after_wave is not None and i <= plan.soak_after_wave else ""
        names = ", ".join(
            n.name + (" (restart only, no drain)" if n.restart_only else "") for n in wave
        )
        lines.append(f"  {label}wave {i}: {names}")
        if plan.soak_after_wave == i and plan.soak_seconds:
            lines.append(f"  then soak {plan.soak_seconds}s")
    for name, why in plan.excluded.items():
        lines.append(f"  not started: {name}: {why}")
    if plan.up_to_date:
        lines.append(f"  up to date: {', '.join(plan.up_to_date)}")
    blockers = plan.blockers
    lines.append("")
    lines.append(f"blockers ({len(blockers)}):" if blockers else "blockers: none visible now")
    lines += [f"  {name}: {why}" for name, why in blockers]
    lines.append("")
    estimate = plan.estimate_seconds
    if estimate is None:
        lines.append("duration: unbounded (timeout 0 on " + ", ".join(plan.unbounded) + ")")
    else:
        per_wave = _duration(plan.wave_seconds or 0)
        lines.append(f"duration: at most {_duration(estimate)} ({per_wave} per wave from timeouts)")
    lines += nvd_gate_lines(nvd_gates or {})
    return "\n".join(lines) + "\n"
