"""The watch cache's own bookkeeping: trimming, the secondary index, observe()."""

from __future__ import annotations

import json
from typing import Any

from gpuop.kube.informer import Informer, ResourceSpec
from gpuop.operator.controller.views.pod_records import pod_index, pods_on, trim_pod, trim_revision


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
    assert trimmed.labels["controller-revision-hash"] == "abc"
    assert (trimmed.key, trimmed.name, trimmed.namespace) == ("ns/p", "p", "ns")
    assert (trimmed.uid, trimmed.resource_version) == ("u-p", "1")
    assert (trimmed.node, trimmed.app, trimmed.phase, trimmed.ready) == (
        "n1",
        "driver",
        "Running",
        True,
    )
    assert trimmed.restarts == 3
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
    assert [p.name for p in pods_on(informer, "n1", "driver")] == ["a"]
    # A newer version of "a" on another node moves it in the index.
    informer.observe(_pod("a", "n2", "driver", rv="2"))
    assert pods_on(informer, "n1", "driver") == []
    assert sorted(p.name for p in pods_on(informer, "n2", "driver")) == ["a", "c"]
    # An older version never overwrites a newer one.
    informer.observe(_pod("a", "n1", "driver", rv="1"))
    assert pods_on(informer, "n1", "driver") == []
    informer._on_line(
        b'{"type":"DELETED","object":'
        + __import__("json").dumps(_pod("c", "n2", "driver")).encode()
        + b"}"
    )
    assert [p.name for p in pods_on(informer, "n2", "driver")] == ["a"]
    assert set(informer.store) == {"ns/a", "ns/b"}


# ---------------------------------------------------------------- ordering
def _node(name: str, rv: str, state: str, uid: str = "") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "uid": uid or f"u-{name}",
            "resourceVersion": rv,
            "labels": {"nvidia.com/gpu-driver-upgrade-state": state},
        }
    }


