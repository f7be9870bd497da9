"""Maintenance windows in the upgrade reports: each owner's, read as the operator reads
them (`plan_windows` over the same waiting nodes), so a report holds what it holds."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpuop.operator.controller import waiting_nodes
from statemachine.fleet_report import NodeFacts
from statemachine.maintenance_window import plan_windows, window_status

Obj = dict[str, Any]
Window = Mapping[str, object]


def owner_windows(
    carriers: Mapping[str | None, Obj],
    facts: Iterable[NodeFacts],
    owners: Mapping[str, str],
    now: float,
) -> tuple[dict[str | None, Window], dict[str, str]]:
    """Per owner whose resource declares windows: where they stand at ``now``; and the
    waiting nodes a closed or invalid window holds, with why (as the operator holds
    them)."""
    facts = list(facts)
    windows: dict[str | None, Window] = {}
    held: dict[str, str] = {}
    for owner, carrier in carriers.items():
        annotations = carrier["metadata"].get("annotations") or {}
        status = window_status(annotations, now)
        if status is None:
            continue
        windows[owner] = status
        mine = [f.node for f in facts if owners.get(f.name) == owner]
        held.update(plan_windows(annotations, waiting_nodes(mine), now).held)
    return windows, held


def window_line(title: str, window: Window) -> str:
    return f"maintenance window ({title}): {window['message']}"


def status_window_lines(windows: Mapping[str | None, Window], policy: str) -> list[str]:
    """One line per owner with maintenance windows, for `gpuop upgrade status`."""
    return [
        window_line(f"NVIDIADriver {o}" if o else f"ClusterPolicy {policy}", w)
        for o, w in sorted(windows.items(), key=lambda kv: kv[0] or "")
    ]


def windows_json(windows: Mapping[str | None, Window], policy: str) -> dict[str, Any]:
    return {
        (f"NVIDIADriver/{o}" if o else f"ClusterPolicy/{policy}"): dict(w)
        for o, w in windows.items()
    }
