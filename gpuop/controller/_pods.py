"""What the controller keeps of our operand Pods and ControllerRevisions.

At fleet scale operand pods outnumber everything else (six or seven per GPU node)
and a whole Pod is tens of kilobytes; the controller reads a handful of fields,
so that is all the cache keeps (about 1 KiB a pod).
"""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]

_META = ("name", "namespace", "uid", "resourceVersion", "creationTimestamp", "deletionTimestamp")


def trim_pod(pod: Obj) -> Obj:
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    return {
        "metadata": {
            **{k: meta[k] for k in _META if k in meta},
            "labels": meta.get("labels") or {},
            "ownerReferences": [
                {"kind": o.get("kind"), "name": o.get("name"), "uid": o.get("uid")}
                for o in meta.get("ownerReferences") or []
            ],
        },
        "spec": {"nodeName": (pod.get("spec") or {}).get("nodeName")},
        "status": {
            "phase": status.get("phase"),
            "conditions": [
                {"type": "Ready", "status": c.get("status")}
                for c in status.get("conditions") or []
                if c.get("type") == "Ready"
            ],
            "containerStatuses": [
                {"name": c.get("name"), "restartCount": c.get("restartCount", 0)}
                for c in status.get("containerStatuses") or []
            ],
        },
    }


def pod_index(pod: Obj) -> tuple[str, str] | None:
    """Pods by (node, app label): the upgrade code asks for "the driver pod on node X"."""
    node = pod["spec"].get("nodeName")
    app = pod["metadata"]["labels"].get("app")
    return (node, app) if node and app else None


def trim_revision(rev: Obj) -> Obj:
    """A ControllerRevision without its ``data`` (a whole pod template)."""
    meta = rev.get("metadata") or {}
    return {
        "metadata": {
            **{k: meta[k] for k in _META if k in meta},
            "labels": meta.get("labels") or {},
            "ownerReferences": meta.get("ownerReferences") or [],
        },
        "revision": rev.get("revision", 0),
    }
