"""Operand pod events at intake (issue 49 item 3): an event that changes nothing the pod
record keeps reaches no handler, a pod the scheduler has not placed yet is in no node's
view and wakes no pass, and the operator counts what became of each event
(``gpu_operator_pod_events_total``)."""

from __future__ import annotations

from typing import Any

from gpuop.operator.controller.base.keys import node_key
from tests.unit.test_event_routes import PACED, _operator


def _pod(rv: str, node: str = "", phase: str = "Pending", note: str = "") -> dict[str, Any]:
    labels = {"app": "nvidia-device-plugin-daemonset", "controller-revision-hash": "h1"}
    return {
        "metadata": {
            "name": "plugin-x",
            "namespace": "gpu-operator",
            "uid": "u1",
            "resourceVersion": rv,
            "labels": labels,
            "annotations": {"note": note},
        },
        "spec": {"nodeName": node} if node else {},
        "status": {"phase": phase},
    }


def _event(kind: str, pod: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "object": pod}


def _counted(op: Any) -> dict[str, float]:
    counter = op.metrics.pod_events_total
    return {k: counter.labels(k)._value.get() for k in ("unchanged", "idle", "woke")}


def test_a_pod_on_no_node_yet_wakes_nothing_and_its_binding_counts() -> None:
    op, woken = _operator()
    op.pods._on_event(_event("ADDED", _pod("10")))
    assert sum(woken.values()) == 0
    op.pods._on_event(_event("MODIFIED", _pod("11", node="n0")))
    assert woken[PACED] == 1
    assert _counted(op) == {"unchanged": 0, "idle": 1, "woke": 1}


def test_an_event_that_changes_no_record_is_taken_at_intake() -> None:
    op, woken = _operator()
    op.pods._on_event(_event("ADDED", _pod("10", node="n0")))
    woken.clear()
    op.pods._on_event(_event("MODIFIED", _pod("11", node="n0", note="an annotation")))
    assert sum(woken.values()) == 0
    held = op.pods.get("gpu-operator/plugin-x")
    assert held is not None
    assert held.resource_version == "11"
    op.pods._on_event(_event("MODIFIED", _pod("12", node="n0", phase="Running")))
    assert woken[PACED] == 0  # phase is not what the per-node view reads: no progress
    assert _counted(op) == {"unchanged": 1, "idle": 1, "woke": 1}
    assert node_key("n0") not in woken  # the device plugin's pods wake no node pass
