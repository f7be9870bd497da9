"""The benchmark's report rows: ratios come from the medians of each kind, per policy."""

from __future__ import annotations

from typing import Any

import pytest

from crd import parse_policy
from tests.bench.__main__ import build_rows, parse_args
from tests.bench.policies import POLICIES


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


def _rollout(**extra: Any) -> dict[str, Any]:
    """One operator run at 1,000 GPU nodes, 104 s to ready, with ``extra`` fields."""
    return {
        "gpu_nodes": 1000,
        "time_to_ready_s": 104.0,
        "restart_writes": 0,
        "rollout_requests": {},
        "peak_rss_mib": 1.0,
        "restart_peak_rss_mib": 1.0,
        **extra,
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


def test_a_default_run_measures_what_the_targets_name() -> None:
    """The time-to-ready target is stated against the floor, for both policies."""
    args = parse_args([])
    assert {"rollout", "floor", "cache"} <= args.figures
    assert args.policies == ["sample", "upstream-default"]
    assert parse_args(["--figures", "floor,baseline"]).figures == {"floor", "baseline"}


def test_the_target_ratio_is_the_operator_over_the_floor() -> None:
    results = _results([99.0])
    results["runs"]["rollout"] = [_rollout()]
    rows = _rows(results)
    assert rows["1000 operator / labels, then DaemonSets (the floor)"] == 104.0 / 99.0


def test_each_policy_is_reported_apart_against_its_own_baseline() -> None:
    results = _results([99.0])
    results["runs"]["baseline"].append(
        {"gpu_nodes": 1000, "time_to_ready_s": 200.0, "policy": "upstream-default"}
    )
    results["runs"]["rollout"] = [
        {"gpu_nodes": 1000, "time_to_ready_s": 100.0, "restart_writes": 0},
        {
            "gpu_nodes": 1000,
            "time_to_ready_s": 210.0,
            "restart_writes": 0,
            "policy": "upstream-default",
        },
    ]
    results["runs"]["rollout"] = [
        {**r, "rollout_requests": {}, "peak_rss_mib": 1.0, "restart_peak_rss_mib": 1.0}
        for r in results["runs"]["rollout"]
    ]
    rows = _rows(results)
    assert rows["1000 operator / DaemonSets alone"] == 100.0 / 95.0
    assert rows["1000 upstream-default time to ready: DaemonSets alone"] == 200.0
    assert rows["1000 upstream-default operator / DaemonSets alone"] == 210.0 / 200.0


def test_policies_are_checked_by_name() -> None:
    assert parse_args(["--policies", "sample"]).policies == ["sample"]
    assert parse_args(["--policies", "sample,upstream-default"]).policies == [
        "sample",
        "upstream-default",
    ]
    with pytest.raises(SystemExit):
        parse_args(["--policies", "nope"])


def test_the_upstream_default_policy_parses_without_problems() -> None:
    model, problems = parse_policy(POLICIES["upstream-default"]())
    assert model is not None
    assert problems == []
    assert model.metadata["labels"]["app.kubernetes.io/managed-by"] == "Helm"


def test_the_cache_figure_reports_each_size_and_the_slope() -> None:
    results = _results([])
    results["runs"]["cache_size"] = {
        "sizes": [{"gpu_nodes": 1000, "held_mib": 4.5}, {"gpu_nodes": 3000, "held_mib": 13.0}],
        "mib_per_1000_gpu_nodes": 4.25,
    }
    rows = {f"{r.size} {r.metric}": r.value for r in build_rows(results) if r.figure == "4"}
    assert rows["3000 node and pod caches (tests.bench.cache_size)"].median == 13.0
    assert rows["1000,3000 cache growth per 1000 GPU nodes"].median == 4.25


def test_the_observed_floor_is_reported_against_the_floor() -> None:
    """The floor with a reader of the operator's watches beside it, over the floor's
    median; it is never in a default run."""
    results = _results([100.0, 98.0, 102.0])
    results["runs"]["observed"] = [
        {"gpu_nodes": 1000, "time_to_ready_s": t, "observer": {"cpu_s": c}}
        for t, c in ((110.0, 5.0), (104.0, 6.0), (112.0, 7.0))
    ]
    rows = _rows(results)
    assert rows["1000 time to ready: floor with a reader of the operator's watches"] == 110.0
    assert rows["1000 floor with the reader / floor"] == 110.0 / 100.0
    assert rows["1000 the reader's CPU"] == 6.0
    assert "observed" not in parse_args([]).figures
    assert parse_args(["--figures", "observed"]).figures == {"observed"}


def test_the_idle_window_reports_the_control_plane_cpu_per_second() -> None:
    """The steady work a converged cluster costs per second: what every second a
    rollout takes longer pays before any work of its own."""
    results = _results([99.0])
    steady = {"kube-apiserver": 9.0, "kwok": 6.0}
    results["runs"]["rollout"] = [
        _rollout(idle_seconds=30.0, idle_requests={}, idle_cluster_cpu_s=steady)
    ]
    rows = {
        f"{r.size} {r.metric}": r.value.median
        for r in build_rows(results)
        if r.figure == "2" and r.value is not None
    }
    assert rows["1000 idle: control-plane CPU"] == 0.5


def test_the_simulators_own_troubles_are_reported_for_the_operator_and_the_floor() -> None:
    def seen(rejected: int, pods: int) -> dict[str, Any]:
        return {
            "pod_status_patches": 6500,
            "pod_status_rejected": rejected,
            "pod_watch_events": 1,
            "watchers_closed": {"pods": pods, "leases": 2},
        }

    results = _results([99.0])
    results["runs"]["floor"][0]["apiserver"] = seen(547, 150)
    results["runs"]["rollout"] = [_rollout(apiserver=seen(4360, 166))]
    rows = _rows(results)
    assert rows["1000 operator: kwok pod status patches rejected (422)"] == 4360
    assert rows["1000 floor: kwok pod status patches rejected (422)"] == 547
    assert rows["1000 operator: watchers the API server closed for falling behind"] == 168
    assert rows["1000 floor: watchers the API server closed for falling behind"] == 152
    del results["runs"]["floor"][0]["apiserver"]  # a run from before these were counted
    assert not any(key.startswith("1000 floor: ") for key in _rows(results))


def test_the_cost_rows_set_the_operators_control_plane_against_the_floors() -> None:
    """Issue 49: the control plane's CPU over the operator's rollouts against the floor's
    (median against median), and the idle operator's CPU as a share of a core."""
    results = _results([99.0, 100.0])
    cpu = {"kube-apiserver": 100.0, "kwok": 10.0}
    results["runs"]["rollout"] = [
        _rollout(rollout_cpu_s=11.0, cluster_cpu_s=cpu, startup_cpu_s=3.0),
        _rollout(
            rollout_cpu_s=12.0,
            startup_cpu_s=4.0,
            cluster_cpu_s={**cpu, "kwok": 30.0},
            idle_requests={},
            idle_seconds=120.0,
            idle_cpu_s=0.06,
        ),
    ]
    for floor, spent in zip(results["runs"]["floor"], (100.0, 120.0), strict=True):
        floor["cluster_cpu_s"] = {"kube-apiserver": spent}
    rows = _rows(results)
    assert rows["1000 control-plane CPU: operator's run"] == 120.0  # 110 and 130
    assert rows["1000 control-plane CPU: floor"] == 110.0
    assert rows["1000 control-plane CPU: operator / floor"] == pytest.approx(120.0 / 110.0)
    assert rows["1000 operator CPU during rollout"] == 11.5
    assert rows["1000 operator CPU from start to its passes over"] == 3.5
    idle = {
        f"{r.size} {r.metric}": r.value.median
        for r in build_rows(results)
        if r.figure == "2" and r.value is not None
    }
    assert idle["1000 idle: operator CPU"] == pytest.approx(0.05)  # % of a core
