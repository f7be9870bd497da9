"""What the controller keeps of our operand Pods and ControllerRevisions.

At fleet scale operand pods outnumber everything else (six or seven per GPU node)
and a whole Pod is tens of kilobytes. The controller reads two of them per node
(driver and validator) and a handful of their fields, so that is all it watches
and keeps. What pods have in common (the labels and owner of a DaemonSet
revision, the node, the status) is shared between them (:mod:`gpuop.compact`),
leaving a few hundred bytes unique to each pod.
"""

from __future__ import annotations

from typing import Any

from components.driver import DAEMONSET_NAME as DRIVER_DS
from components.validator import DAEMONSET_NAME as VALIDATOR_DS
from gpuop.compact import shared

Obj = dict[str, Any]

#: The operand pods the controller reads: the driver pod a node upgrade restarts and
#: the validator pod it waits for. The other five or so operand pods per node are
#: never read, so they are not watched at all: at 3,000 nodes that is 15,000 pods
#: fewer in memory and their status churn never reaches the operator.
WATCHED_APPS = (DRIVER_DS, VALIDATOR_DS)


def pod_selector(managed: str) -> str:
    """``managed`` (our objects) narrowed to the pods of :data:`WATCHED_APPS`."""
    return f"{managed},app in ({','.join(WATCHED_APPS)})"


_META = ("name", "namespace", "uid", "resourceVersion", "creationTimestamp", "deletionTimestamp")


def trim_pod(pod: Obj) -> Obj:
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    return {
        "metadata": {
            **_identity(meta),
            "labels": shared(meta.get("labels") or {}),
            "ownerReferences": shared(
                [
                    {"kind": o.get("kind"), "name": o.get("name"), "uid": o.get("uid")}
                    for o in meta.get("ownerReferences") or []
                ]
            ),
        },
        "spec": shared({"nodeName": (pod.get("spec") or {}).get("nodeName")}),
        "status": shared(
            {
                "phase": status.get("phase"),
                "conditions": [
                    {"type": "Ready", "status": c.get("status")}
                    for c in status.get("conditions") or []
                    if c.get("type") == "Ready"
                ],
                "containerStatuses": [_container(c) for c in status.get("containerStatuses") or []],
            }
        ),
    }


def _container(status: Obj) -> Obj:
    """Restarts, and why it waits (``ImagePullBackOff``): what a failed upgrade reports."""
    kept = {"name": status.get("name"), "restartCount": status.get("restartCount", 0)}
    waiting = ((status.get("state") or {}).get("waiting") or {}).get("reason")
    if waiting:
        kept["waiting"] = waiting
    return kept


#: Metadata that repeats across thousands of objects, so it is interned; names,
#: uids and resourceVersions are unique and kept as they are.
_REPEATED = frozenset(("namespace", "creationTimestamp", "deletionTimestamp"))


def _identity(meta: Obj) -> Obj:
    return {k: shared(meta[k]) if k in _REPEATED else meta[k] for k in _META if k in meta}


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
            **_identity(meta),
            "labels": shared(meta.get("labels") or {}),
            "ownerReferences": shared(meta.get("ownerReferences") or []),
        },
        "revision": rev.get("revision", 0),
    }
