"""Progress news waits for the coalesced pass only while DaemonSets still roll out."""

from __future__ import annotations

from typing import Any

from gpuop.operator.controller.base.pace import LEAST_WAIT_S, ProgressPace


def _ds(ready: int, desired: int = 3) -> dict[str, Any]:
    return {
        "metadata": {"name": "ds", "generation": 1},
        "spec": {},
        "status": {
            "observedGeneration": 1,
            "desiredNumberScheduled": desired,
            "numberAvailable": ready,
            "numberUnavailable": desired - ready,
            "updatedNumberScheduled": desired,
        },
    }


def test_news_waits_for_the_storm_while_a_daemonset_rolls_out() -> None:
    pace = ProgressPace()
    assert not pace.daemonsets_changed([_ds(3), _ds(1)])
    assert pace.wait(4.0) == 4.0


def test_the_pass_runs_at_once_when_the_last_daemonset_turns_ready() -> None:
    pace = ProgressPace()
    pace.daemonsets_changed([_ds(3), _ds(1)])
    assert pace.daemonsets_changed([_ds(3), _ds(3)])  # just settled: pass now
    assert not pace.daemonsets_changed([_ds(3), _ds(3)])  # still settled: no news
    assert pace.wait(4.0) == LEAST_WAIT_S


def test_with_no_daemonset_nothing_is_rolling_out() -> None:
    pace = ProgressPace()
    assert pace.wait(4.0) == LEAST_WAIT_S
    assert not pace.daemonsets_changed([])
