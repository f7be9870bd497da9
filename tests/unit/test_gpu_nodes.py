"""The cluster pass's memoised view of the GPU fleet (``GpuNodes``)."""

from __future__ import annotations

import json
from typing import Any

from components.keys import MIG_CAPABLE_LABEL, NFD_GPU_LABELS
from gpuop.controller._nodes import GpuNodes, trim_node
from gpuop.informer import Informer, ResourceSpec
from statemachine.node_rollout import UNREACHABLE_TAINT

GPU = NFD_GPU_LABELS[0]


async def _never(**_: Any) -> Any:
    raise AssertionError("no API calls in this test")


def _node(name: str, rv: str, labels: dict[str, str], gone: bool = False) -> bytes:
    obj: dict[str, Any] = {
        "metadata": {"name": name, "uid": f"u-{name}", "resourceVersion": rv, "labels": labels}
    }
    if gone:  # what the node lifecycle controller makes of a node whose kubelet stopped
        obj["spec"] = {"taints": [{"key": UNREACHABLE_TAINT, "effect": "NoSchedule"}]}
        obj["status"] = {"conditions": [{"type": "Ready", "status": "Unknown"}]}
    return json.dumps({"type": "MODIFIED", "object": obj}).encode()


def test_the_fleet_is_worked_out_again_only_after_the_cache_changed() -> None:
    nodes = Informer(ResourceSpec("nodes", _never, transform=trim_node), lambda *_: None)
    fleet = GpuNodes(nodes)
    assert fleet() == ((), False, False, ())

    nodes._on_line(_node("b", "1", {GPU: "true"}))
    nodes._on_line(_node("a", "2", {GPU: "true", MIG_CAPABLE_LABEL: "true"}))
    nodes._on_line(_node("cpu", "3", {}))
    first = fleet()
    assert [n["metadata"]["name"] for n in first.nodes] == ["a", "b"]
    assert first.has_nfd
    assert first.mig_capable
    assert fleet() is first  # nothing changed: the same answer, not a new scan

    nodes._on_line(_node("a", "4", {GPU: "false"}))  # NFD says: no GPU after all
    second = fleet()
    assert [n["metadata"]["name"] for n in second.nodes] == ["b"]
    assert second.has_nfd
    assert not second.mig_capable


def test_the_fleet_names_the_gpu_nodes_whose_kubelet_is_gone() -> None:
    """Only those can hold abandoned pods, so the cluster pass looks at no other."""
    nodes = Informer(ResourceSpec("nodes", _never, transform=trim_node), lambda *_: None)
    fleet = GpuNodes(nodes)
    nodes._on_line(_node("alive", "1", {GPU: "true"}))
    nodes._on_line(_node("dead", "2", {GPU: "true"}, gone=True))
    nodes._on_line(_node("dead-cpu", "3", {}, gone=True))  # not a GPU node: not ours
    assert [n["metadata"]["name"] for n in fleet().kubelet_gone] == ["dead"]

    nodes._on_line(_node("dead", "4", {GPU: "true"}))  # its kubelet is back
    assert fleet().kubelet_gone == ()