def _event(kind: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode()


def _recording() -> tuple[Informer, list[tuple[str, str | None, str | None]]]:
    seen: list[tuple[str, str | None, str | None]] = []

    def handler(kind: str, old: Any, new: Any) -> None:
        rv = lambda o: None if o is None else o["metadata"]["resourceVersion"]  # noqa: E731
        seen.append((kind, rv(old), rv(new)))

    return Informer(ResourceSpec("nodes", _never), handler), seen


def _state(informer: Informer, key: str) -> str | None:
    obj = informer.get(key)
    return None if obj is None else obj["metadata"]["labels"]["nvidia.com/gpu-driver-upgrade-state"]


def test_a_watch_event_older_than_our_write_does_not_overwrite_it() -> None:
    """The slot race: our patch (rv 105) says upgrade-done; the watch then delivers
    rv 100 (upgrade-required), written before our patch. The cache keeps 105."""
    informer, seen = _recording()
    informer._on_line(_event("ADDED", _node("n1", "90", "upgrade-required")))
    informer.observe(_node("n1", "105", "upgrade-done"))
    informer._on_line(_event("MODIFIED", _node("n1", "100", "upgrade-required")))
    assert _state(informer, "n1") == "upgrade-done"
    informer._on_line(_event("MODIFIED", _node("n1", "105", "upgrade-done")))  # our own
    informer._on_line(_event("MODIFIED", _node("n1", "110", "cordon-required")))
    assert _state(informer, "n1") == "cordon-required"
    assert seen == [("ADDED", None, "90"), ("MODIFIED", "105", "110")]


def test_a_write_answered_after_the_delete_does_not_bring_the_object_back() -> None:
    """A node deleted while our patch was in flight must not come back as a ghost
    (it would keep an upgrade slot forever)."""
    informer, seen = _recording()
    informer._on_line(_event("ADDED", _node("n1", "10", "upgrade-required")))
    informer._on_line(_event("DELETED", _node("n1", "12", "upgrade-required")))
    informer.observe(_node("n1", "11", "cordon-required"))
    assert informer.get("n1") is None
    assert seen == [("ADDED", None, "10"), ("DELETED", "10", None)]


def test_a_deleted_uid_stays_dead_even_when_versions_cannot_be_ordered() -> None:
    informer, _ = _recording()
    informer._on_line(_event("ADDED", _node("n1", "a", "upgrade-required")))
    informer._on_line(_event("DELETED", _node("n1", "c", "upgrade-required")))
    informer.observe(_node("n1", "b", "cordon-required"))
    assert informer.get("n1") is None
    # Opaque versions otherwise keep the old rule: the newest arrival wins.
    informer.observe(_node("n1", "d", "upgrade-done", uid="other"))
    informer.observe(_node("n1", "e", "cordon-required", uid="other"))
    assert _state(informer, "n1") == "cordon-required"


def test_replace_force_old_writes_do_not_shadow_the_new_object() -> None:
    """``kubectl replace --force``: the old object is deleted and a new one with the
    same name created. A late answer to a write on the old one is dropped, and the
    new one arrives as ADDED, not as a modification of a ghost."""
    informer, seen = _recording()
    informer._on_line(_event("ADDED", _node("p", "10", "a", uid="old")))
    informer._on_line(_event("DELETED", _node("p", "12", "a", uid="old")))
    informer.observe(_node("p", "11", "b", uid="old"))
    assert informer.get("p") is None
    informer._on_line(_event("ADDED", _node("p", "13", "c", uid="new")))
    informer.observe(_node("p", "11", "b", uid="old"))
    assert informer.get("p") == _node("p", "13", "c", uid="new")
    assert seen == [("ADDED", None, "10"), ("DELETED", "10", None), ("ADDED", None, "13")]


def test_a_delete_of_the_old_object_keeps_a_newer_one_we_created() -> None:
    informer, seen = _recording()
    informer._on_line(_event("ADDED", _node("p", "10", "a", uid="old")))
    informer.observe(_node("p", "20", "b", uid="new"))  # our create, answered first
    informer._on_line(_event("DELETED", _node("p", "15", "a", uid="old")))
    assert _state(informer, "p") == "b"
    informer._on_line(_event("ADDED", _node("p", "20", "b", uid="new")))
    assert seen == [("ADDED", None, "10")]


def test_an_object_that_leaves_and_rejoins_the_selection_comes_back() -> None:
    """With a label selector, DELETED means "no longer matches": the same uid may
    return, newer, through the watch or our own write."""
    informer, _ = _recording()
    informer._on_line(_event("ADDED", _node("d", "10", "a")))
    informer._on_line(_event("DELETED", _node("d", "12", "a")))
    informer.observe(_node("d", "11", "stale"))
    assert informer.get("d") is None
    informer.observe(_node("d", "14", "b"))
    assert _state(informer, "d") == "b"
    informer._on_line(_event("DELETED", _node("d", "16", "b")))
    informer._on_line(_event("ADDED", _node("d", "18", "c")))
    assert _state(informer, "d") == "c"


def test_the_version_moves_on_every_change_of_the_store_and_only_then() -> None:
    """Readers memoise what they derive from the whole store by this number."""
    informer, _ = _recording()
    v0 = informer.version
    informer._on_line(_event("ADDED", _node("n1", "90", "upgrade-done")))
    v1 = informer.version
    assert v1 > v0
    informer._on_line(_event("MODIFIED", _node("n1", "90", "upgrade-done")))  # same version
    informer._on_line(_event("MODIFIED", _node("n1", "80", "upgrade-done")))  # older
    assert informer.version == v1
    informer.observe(_node("n1", "95", "cordon-required"))
    v2 = informer.version
    assert v2 > v1
    informer._on_line(_event("DELETED", _node("n1", "96", "cordon-required")))
    assert informer.version > v2
    assert informer.get("n1") is None
