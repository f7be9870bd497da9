"""What the controller keeps of our operand Pods and ControllerRevisions.

At fleet scale operand pods outnumber everything else (six or seven per GPU node)
and a whole Pod is tens of kilobytes. The controller reads a handful of fields of
each: the per-node rollout asks, for every component, whether its pod on a node is
there, Ready and on the current revision; the upgrade code reads the driver and
validator pods more closely. What pods have in common (the labels and owner of a
DaemonSet revision, the node, the status) is shared between them
(:mod:`gpuop.compact`), leaving a few hundred bytes unique to each pod.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from typing_extensions import TypedDict

from components.driver import COMPONENT_POD_LABEL, CONFIG_DIGEST_ENV, digest_in
from components.driver import DAEMONSET_NAME as DRIVER_DS
from components.validator import DAEMONSET_NAME as VALIDATOR_DS
from gpuop.compact import shared
from gpuop.informer import key_of

Obj = dict[str, Any]

#: The operand pods a node's upgrade reads (the driver pod it restarts and the validator
#: pod it waits for): only their events wake that node's reconcile. Every operand pod
#: is watched (the per-node rollout reads them all) but the others wake only the
#: cluster pass, and only when what it reads of them changes.
WATCHED_APPS = (DRIVER_DS, VALIDATOR_DS)


def pod_selector(managed: str) -> str:
    """``managed`` (our objects) narrowed to the pods of :data:`WATCHED_APPS` (tools)."""
    return f"{managed},app in ({','.join(WATCHED_APPS)})"


class _Owner(TypedDict, total=False):
    kind: str
    name: str
    uid: str


class _PodMeta(TypedDict, total=False):
    name: str
    namespace: str
    uid: str
    resourceVersion: str
    creationTimestamp: str
    deletionTimestamp: str
    labels: dict[str, str]
    ownerReferences: list[_Owner]


class _Env(TypedDict, total=False):
    name: str
    value: str


class _Container(TypedDict, total=False):
    env: list[_Env]


class _PodSpec(TypedDict, total=False):
    nodeName: str
    containers: list[_Container]


class _Condition(TypedDict, total=False):
    type: str
    status: str


class _Waiting(TypedDict, total=False):
    reason: str


class _ContainerState(TypedDict, total=False):
    waiting: _Waiting


class _ContainerStatus(TypedDict, total=False):
    name: str
    restartCount: int
    state: _ContainerState


class _PodStatus(TypedDict, total=False):
    phase: str
    conditions: list[_Condition]
    containerStatuses: list[_ContainerStatus]


class PodShape(TypedDict, total=False):
    """Every field :func:`trim_pod` reads, for the pods watch to parse and nothing more
    (:mod:`gpuop.shapes`). A field added to ``trim_pod`` must be added here too;
    ``tests/unit/test_shapes.py`` checks both give the same cache entry."""

    metadata: _PodMeta
    spec: _PodSpec
    status: _PodStatus


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
        "spec": shared(_spec(pod.get("spec") or {})),
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


def _spec(spec: Obj) -> Obj:
    """The node, and the driver's config digest (restart-only upgrades compare it)."""
    kept: Obj = {"nodeName": spec.get("nodeName")}
    digest = digest_in(spec)
    if digest:
        kept["containers"] = [{"env": [{"name": CONFIG_DIGEST_ENV, "value": digest}]}]
    return kept


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


def app_of(labels: Mapping[str, str]) -> str:
    """The DaemonSet an operand pod (or selector) names: its ``app`` label, or ``name``
    for the operands upstream selects by that (the VFIO and CC managers); "" for none."""
    return str(labels.get("app") or labels.get("name") or "")


def pod_app(pod: Obj) -> str:
    """The pod's DaemonSet name (:func:`app_of` its labels), "" when it has none."""
    return app_of(pod["metadata"].get("labels") or {})


def daemonset_app(ds: Obj) -> str:
    """What :func:`pod_app` says of the DaemonSet's pods: read from its selector."""
    return app_of(ds["spec"]["selector"]["matchLabels"])


DRIVER_COMPONENTS = ("nvidia-driver", "nvidia-vgpu-host-manager")
"""``app.kubernetes.io/component`` of the driver pods (ClusterPolicy and NVIDIADriver)."""


def is_driver_pod(pod: Obj) -> bool:
    """A pod of any driver DaemonSet we run (the ClusterPolicy's or an NVIDIADriver's)."""
    return (pod["metadata"].get("labels") or {}).get(COMPONENT_POD_LABEL) in DRIVER_COMPONENTS


def pod_index(pod: Obj) -> tuple[str, str] | None:
    """Pods by (node, app label): the upgrade code asks for "the driver pod on node X"."""
    node = pod["spec"].get("nodeName")
    app = app_of(pod["metadata"]["labels"])
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


class PodSubset:
    """Some of the operand pods cache, kept up to date by its events (no watch of its
    own): the NVIDIADriver controller asks questions of every driver pod, and a second
    watch for them made the API server send, and this process parse and keep, each
    driver pod twice. ``version`` counts changes to the subset only, so answers
    memoised on it are not worked out again for every other operand pod's event."""

    def __init__(self, member: Callable[[Obj], bool]) -> None:
        self._member = member
        self._pods: dict[str, Obj] = {}
        self.version = 0

    def update(self, old: Obj | None, new: Obj | None) -> bool:
        """Follow one event of the pods cache; True when the pod is in the subset."""
        pod = new or old
        if pod is None or not self._member(pod):
            return False
        key = key_of(pod)
        if new is None:
            self._pods.pop(key, None)
        else:
            self._pods[key] = new
        self.version += 1
        return True

    def values(self) -> list[Obj]:
        return list(self._pods.values())
