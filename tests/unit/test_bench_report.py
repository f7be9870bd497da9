"""The benchmark's report rows for figure 1: ratios come from the medians of each kind."""

from __future__ import annotations

from typing import Any

from tests.bench.__main__ import build_rows, parse_args


def _rows(results: dict[str, Any]) -> dict[str, float]:
    return {
        f"{r.size} {r.metric}": r.value.median
        for r in build_rows(results)
        if r.figure == "1" and r.value is not None
    }


def _results(floor: list[float]) -> dict[str, Any]:
    return {
        "runs": {
            "rollout": [],
            "baseline": [{"gpu_nodes": 1000, "time_to_ready_s": t} for t in (90.0, 100.0, 95.0)],
            "floor": [{"gpu_nodes": 1000, "time_to_ready_s": t} for t in floor],
        }
    }


def test_the_floor_is_reported_against_the_baseline_median() -> None:
    rows = _rows(_results([99.0, 120.0, 98.0]))
    assert rows["1000 time to ready: labels, then DaemonSets"] == 99.0
    assert rows["1000 labels, then DaemonSets / DaemonSets alone"] == 99.0 / 95.0


def test_results_without_a_floor_have_no_floor_rows() -> None:
    results = _results([])
    del results["runs"]["floor"]  # results files written before the floor existed
    rows = _rows(results)
    assert "1000 time to ready: DaemonSets alone" in rows
    assert not any("labels, then" in key for key in rows)


def test_the_floor_is_asked_for_by_name_only() -> None:
    assert "floor" not in parse_args([]).figures
    assert parse_args(["--figures", "floor,baseline"]).figures == {"floor", "baseline"}
