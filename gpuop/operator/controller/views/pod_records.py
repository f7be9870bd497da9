"""What the controller keeps of our operand Pods and ControllerRevisions.

At fleet scale operand pods outnumber everything else (six or seven per GPU node)
and a whole Pod is tens of kilobytes. The controller reads a handful of fields of
each: the per-node rollout asks, for every component, whether its pod on a node is
there, Ready and on the current revision; the upgrade code reads the driver and
validator pods more closely. The pods watch parses only those fields
(:class:`PodShape`) and keeps them as a :class:`PodRecord`, whose labels are shared
between the pods of one DaemonSet revision (:mod:`gpuop.kube.compact`): about 400 bytes
per pod, most of it its name, uid and resourceVersion.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from typing_extensions import TypedDict

from components.driver import COMPONENT_POD_LABEL, digest_in
from components.driver import CONFIG_DIGEST_ENV as DIGEST_ENV
from components.driver import DAEMONSET_NAME as DRIVER_DS
from components.validator import DAEMONSET_NAME as VALIDATOR_DS
from components.vfio_manager import DAEMONSET_NAME as VFIO_MANAGER_APP
from components.vgpu_manager import DAEMONSET_NAME as VGPU_MANAGER_APP
from gpuop.kube._pb_wire import rfc3339
from gpuop.kube.compact import shared
from gpuop.kube.informer import Informer, key_of
from gpuop.operator.controller.views.upgrade_inputs import template_spec
from statemachine import DriverPodView
from statemachine.upgrade_keys import DRIVER_REVISION_LABEL

Obj = dict[str, Any]

#: The operand pods a node's upgrade reads (the driver pod it restarts and the validator
#: pod it waits for): only their events wake that node's reconcile. Every operand pod
#: is watched (the per-node rollout reads them all) but the others wake only the
#: cluster pass, and only when what it reads of them changes.
WATCHED_APPS = (DRIVER_DS, VALIDATOR_DS)
HANDOVER_APPS = (VFIO_MANAGER_APP, VGPU_MANAGER_APP)
"""The VM claimants' pods (their DaemonSets' `app`): their going wakes the node pass,
as a driver pod's does."""


def pod_selector(managed: str) -> str:
    """``managed`` (our objects) narrowed to the pods of :data:`WATCHED_APPS` (tools)."""
    return f"{managed},app in ({','.join(WATCHED_APPS)})"


class _PodMeta(TypedDict, total=False):
    name: str
    namespace: str
    uid: str
    resourceVersion: str
    creationTimestamp: str
    deletionTimestamp: str
    labels: dict[str, str]


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
    restartCount: int
    state: _ContainerState


class _PodStatus(TypedDict, total=False):
    phase: str
    conditions: list[_Condition]
    containerStatuses: list[_ContainerStatus]


class PodShape(TypedDict, total=False):
    """Every field :func:`trim_pod` reads, for the pods watch to parse and nothing more
    (:mod:`gpuop.kube.shapes`). A field added to ``trim_pod`` must be added here too;
    ``tests/unit/test_shapes.py`` checks both give the same cache entry."""

    metadata: _PodMeta
    spec: _PodSpec
    status: _PodStatus


@dataclass(frozen=True, slots=True, eq=True)
class PodRecord:
    """One operand pod as the caches keep it: the fields its readers use, nothing else.

    Readers: the per-node rollout (node, app, Ready, revision hash, deletion, creation
    time), stale-pod release (name, uid, deletion, driver or not), the NVIDIADriver
    hand-over (driver pods' nodes and apps) and the upgrade machine (the driver pod's
    uid, revision hash, phase, Ready, restarts, why it waits, config digest). A slotted
    record is about a tenth of the nested dicts it replaces (``python -m
    tests.bench.cache_size``). Whoever writes a pod (a restart, a release) names it by
    ``key`` and ``uid`` and asks the API server, never this record, for the rest.
    """

    key: str
    """``namespace/name``, the cache's key (the same string object: not held twice)."""
    packed_uid: int | str
    """The uid as the integer of its UUID (44 bytes instead of 85), or as sent when it
    is not a UUID in the canonical form (:attr:`uid` gives it back either way)."""
    packed_resource_version: int | str
    """The resourceVersion as an integer (an etcd revision), or as sent when it is not
    one (:attr:`resource_version` gives it back either way)."""
    created: str
    """``creationTimestamp`` (RFC 3339, interned: pods of one rollout share seconds)."""
    deleting: bool
    """``deletionTimestamp`` is set: the pod is terminating."""
    node: str
    labels: Mapping[str, str]
    """Shared, read-only (:func:`gpuop.kube.compact.shared`): a DaemonSet revision's pods
    carry the same labels."""
    phase: str
    ready: bool
    """The ``Ready`` condition is ``True``."""
    restarts: int
    """Restarts summed over the pod's containers."""
    waiting: str
    """Why the first waiting container waits (``ImagePullBackOff``), "" when none does."""
    config_digest: str
    """The driver's install digest (:func:`components.driver.digest_in`), "" when none."""

    @property
    def uid(self) -> str:
        packed = self.packed_uid
        if isinstance(packed, str):
            return packed
        h = f"{packed:032x}"  # what str(uuid.UUID(int=packed)) writes, without its checks
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

    @property
    def resource_version(self) -> str:
        return str(self.packed_resource_version)

    @property
    def name(self) -> str:
        return self.key.rpartition("/")[2]

    @property
    def namespace(self) -> str:
        return self.key.rpartition("/")[0]

    @property
    def app(self) -> str:
        """Its DaemonSet's name (:func:`app_of` its labels), "" when it has none."""
        return app_of(self.labels)


