"""The cluster pass's memoised view of the GPU fleet (``GpuNodes``)."""

from __future__ import annotations

import json
from typing import Any

from components.keys import MIG_CAPABLE_LABEL, NFD_GPU_LABELS
from gpuop.kube.informer import Informer, ResourceSpec
from gpuop.operator.controller.views.node_views import GpuNodes, trim_node
from statemachine.node_rollout import UNREACHABLE_TAINT
from statemachine.stale_pods import OUT_OF_SERVICE_TAINT

GPU = NFD_GPU_LABELS[0]


async def _never(**_: Any) -> Any:
    raise AssertionError("no API calls in this test")


def _node(
    name: str, rv: str, labels: dict[str, str], gone: bool = False, marked: bool = False
) -> bytes:
    obj: dict[str, Any] = {
        "metadata": {"name": name, "uid": f"u-{name}", "resourceVersion": rv, "labels": labels}
    }
    if gone:  # what the node lifecycle controller makes of a node whose kubelet stopped
        taints = [{"key": UNREACHABLE_TAINT, "effect": "NoSchedule"}]
        if marked:  # and an administrator who knows it is shut down
            taints.append({"key": OUT_OF_SERVICE_TAINT, "effect": "NoExecute"})
        obj["spec"] = {"taints": taints}
        obj["status"] = {"conditions": [{"type": "Ready", "status": "Unknown"}]}
    return json.dumps({"type": "MODIFIED", "object": obj}).encode()


def test_the_fleet_is_worked_out_again_only_after_the_cache_changed() -> None:
    nodes = Informer(ResourceSpec("nodes", _never, transform=trim_node), lambda *_: None)
    fleet = GpuNodes(nodes)
    assert fleet() == ((), False, False, (), 0, 0)

    nodes._on_line(_node("b", "1", {GPU: "true"}))
    nodes._on_line(_node("a", "2", {GPU: "true", MIG_CAPABLE_LABEL: "true"}))
    nodes._on_line(_node("cpu", "3", {}))
    first = fleet()
    assert [n["metadata"]["name"] for n in first.nodes] == ["a", "b"]
    assert first.has_nfd
    assert first.mig_capable
    assert fleet() is first  # nothing changed: the same answer, not a new scan
    # The version it was read at, kept when the cache moves on: a memo of anything
    # worked out from these nodes is keyed on it (issue 43: the deploy-label gate keyed
    # on the cache's later version never counted the labels written meanwhile).
    assert first.version == nodes.version

    nodes._on_line(_node("a", "4", {GPU: "false"}))  # NFD says: no GPU after all
    assert first.version < nodes.version
    second = fleet()
    assert second.version == nodes.version
    assert [n["metadata"]["name"] for n in second.nodes] == ["b"]
    assert second.has_nfd
    assert not second.mig_capable


def test_the_fleet_names_the_gpu_nodes_marked_out_of_service() -> None:
    """Only those can hold pods to release, so the cluster pass looks at no other; a
    node that only stopped reporting is not one."""
    nodes = Informer(ResourceSpec("nodes", _never, transform=trim_node), lambda *_: None)
    fleet = GpuNodes(nodes)
    nodes._on_line(_node("alive", "1", {GPU: "true"}))
    nodes._on_line(_node("dead", "2", {GPU: "true"}, gone=True, marked=True))
    nodes._on_line(_node("lost", "5", {GPU: "true"}, gone=True))  # partitioned only
    nodes._on_line(_node("dead-cpu", "3", {}, gone=True, marked=True))  # not ours
    assert [n["metadata"]["name"] for n in fleet().out_of_service] == ["dead"]

    nodes._on_line(_node("dead", "4", {GPU: "true"}))  # its kubelet is back
    assert fleet().out_of_service == ()


def test_gpu_nodes_stay_while_nfds_labels_are_away_and_are_counted() -> None:
    """NFD's uninstall prune leaves a GPU node with our labels only: still a GPU node (and
    MIG-capable by the MIG manager's deploy label), counted in ``nfd_away`` (the cluster
    pass leaves the driver as it is meanwhile); no NFD label on any node, so no
    ``has_nfd``."""
    nodes = Informer(ResourceSpec("nodes", _never, transform=trim_node), lambda *_: None)
    fleet = GpuNodes(nodes)
    pruned = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.deploy.mig-manager": "true"}
    nodes._on_line(_node("a", "1", pruned))
    nodes._on_line(_node("cpu", "2", {}))
    away = fleet()
    assert [n["metadata"]["name"] for n in away.nodes] == ["a"]
    assert away.nfd_away == 1
    assert away.mig_capable
    assert not away.has_nfd
    nodes._on_line(_node("a", "3", {**pruned, GPU: "true", MIG_CAPABLE_LABEL: "true"}))
    back = fleet()
    assert back.nfd_away == 0
    assert back.has_nfd
