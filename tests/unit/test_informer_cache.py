"""The watch cache's own bookkeeping: trimming, the secondary index, observe()."""

from __future__ import annotations

from typing import Any

from gpuop.controller._pods import pod_index, trim_pod, trim_revision
from gpuop.informer import Informer, ResourceSpec


async def _never(**_: Any) -> Any:
    raise AssertionError("no API calls in this test")


def _pod(name: str, node: str, app: str, rv: str = "1") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"u-{name}",
            "resourceVersion": rv,
            "labels": {"app": app, "controller-revision-hash": "abc"},
            "managedFields": [{"manager": "kcm"}],
            "annotations": {"big": "x" * 1000},
            "ownerReferences": [{"kind": "DaemonSet", "name": app, "uid": "d", "apiVersion": "x"}],
        },
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i", "env": []}]},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True", "lastProbeTime": None}],
            "containerStatuses": [{"name": "c", "restartCount": 3, "imageID": "sha"}],
        },
    }


def test_trim_pod_keeps_what_the_upgrade_code_reads() -> None:
    trimmed = trim_pod(_pod("p", "n1", "driver"))
    assert trimmed["metadata"]["labels"]["controller-revision-hash"] == "abc"
    assert trimmed["metadata"]["uid"] == "u-p"
    assert trimmed["spec"] == {"nodeName": "n1"}
    assert trimmed["status"]["containerStatuses"] == [{"name": "c", "restartCount": 3}]
    assert "annotations" not in trimmed["metadata"]
    assert "managedFields" not in trimmed["metadata"]
    assert len(repr(trimmed)) < len(repr(_pod("p", "n1", "driver"))) / 3


def test_trim_revision_drops_the_template() -> None:
    rev = {
        "metadata": {"name": "r", "labels": {"controller-revision-hash": "h"}},
        "data": {"spec": {"template": "big"}},
        "revision": 4,
    }
    assert trim_revision(rev) == {
        "metadata": {
            "name": "r",
            "labels": {"controller-revision-hash": "h"},
            "ownerReferences": [],
        },
        "revision": 4,
    }


def test_index_follows_adds_moves_and_deletes() -> None:
    informer = Informer(
        ResourceSpec("pods", _never, transform=trim_pod, index=pod_index), lambda *_: None
    )
    informer.observe(_pod("a", "n1", "driver"))
    informer.observe(_pod("b", "n1", "validator"))
    informer.observe(_pod("c", "n2", "driver"))
    assert [p["metadata"]["name"] for p in informer.indexed(("n1", "driver"))] == ["a"]
    # A newer version of "a" on another node moves it in the index.
    informer.observe(_pod("a", "n2", "driver", rv="2"))
    assert informer.indexed(("n1", "driver")) == []
    assert sorted(p["metadata"]["name"] for p in informer.indexed(("n2", "driver"))) == ["a", "c"]
    # An older version never overwrites a newer one.
    informer.observe(_pod("a", "n1", "driver", rv="1"))
    assert informer.indexed(("n1", "driver")) == []
    informer._on_line(
        b'{"type":"DELETED","object":'
        + __import__("json").dumps(_pod("c", "n2", "driver")).encode()
        + b"}"
    )
    assert [p["metadata"]["name"] for p in informer.indexed(("n2", "driver"))] == ["a"]
    assert set(informer.store) == {"ns/a", "ns/b"}
