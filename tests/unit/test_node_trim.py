"""What the node cache keeps of a node's labels: the prefixes the operator reads, plus
the keys NVIDIADriver node selectors name
(`gpuop.operator.controller.views.node_views.NodeTrim`)."""

from __future__ import annotations

from typing import Any

from gpuop.operator.controller.views.node_views import NodeTrim, selector_label_keys, trim_node

POOL = "cloud.google.com/gke-nodepool"


def _node(**labels: str) -> dict[str, Any]:
    return {"metadata": {"name": "n", "labels": labels}, "spec": {}, "status": {}}


def test_a_selector_on_an_unread_label_widens_the_trim() -> None:
    raw = _node(**{POOL: "a100", "nvidia.com/gpu.present": "true", "kubernetes.io/os": "linux"})
    assert POOL not in trim_node(raw)["metadata"]["labels"]
    keys = selector_label_keys([{POOL: "a100"}, {"nvidia.com/gpu.product": "x"}, None])
    assert keys == {POOL}
    kept = NodeTrim(keys)(raw)["metadata"]["labels"]
    assert kept == {POOL: "a100", "nvidia.com/gpu.present": "true"}
    # A selected key the node lacks adds nothing.
    assert NodeTrim(frozenset({"other"}))(raw)["metadata"]["labels"] == {
        "nvidia.com/gpu.present": "true"
    }


def test_a_selector_on_gfds_timestamp_is_kept_too() -> None:
    assert selector_label_keys([{"nvidia.com/gfd.timestamp": "1"}]) == {"nvidia.com/gfd.timestamp"}