def trim_pod(pod: Obj) -> PodRecord:
    """The :class:`PodRecord` of a pod as the API server sent it (or its :class:`PodShape`)."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    containers = status.get("containerStatuses") or []
    return PodRecord(
        key=key_of(pod),  # unique: interning would only add an entry to Python's table
        packed_uid=_pack_uid(str(meta.get("uid") or "")),
        packed_resource_version=_pack_version(str(meta.get("resourceVersion") or "")),
        created=sys.intern(str(meta.get("creationTimestamp") or "")),
        deleting=bool(meta.get("deletionTimestamp")),
        node=sys.intern(str(spec.get("nodeName") or "")),
        labels=shared(meta.get("labels") or {}),
        phase=sys.intern(str(status.get("phase") or "")),
        ready=any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions") or []
        ),
        restarts=sum(int(c.get("restartCount") or 0) for c in containers),
        waiting=next((w for w in map(_waiting, containers) if w), ""),
        config_digest=sys.intern(digest_in(spec)),
    )


def record_of_message(pod: Any) -> PodRecord:
    """:func:`trim_pod` of a ``Pod`` decoded from protobuf (:class:`gpuop.kube._pb_wire.
    PodCodec`'s ``build``): the same record from the message's fields, named as in JSON,
    without the dicts in between (a rollout's pods watch brings thousands of events;
    ``tests/unit/test_pb_wire.py`` holds the two equal on recorded frames)."""
    meta, spec, status = pod.metadata, pod.spec, pod.status
    namespace = meta.namespace
    containers = status.containerStatuses
    return PodRecord(
        key=f"{namespace}/{meta.name}" if namespace else meta.name,
        packed_uid=_pack_uid(meta.uid),
        packed_resource_version=_pack_version(meta.resourceVersion),
        created=sys.intern(
            rfc3339(meta.creationTimestamp.seconds) if meta.HasField("creationTimestamp") else ""
        ),
        deleting=meta.HasField("deletionTimestamp"),
        node=sys.intern(spec.nodeName),
        # Kubernetes writes a map's keys sorted; upb's map iteration has no order, and
        # shared label dicts are pooled by their order.
        labels=shared(dict(sorted(meta.labels.items())) if meta.labels else {}),
        phase=sys.intern(status.phase),
        ready=any(c.type == "Ready" and c.status == "True" for c in status.conditions),
        restarts=sum(c.restartCount for c in containers),
        waiting=next((w for w in (c.state.waiting.reason for c in containers) if w), ""),
        config_digest=sys.intern(
            next((v.value for c in spec.containers for v in c.env if _is_digest(v)), "")
        ),
    )


def _is_digest(var: Any) -> bool:
    return bool(var.name == DIGEST_ENV and var.value)


def same_pod(old: PodRecord, new: PodRecord) -> bool:
    """Are two versions of a pod the same record but for their resourceVersion? Then
    no reader can decide anything differently on the newer one."""
    return old == replace(new, packed_resource_version=old.packed_resource_version)


def _pack_uid(uid: str) -> int | str:
    """A canonical UUID (36 characters, lower-case hex, dashes at 8, 13, 18, 23) as its
    integer; anything else as it is (never altered). Checked by hand: two ``uuid.UUID``
    per pod event were a fiftieth of the operator's CPU in a rollout."""
    if len(uid) == 36 and uid[8] == uid[13] == uid[18] == uid[23] == "-":
        digits = uid.replace("-", "")
        if len(digits) == 32 and digits.isascii() and digits.isalnum() and digits == digits.lower():
            try:
                return int(digits, 16)
            except ValueError:  # a letter past f
                return uid
    return uid


def _pack_version(version: str) -> int | str:
    """A decimal resourceVersion as an integer; anything else (opaque) as it is."""
    if version.isascii() and version.isdigit() and str(int(version)) == version:
        return int(version)
    return version


def _waiting(status: Obj) -> str:
    return str(((status.get("state") or {}).get("waiting") or {}).get("reason") or "")


_META = ("name", "namespace", "uid", "resourceVersion", "creationTimestamp", "deletionTimestamp")
#: Metadata that repeats across thousands of objects, so it is interned; names,
#: uids and resourceVersions are unique and kept as they are.
_REPEATED = frozenset(("namespace", "creationTimestamp", "deletionTimestamp"))


def _identity(meta: Obj) -> Obj:
    return {k: shared(meta[k]) if k in _REPEATED else meta[k] for k in _META if k in meta}


def app_of(labels: Mapping[str, str]) -> str:
    """The DaemonSet an operand pod (or selector) names: its ``app`` label, or ``name``
    for the operands upstream selects by that (the VFIO and CC managers); "" for none."""
    return str(labels.get("app") or labels.get("name") or "")


def pod_app(pod: PodRecord) -> str:
    """The pod's DaemonSet name (:func:`app_of` its labels), "" when it has none."""
    return pod.app


def daemonset_app(ds: Obj) -> str:
    """What :func:`pod_app` says of the DaemonSet's pods: read from its selector."""
    return app_of(ds["spec"]["selector"]["matchLabels"])


DRIVER_COMPONENTS = ("nvidia-driver", "nvidia-vgpu-host-manager")
"""``app.kubernetes.io/component`` of the driver pods (ClusterPolicy and NVIDIADriver)."""


def is_driver_pod(pod: PodRecord) -> bool:
    """A pod of any driver DaemonSet we run (the ClusterPolicy's or an NVIDIADriver's)."""
    return pod.labels.get(COMPONENT_POD_LABEL) in DRIVER_COMPONENTS


def pod_index(pod: PodRecord) -> str | None:
    """Pods by node: the per-node rollout reads all of a node's pods, the upgrade code
    "the driver pod on node X" (:func:`pods_on`). One bucket per node, not per (node,
    app): a key tuple and a list per pod were a sixth of the pods cache."""
    return pod.node or None


def pods_on(cache: Informer[PodRecord], node: str, app: str) -> list[PodRecord]:
    """The pods of DaemonSet ``app`` on ``node`` (one, or two while one is replaced)."""
    return [p for p in cache.indexed(node) if p.app == app]


def trim_revision(rev: Obj) -> Obj:
    """A ControllerRevision without its ``data`` (a whole pod template), but with the
    driver config digest that template installs (``configDigest``, when it has one): the
    fleet pass checks that a driver DaemonSet's newest revision installs what its
    template does (``views.upgrade_inputs.revision_lags``)."""
    meta = rev.get("metadata") or {}
    trimmed: Obj = {
        "metadata": {
            **_identity(meta),
            "labels": shared(meta.get("labels") or {}),
            "ownerReferences": shared(meta.get("ownerReferences") or []),
        },
        "revision": rev.get("revision", 0),
    }
    digest = digest_in(template_spec(rev.get("data")))
    if digest:
        trimmed["configDigest"] = digest
    return trimmed


class PodSubset:
    """Some of the operand pods cache, kept up to date by its events (no watch of its
    own): the NVIDIADriver controller asks questions of every driver pod, and a second
    watch for them made the API server send, and this process parse and keep, each
    driver pod twice. ``version`` counts changes to the subset only, so answers
    memoised on it are not worked out again for every other operand pod's event."""

    def __init__(self, member: Callable[[PodRecord], bool]) -> None:
        self._member = member
        self._pods: dict[str, PodRecord] = {}
        self.version = 0

    def update(self, old: PodRecord | None, new: PodRecord | None) -> bool:
        """Follow one event of the pods cache; True when the pod is in the subset."""
        pod = new or old
        if pod is None or not self._member(pod):
            return False
        key = pod.key
        if new is None:
            self._pods.pop(key, None)
        else:
            self._pods[key] = new
        self.version += 1
        return True

    def values(self) -> list[PodRecord]:
        return list(self._pods.values())

    def nodes(self) -> set[str]:
        """The nodes the subset's pods are bound to (terminating ones too)."""
        return {p.node for p in self._pods.values() if p.node}


def pod_ready(pod: PodRecord) -> bool:
    return pod.phase == "Running" and pod.ready


def driver_pod_view(pod: PodRecord) -> DriverPodView:
    """The rulebook's view of a node's driver pod."""
    return DriverPodView(
        uid=pod.uid,
        revision_hash=pod.labels.get(DRIVER_REVISION_LABEL, ""),
        running=pod.phase == "Running",
        ready=pod_ready(pod),
        restart_count=pod.restarts,
        waiting_reason=pod.waiting,
        config_digest=pod.config_digest,
    )
