"""The per-node rollout view redoes only the nodes whose pods or labels changed; what
it answers must be what a view built from scratch answers, after any sequence of pod
events (watch lines, as the informer gets them) and node label changes."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

import pytest

import crd
from components import RenderContext, desired_objects
from gpuop.kube.informer import Informer, ResourceSpec
from gpuop.operator.controller.views.pod_records import pod_index, trim_pod
from gpuop.operator.controller.views.rollout_view import NodeRollouts, RolloutView
from tests import factories

Obj = dict[str, Any]
NS = "gpu-operator"
NOW = 1_800_000_000.0


async def _never(**_: Any) -> None:
    raise AssertionError("not listed in a unit test")


def _informer(name: str, **opts: Any) -> Informer:
    return Informer(ResourceSpec(name, _never, **opts), lambda *_: None)


def _desired() -> dict[str, list[Obj]]:
    model, problems = crd.parse_policy(crd.sample_policy())
    assert model is not None
    assert not problems
    ctx = RenderContext(namespace=NS, operator_image="gpuop:test", service_monitor_crd=False)
    return {name: list(objs) for name, objs in desired_objects(model.spec, ctx).items()}


def _apps(desired: dict[str, list[Obj]]) -> list[tuple[str, dict[str, str]]]:
    """(app, nodeSelector) of every DaemonSet."""
    return [
        (o["spec"]["selector"]["matchLabels"]["app"], o["spec"]["template"]["spec"]["nodeSelector"])
        for objs in desired.values()
        for o in objs
        if o["kind"] == "DaemonSet"
    ]


def _node(name: str, labels: dict[str, str]) -> Obj:
    return factories.node(name, labels, created="2026-01-01T00:00:00Z")


def _pod(node: str, app: str, ready: bool, serial: int) -> Obj:
    return {
        "metadata": {
            "name": f"{app}-{node}",
            "namespace": NS,
            "uid": f"uid-{app}-{node}-{serial}",
            "resourceVersion": str(serial),
            "creationTimestamp": "2026-01-01T00:00:10Z",
            "labels": {"app": app},
        },
        "spec": {"nodeName": node},
        "status": {
            "phase": "Running" if ready else "Pending",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def _line(kind: str, obj: Obj) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode()


def _same(a: RolloutView, b: RolloutView) -> None:
    assert a.counts == b.counts
    assert a.not_done == b.not_done
    assert a.states == b.states
    assert sorted(map(repr, a.stuck)) == sorted(map(repr, b.stuck))
    assert a.message == b.message


@pytest.mark.parametrize("seed", range(5))
def test_the_incremental_view_answers_what_a_fresh_view_answers(seed: int) -> None:
    rnd = random.Random(seed)
    desired = _desired()
    apps = _apps(desired)
    all_labels = {k: v for _, sel in apps for k, v in sel.items()}
    pods = _informer("pods", index=pod_index, transform=trim_pod, track_index_changes=True)
    revisions = _informer("controllerrevisions")
    daemonsets = _informer("daemonsets")
    # stuck_seconds=0: every failing node counts as stuck at once, in both views.
    kept = NodeRollouts(pods, revisions, daemonsets, NS, stuck_seconds=0, clock=lambda: NOW)
    nodes = {f"n{i}": _node(f"n{i}", all_labels) for i in range(12)}
    live: dict[tuple[str, str], Obj] = {}
    serial = 0
    for _ in range(300):
        serial += 1
        node = rnd.choice(sorted(nodes))
        app = rnd.choice(apps)[0]
        roll = rnd.random()
        if roll < 0.55:  # a pod appears or changes readiness
            pod = _pod(node, app, ready=rnd.random() < 0.7, serial=serial)
            kind = "MODIFIED" if (node, app) in live else "ADDED"
            live[(node, app)] = pod
            pods._on_line(_line(kind, pod))
        elif roll < 0.8 and (node, app) in live:  # a pod goes away
            pod = live.pop((node, app))
            pod["metadata"]["resourceVersion"] = str(serial)
            pods._on_line(_line("DELETED", pod))
        elif roll < 0.9:  # a deploy label comes or goes: a new labels mapping
            key = rnd.choice(sorted(all_labels))
            labels = dict(nodes[node]["metadata"]["labels"])
            if key in labels:
                del labels[key]
            else:
                labels[key] = all_labels[key]
            nodes[node] = _node(node, labels)
        elif roll < 0.95:  # a node leaves or comes back
            nodes.pop(node) if len(nodes) > 3 else None
            spare = f"n{rnd.randrange(12)}"
            nodes.setdefault(spare, _node(spare, all_labels))
        if rnd.random() < 0.5:
            continue  # several events may reach one pass
        got = kept.view(desired, list(nodes.values()))
        fresh = NodeRollouts(
            pods, revisions, daemonsets, NS, stuck_seconds=0, clock=lambda: NOW
        ).view(desired, list(nodes.values()))
        _same(got, fresh)


def _fleet(
    count: int, ready: Callable[[int], bool], serial: Callable[[int], int]
) -> tuple[
    dict[str, list[Obj]], list[tuple[str, dict[str, str]]], Informer, NodeRollouts, list[Obj]
]:
    """``count`` nodes labelled for every desired DaemonSet, each with one pod per
    DaemonSet (node ``i``'s Ready when ``ready(i)``), seen by a fresh view."""
    desired = _desired()
    apps = _apps(desired)
    labels = {k: v for _, sel in apps for k, v in sel.items()}
    pods = _informer("pods", index=pod_index, transform=trim_pod, track_index_changes=True)
    view = NodeRollouts(pods, _informer("r"), _informer("d"), NS, clock=lambda: NOW)
    nodes = [_node(f"n{i}", labels) for i in range(count)]
    for i, node in enumerate(nodes):
        for app, _ in apps:
            pods._on_line(_line("ADDED", _pod(node["metadata"]["name"], app, ready(i), serial(i))))
    return desired, apps, pods, view, nodes


def test_only_changed_nodes_are_observed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    desired, apps, pods, view, nodes = _fleet(5, ready=lambda i: True, serial=lambda i: i * 100)
    observed: list[str] = []
    real = view._observe

    def spy(node: str, *args: Any) -> Any:
        observed.append(node)
        return real(node, *args)

    monkeypatch.setattr(view, "_observe", spy)
    assert view.view(desired, nodes).not_done == []
    assert sorted(observed) == [f"n{i}" for i in range(5)]
    observed.clear()
    view.view(desired, nodes)
    assert observed == []  # nothing changed: nothing observed
    pods._on_line(_line("MODIFIED", _pod("n3", apps[0][0], False, 999)))
    assert view.view(desired, nodes).not_done == ["n3"]
    assert observed == ["n3"]


def test_nodes_alike_share_one_observation() -> None:
    """Thousands of nodes share a handful of observations: one mapping each, not one
    per node; a node whose pods differ gets its own, and the counts stay right."""
    desired, _, _, view, nodes = _fleet(3, ready=lambda i: i < 2, serial=lambda i: 1)
    got = view.view(desired, nodes)
    seen = view._seen
    assert seen["n0"].pods is seen["n1"].pods
    assert seen["n2"].pods is not seen["n0"].pods
    assert got.not_done == ["n2"]
    assert all(c.ready == 2 and c.not_ready == 1 for c in got.counts.values() if c.ready)


def test_the_times_kept_per_node_read_like_the_dict_they_replace() -> None:
    """Every GPU node keeps since when each component waits; kept compact (a shared
    list of names, an array of times), it must still read as that mapping."""
    from gpuop.operator.controller.views.rollout_view import _Since

    times = {"driver": 10.5, "container-toolkit": float("-inf"), "device-plugin": 12.0}
    a, b = _Since(times), _Since({k: v + 1 for k, v in times.items()})
    assert dict(a) == times
    assert a.get("container-toolkit") == float("-inf")
    assert a.get("gpu-feature-discovery", 0.0) == 0.0
    assert a._names is b._names  # nodes alike share the names


def test_a_done_node_left_alone_still_counts_its_wait_from_the_last_view() -> None:
    """A done node nothing changed on is not stepped again on each view; once it stops
    being done, its wait counts from the last view that saw it done (not from when it
    first got done), as when every view stepped it."""
    desired, apps, pods, _, nodes = _fleet(2, ready=lambda i: True, serial=lambda i: i * 100)
    now = [NOW]
    view = NodeRollouts(pods, _informer("r"), _informer("d"), NS, 600, clock=lambda: now[0])
    assert view.view(desired, nodes).not_done == []
    now[0] = NOW + 3000
    assert view.view(desired, nodes).not_done == []  # left alone: unchanged and done
    now[0] = NOW + 3100
    pods._on_line(_line("MODIFIED", _pod("n1", apps[0][0], False, 999)))
    got = view.view(desired, nodes)
    assert got.not_done == ["n1"]
    assert got.stuck == []
    assert got.next_due == pytest.approx(500.0)  # 600 s from NOW + 3000, not from NOW
