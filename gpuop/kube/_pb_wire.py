"""Kubernetes protobuf on the wire: envelopes, watch frames, and the pods codec.

Every protobuf body starts with the magic ``k8s\\x00`` and a ``runtime.Unknown``
naming the kind and holding its bytes. A watch (``;stream=watch``) is a series of
frames, each a 4-byte big-endian length and a ``metav1.WatchEvent`` whose object is
again such an envelope (a Pod; a Status for an ERROR). The codec turns what it decodes
into the dicts the JSON path builds for the same fields (the pods watch's
:class:`~gpuop.operator.controller.views.pod_records.PodShape`, less the env variables the transform
skips), so the cache's transform, and therefore the cache, cannot tell which wire an
object came by; or, given the cache's own builder (``PodCodec(build=...)``), straight
into the cache's record, which must equal the transform's of the JSON (the operand
pods watch: a rollout's thousands of events then build no dicts on the way).

The API server has no protobuf for custom resources; a watch cache that asks for
protobuf also accepts JSON (:data:`ACCEPT`) and decodes what it is answered
(:func:`is_protobuf`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import lru_cache
from typing import Any, Protocol

from google.protobuf.message import DecodeError

from components.driver import CONFIG_DIGEST_ENV as _DIGEST
from gpuop.kube import _pb_pod as pb

Obj = dict[str, Any]

MAGIC = b"k8s\x00"
PROTOBUF = "application/vnd.kubernetes.protobuf"
#: Protobuf first, JSON where the server has none (custom resources).
ACCEPT = f"{PROTOBUF}, application/json"
#: A frame larger than this is a broken stream, not a Pod (the API server's limit on
#: an object is 1.5 MiB in etcd; a watch event adds a few bytes).
MAX_FRAME = 64 << 20


class WireError(ValueError):
    """A body or frame that is not Kubernetes protobuf as this module knows it."""


class Codec(Protocol):
    """Decodes one kind's protobuf into the dicts its JSON decoder would build, or into
    the cache's records (which the informer keeps without its transform)."""

    def event(self, frame: bytes) -> Obj: ...
    def page(self, body: bytes) -> Obj: ...


def is_protobuf(content_type: str | None) -> bool:
    """Did the server answer protobuf (``...protobuf`` or ``...protobuf;stream=watch``)?"""
    return bool(content_type) and str(content_type).split(";", 1)[0].strip() == PROTOBUF


def unwrap(data: bytes) -> tuple[str, bytes]:
    """The kind and the raw message of an envelope (magic + ``runtime.Unknown``)."""
    if not data.startswith(MAGIC):
        raise WireError("not a Kubernetes protobuf object (no k8s\\x00 prefix)")
    unknown = pb.Unknown.FromString(data[len(MAGIC) :])
    return str(unknown.typeMeta.kind), bytes(unknown.raw)


class Frames:
    """Splits a watch stream's bytes, in whatever chunks they come, into whole frames:
    a chunk read at once holds many (the informer reads a busy watch in batches)."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """The frames ``data`` completes, in order; a partial one is kept for the next."""
        buffer = self._buffer
        buffer += data
        frames: list[bytes] = []
        at, size = 0, len(buffer)
        while size - at >= 4:
            length = int.from_bytes(buffer[at : at + 4], "big")
            if length > MAX_FRAME:
                raise WireError(f"watch frame of {length} bytes")
            end = at + 4 + length
            if end > size:
                break
            frames.append(bytes(buffer[at + 4 : end]))
            at = end
        if at:
            del buffer[:at]
        return frames

    def end(self) -> None:
        """The stream ended: only at a frame's boundary is that a clean end."""
        if self._buffer:
            raise WireError("watch stream ended inside a frame")


