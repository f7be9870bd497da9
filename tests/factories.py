"""Shared builders of the objects tests feed the operator: a node, a pod, a ClusterPolicy
and a node pass's snapshot, as the API server (or the caches) hold them. A test names
only what matters to it; everything else is a plain default."""

from __future__ import annotations

from typing import Any

import crd
from components.keys import NFD_GPU_LABELS
from components.labels import apply_label_changes, node_label_changes
from statemachine.node_plan import NodeSnapshot

Obj = dict[str, Any]


def node(
    name: str = "n0",
    labels: dict[str, str] | None = None,
    *,
    annotations: dict[str, str] | None = None,
    gpu: bool = False,
    deployed: crd.ClusterPolicySpec | None = None,
    rv: str = "1",
    uid: str | None = None,
    created: str | None = None,
    ready: bool | None = None,
    **spec: Any,
) -> Obj:
    """A Node. ``gpu``: NFD's GPU label on it; ``deployed``: also the deploy labels that
    policy gives it (nothing left to write); ``ready``: a Ready condition."""
    node_labels = {NFD_GPU_LABELS[0]: "true"} if gpu or deployed is not None else {}
    if deployed is not None:
        node_labels = apply_label_changes(node_labels, node_label_changes(node_labels, deployed))
    meta: Obj = {"name": name, "resourceVersion": rv, "labels": {**node_labels, **(labels or {})}}
    if uid is not None:
        meta["uid"] = uid
    if annotations is not None:
        meta["annotations"] = dict(annotations)
    if created is not None:
        meta["creationTimestamp"] = created
    obj: Obj = {"metadata": meta, "spec": dict(spec)}
    if ready is not None:
        obj["status"] = {"conditions": [{"type": "Ready", "status": str(ready)}]}
    return obj


def pod(
    name: str,
    node_name: str,
    *,
    namespace: str = "default",
    labels: dict[str, str] | None = None,
    phase: str = "Running",
    ready: bool = True,
    uid: str | None = None,
    owner: tuple[str, str] | None = None,
) -> Obj:
    """A Pod bound to ``node_name``; ``owner``: its controller's (kind, name)."""
    meta: Obj = {
        "name": name,
        "namespace": namespace,
        "uid": uid or f"uid-{namespace}-{name}",
        "labels": dict(labels or {}),
    }
    if owner is not None:
        meta["ownerReferences"] = [{"kind": owner[0], "name": owner[1], "controller": True}]
    return {
        "metadata": meta,
        "spec": {"nodeName": node_name, "containers": [{"name": "main"}]},
        "status": {
            "phase": phase,
            "conditions": [{"type": "Ready", "status": str(ready)}],
        },
    }


def operand_pod(app: str, node_name: str, revision: str, *, uid: str, container: str = "c") -> Obj:
    """A Running, Ready pod of the operand DaemonSet ``app`` on ``node_name``, from its
    revision ``revision``, as the operand pods cache is fed it."""
    return {
        "metadata": {
            "name": f"{app}-{node_name}",
            "namespace": "gpu-operator",
            "uid": uid,
            "resourceVersion": "1",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {"app": app, "controller-revision-hash": revision},
            "ownerReferences": [{"kind": "DaemonSet", "name": app, "uid": "ds"}],
        },
        "spec": {"nodeName": node_name},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": container, "restartCount": 0}],
        },
    }


def policy(
    spec: Obj | None = None,
    *,
    name: str = "cluster-policy",
    generation: int = 1,
    rv: str = "1",
    annotations: dict[str, str] | None = None,
) -> Obj:
    """A ClusterPolicy as stored (no status yet)."""
    meta: Obj = {"name": name, "uid": f"uid-{name}", "generation": generation}
    meta["resourceVersion"] = rv
    if annotations is not None:
        meta["annotations"] = dict(annotations)
    return {
        "apiVersion": "nvidia.com/v1",
        "kind": "ClusterPolicy",
        "metadata": meta,
        "spec": dict(spec or {}),
    }


def snapshot(node_obj: Obj | None, name: str = "n0", **facts: Any) -> NodeSnapshot:
    """A node pass's snapshot of ``node_obj`` (None: the node is gone), with ``facts``."""
    return NodeSnapshot(name, node_obj, **facts)
