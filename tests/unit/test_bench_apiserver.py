"""The bench's reading of kube-apiserver's own counters (tests/bench/_apiserver.py)."""

from __future__ import annotations

from tests.bench._apiserver import counters, delta


def _request(code: str, resource: str, subresource: str, value: int) -> str:
    """One ``apiserver_request_total`` sample, with the labels kube-apiserver 1.34 gives."""
    labels = (
        f'code="{code}",component="apiserver",dry_run="",group="",resource="{resource}",'
        f'scope="resource",subresource="{subresource}",verb="PATCH",version="v1"'
    )
    return f"apiserver_request_total{{{labels}}} {value}"


def _text(ok: int, bad: int, pods: int, events: int) -> str:
    return "\n".join(
        [
            "# HELP apiserver_request_total [STABLE] Counter of apiserver requests.",
            "# TYPE apiserver_request_total counter",
            _request("200", "pods", "status", ok),
            _request("422", "pods", "status", bad),
            _request("200", "pods", "", 7),  # not a status patch
            _request("422", "nodes", "status", 9),  # not a pod
            "# HELP apiserver_terminated_watchers_total [STABLE] Counter of watchers closed.",
            "# TYPE apiserver_terminated_watchers_total counter",
            f'apiserver_terminated_watchers_total{{group="",resource="pods"}} {pods}',
            'apiserver_terminated_watchers_total{group="",resource="nodes"} 3',
            "# HELP apiserver_watch_events_total [ALPHA] Number of events sent in watch clients",
            "# TYPE apiserver_watch_events_total counter",
            f'apiserver_watch_events_total{{group="",resource="pods",version="v1"}} {events}',
            'apiserver_watch_events_total{group="",resource="nodes",version="v1"} 5',
            "# HELP apiserver_request_duration_seconds [STABLE] Response latency.",
            "# TYPE apiserver_request_duration_seconds histogram",
            'apiserver_request_duration_seconds_bucket{verb="PATCH",le="0.1"} 1',
        ]
    )


def test_only_the_pod_status_patches_of_each_outcome_are_counted() -> None:
    got = counters(_text(ok=10, bad=4, pods=2, events=0))
    assert got["pod_status_patches"] == 10
    assert got["pod_status_rejected"] == 4
    assert got["watchers_closed:pods"] == 2
    assert got["watchers_closed:nodes"] == 3


def test_a_window_is_the_difference_of_two_reads_and_drops_quiet_resources() -> None:
    before = counters(_text(ok=10, bad=4, pods=2, events=0))
    after = counters(_text(ok=6510, bad=4364, pods=168, events=111040))
    got = delta(before, after)
    assert got["pod_status_patches"] == 6500
    assert got["pod_status_rejected"] == 4360
    assert got["pod_watch_events"] == 111040
    assert got["watchers_closed"] == {"pods": 166}