@lru_cache(maxsize=4096)
def rfc3339(seconds: int) -> str:
    """``metav1.Time`` as its JSON is written: UTC, whole seconds."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def _status(raw: bytes) -> Obj:
    status = pb.Status.FromString(raw)
    return {
        "kind": "Status",
        "status": status.status,
        "message": status.message,
        "reason": status.reason,
        "code": status.code,
    }


def error_text(data: bytes) -> str:
    """An error body the server wrote as protobuf (a Status), in words for a log."""
    try:
        kind, raw = unwrap(data)
        if kind == "Status":
            status = _status(raw)
            return f"{status['code']} {status['reason']}: {status['message']}"
    except (WireError, DecodeError):
        pass
    return data.decode(errors="replace")


def _pod(pod: Any) -> Obj:
    """The :class:`PodShape` dict of a decoded ``Pod``: the fields it lists, as the JSON
    decoder gives them (empty ones left out, as Kubernetes' JSON leaves them out)."""
    m = pod.metadata
    meta: Obj = {}
    for name in ("name", "namespace", "uid", "resourceVersion"):
        value = getattr(m, name)
        if value:
            meta[name] = value
    if m.HasField("creationTimestamp"):
        meta["creationTimestamp"] = rfc3339(m.creationTimestamp.seconds)
    if m.HasField("deletionTimestamp"):
        meta["deletionTimestamp"] = rfc3339(m.deletionTimestamp.seconds)
    if m.labels:
        # Kubernetes writes a map's keys sorted, in JSON and protobuf alike; upb's map
        # iteration has no order, and shared label dicts are pooled by their order.
        meta["labels"] = dict(sorted(m.labels.items()))
    shaped: Obj = {"metadata": meta}
    if pod.HasField("spec"):
        s = pod.spec
        spec: Obj = {}
        if s.nodeName:
            spec["nodeName"] = s.nodeName
        if s.containers:
            # Of the env the cache reads only the install digest (``digest_in``): the
            # other variables are left out, which changes no record and saves a third.
            spec["containers"] = [
                {"env": [{"name": v.name, "value": v.value} for v in c.env if v.name == _DIGEST]}
                for c in s.containers
            ]
        shaped["spec"] = spec
    if pod.HasField("status"):
        st = pod.status
        status: Obj = {}
        if st.phase:
            status["phase"] = st.phase
        if st.conditions:
            status["conditions"] = [{"type": c.type, "status": c.status} for c in st.conditions]
        if st.containerStatuses:
            status["containerStatuses"] = [_container(c) for c in st.containerStatuses]
        shaped["status"] = status
    return shaped


def _container(c: Any) -> Obj:
    out: Obj = {"restartCount": c.restartCount}
    if c.state.HasField("waiting"):
        out["state"] = {"waiting": {"reason": c.state.waiting.reason}}
    return out


class PodCodec:
    """Pods watch events and ``PodList`` pages, decoded into :class:`PodShape` dicts, or
    by ``build`` (given the decoded ``Pod`` message, whose fields are named as in JSON)
    into the cache's record, which the informer then keeps as it is. A BOOKMARK's pod
    and an ERROR's Status stay dicts: they are read for their version and code only."""

    def __init__(self, build: Callable[[Any], Any] | None = None) -> None:
        self._build = build or _pod

    def event(self, frame: bytes) -> Obj:
        """One ``WatchEvent`` frame: ``{"type", "object"}``; an ERROR's object is its Status."""
        event = pb.WatchEvent.FromString(frame)
        kind, raw = unwrap(bytes(event.object.raw))
        if kind == "Status":
            return {"type": event.type, "object": _status(raw)}
        pod = pb.Pod.FromString(raw)
        build = _pod if event.type == "BOOKMARK" else self._build
        return {"type": event.type, "object": build(pod)}

    def page(self, body: bytes) -> Obj:
        """One LIST response: ``{"metadata": {resourceVersion, continue}, "items"}``."""
        kind, raw = unwrap(body)
        if kind != "PodList":
            raise WireError(f"expected a PodList, got {kind or 'no kind'}")
        pods = pb.PodList.FromString(raw)
        meta: Obj = {"resourceVersion": pods.metadata.resourceVersion}
        cont = getattr(pods.metadata, "continue")  # a Python keyword
        if cont:
            meta["continue"] = cont
        build = self._build
        return {"metadata": meta, "items": [build(p) for p in pods.items]}


#: The pods watch's codec into dicts (stateless: one is enough).
POD_CODEC = PodCodec()
