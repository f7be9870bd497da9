"""Shared read-only cache leaves: equal values share one instance, nobody can mutate it."""

from __future__ import annotations

import copy
import gc
import json
import pickle

import pytest

from gpuop.kube.compact import FrozenDict, FrozenList, frozen, pool_size, shared
from gpuop.operator.controller.views.node_views import trim_node
from gpuop.operator.controller.views.pod_records import trim_pod


def test_equal_values_share_one_instance() -> None:
    a = shared({"app": "nvidia-driver-daemonset", "hash": "abc"})
    b = shared({"app": "nvidia-driver-daemonset", "hash": "abc"})
    assert a is b
    assert a == {"app": "nvidia-driver-daemonset", "hash": "abc"}
    assert isinstance(a, dict)
    assert shared({"app": "other", "hash": "abc"}) is not a


def test_nested_values_share_and_compare_like_plain_json() -> None:
    value = {"conditions": [{"type": "Ready", "status": "True"}], "n": 1}
    a, b = shared(value), shared(json.loads(json.dumps(value)))
    assert a is b
    assert a["conditions"] is b["conditions"]
    assert isinstance(a["conditions"], FrozenList)
    assert json.loads(json.dumps(a)) == value


def test_scalars_of_different_types_are_not_confused() -> None:
    # True == 1 == 1.0 in Python; a pool keyed on equality alone would merge them.
    assert shared({"v": True})["v"] is True
    assert shared({"v": 1})["v"] == 1
    assert type(shared({"v": 1})["v"]) is int
    assert type(shared({"v": 1.0})["v"]) is float


def test_strings_are_interned() -> None:
    s1 = "".join(["gpu-", "operator"])
    s2 = "".join(["gpu-", "operator"])
    assert s1 is not s2
    assert shared(s1) is shared(s2)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.__setitem__("x", "1"),
        lambda d: d.pop("app"),
        lambda d: d.update(x="1"),
        lambda d: d.setdefault("x", "1"),
        lambda d: d.clear(),
        lambda d: d.__delitem__("app"),
    ],
)
def test_shared_dict_refuses_mutation(mutate: object) -> None:
    d = shared({"app": "x"})
    with pytest.raises(TypeError, match="read-only"):
        mutate(d)  # type: ignore[operator]
    assert d == {"app": "x"}


def test_shared_list_refuses_mutation() -> None:
    items = shared([{"a": "b"}])
    for mutate in (lambda: items.append(1), lambda: items.pop(), lambda: items.sort()):
        with pytest.raises(TypeError):
            mutate()
    with pytest.raises(TypeError):
        items[0] = 1
    assert items == [{"a": "b"}]


def test_copies_are_plain_and_mutable() -> None:
    d = shared({"labels": {"a": "b"}, "list": [1]})
    for c in (copy.copy(d), copy.deepcopy(d), d.copy(), pickle.loads(pickle.dumps(d))):
        assert type(c) is dict
        assert c == d
        c["new"] = 1
    deep = copy.deepcopy(d)
    assert type(deep["labels"]) is dict
    deep["labels"]["a"] = "changed"
    assert d["labels"]["a"] == "b"


def test_pool_forgets_values_nobody_holds() -> None:
    gc.collect()
    before = pool_size()
    held = shared({"unique-to-this-test": "value-1"})
    assert pool_size() == before + 1
    del held
    gc.collect()
    assert pool_size() == before


def test_frozen_is_read_only_but_not_pooled() -> None:
    a, b = frozen({"k": "v"}), frozen({"k": "v"})
    assert a == b
    assert a is not b
    assert isinstance(a, FrozenDict)
    with pytest.raises(TypeError):
        a["k"] = "w"


def _pod(node: str, name: str) -> dict[str, object]:
    return {
        "metadata": {
            "name": name,
            "namespace": "gpu-operator",
            "uid": f"uid-{name}",
            "resourceVersion": "10",
            "labels": {"app": "nvidia-driver-daemonset", "controller-revision-hash": "h1"},
            "ownerReferences": [
                {"kind": "DaemonSet", "name": "nvidia-driver-daemonset", "uid": "u"}
            ],
            "managedFields": [{"manager": "x"}],
        },
        "spec": {"nodeName": node, "containers": [{"name": "driver", "image": "i"}]},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}, {"type": "Initialized"}],
            "containerStatuses": [{"name": "driver", "restartCount": 0, "image": "i"}],
        },
    }


def test_pods_of_one_revision_share_everything_but_identity() -> None:
    a = trim_pod(_pod("n1", "driver-a"))
    b = trim_pod(_pod("n2", "driver-b"))
    assert a.labels is b.labels
    assert a.phase is b.phase
    assert a.node is not b.node
    assert a.node is trim_pod(_pod("n1", "driver-c")).node
    assert a.name == "driver-a"
    assert (a.phase, a.ready, a.restarts, a.waiting) == ("Running", True, 0, "")


def test_node_labels_are_read_only() -> None:
    node = trim_node(
        {
            "metadata": {"name": "n1", "labels": {"a": "b"}, "annotations": {}},
            "spec": {},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }
    )
    with pytest.raises(TypeError):
        node["metadata"]["labels"]["a"] = "c"
    assert (
        node["status"]
        is trim_node(
            {
                "metadata": {"name": "n2"},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]},
            }
        )["status"]
    )


def test_nodes_alike_share_one_labels_dict_without_gfds_timestamp() -> None:
    """GFD's timestamp is the one read-prefixed label unique to each node; without it,
    nodes of one GPU model share their labels (pooled) instead of a dict each."""

    def node(name: str, stamp: str) -> dict[str, object]:
        return {
            "metadata": {
                "name": name,
                "labels": {
                    "kubernetes.io/hostname": name,
                    "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
                    "nvidia.com/gfd.timestamp": stamp,
                },
            },
            "status": {},
        }

    a, b = trim_node(node("n1", "1732500000")), trim_node(node("n2", "1732500123"))
    assert a["metadata"]["labels"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    assert a["metadata"]["labels"] is b["metadata"]["labels"]
