"""Watch caches: list once, then watch from the list's resourceVersion.

Modelled on client-go's reflector and kopf's watch loop: bookmarks keep the
resourceVersion fresh, a 410 Gone (history compacted) triggers a relist, and a
stream silent for longer than the bookmark interval is reconnected. Objects are
kept as plain dicts, trimmed by a per-resource transform (``managedFields`` and
whatever the operator never reads), or, for the most numerous kind (operand pods),
as a slotted :class:`Record` of the fields read, so memory stays flat as the fleet
grows. A kind with a codec (operand pods, :mod:`gpuop.kube._pb_wire`) is listed and watched
as Kubernetes protobuf, decoding only those fields (straight into its records when the
codec builds them), with JSON where the server has no protobuf; and an event that
changes nothing the record keeps (``ResourceSpec.unchanged``) updates the cache without
reaching the handler, so it wakes no pass.

The cache is monotonic per object. Two sources write it: the watch, and
``observe()`` with what our own writes returned; without ordering, a watch event
older than our patch put a node back to ``upgrade-required`` after its slot was
released, and a write answered after the watch deleted the object re-inserted a
ghost. ResourceVersions are opaque by API contract, but every etcd3-backed server
(all we target) hands out the etcd revision, an integer: when both versions parse
as integers they are compared, otherwise the newest arrival wins (the old,
unordered behaviour, never worse). Deletions leave a tombstone (uid and the
deletion's resourceVersion, or the list's for one found by a relist) for
``TOMBSTONE_SECONDS``, longer than any request may take
(``gpuop.kube.rest.REQUEST_TIMEOUT``), so a write answered before the delete cannot
bring the object back. Tombstones only filter ``observe()``: the watch itself is
ordered, and with a label selector it reports DELETED for an object that merely
stopped matching, which may come back.

Failed list and watch attempts back off (``gpuop.kube.backoff``); ``unavailable_for()``
says how long the informer has been unable to list or watch, for ``/healthz``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException
from typing_extensions import TypeVar

from gpuop.kube._pb_wire import ACCEPT, Codec, Frames, error_text, is_protobuf
from gpuop.kube.backoff import Backoff, Retry
from gpuop.kube.shapes import Decoder
from gpuop.log import get_logger

log = get_logger(__name__)

Obj = dict[str, Any]


class Record(Protocol):
    """A cache entry that is not a dict
    (:class:`gpuop.operator.controller.views.pod_records.PodRecord`): a
    projection kept for a big, numerous kind, naming what the cache itself reads."""

    @property
    def key(self) -> str: ...
    @property
    def uid(self) -> str: ...
    @property
    def resource_version(self) -> str: ...


#: What a cache holds: trimmed dicts (the default), or a :class:`Record`.
T = TypeVar("T", bound="Obj | Record", default=Obj)
#: ``(event_type, old, new)``: ADDED has no old, DELETED has no new.
Handler = Callable[[str, T | None, T | None], None]
ListCall = Callable[..., Awaitable[Any]]

#: The API server sends a bookmark about once a minute; silence well past that
#: means a dead connection the TCP stack has not noticed.
SILENCE_SECONDS = 90.0
#: How long the server keeps one watch open (drawn per watch, so caches do not all
#: reconnect at once). Each reopen is a request; at 30-60 min an idle operator makes
#: none for half an hour, where client-go's 5-10 min would cost every watch a request
#: every few minutes. Dead connections are the silence check's job, not this one's.
WATCH_TIMEOUT_SECONDS = (1800, 3600)
#: Failed lists and watch connections: 0.5 s doubling to 30 s (client-go: 0.8 s to 30 s).
RETRY = Backoff(0.5, 30.0)
#: The most a protobuf watch reads at once (whatever is buffered, up to this).
READ_CHUNK = 1 << 20
#: How long a deletion is remembered against late answers to our own writes.
TOMBSTONE_SECONDS = 300.0


def key_of(obj: Obj | Record) -> str:
    if not isinstance(obj, dict):
        return obj.key
    meta = obj.get("metadata", {})
    ns = meta.get("namespace")
    return f"{ns}/{meta['name']}" if ns else str(meta["name"])


def strip_managed_fields(obj: Obj) -> Obj:
    obj.get("metadata", {}).pop("managedFields", None)
    return obj


class GoneError(Exception):
    """The resourceVersion we hold is older than the server's history: relist."""


class RelistRequested(GoneError):
    """A reader changed what the transform keeps (:meth:`Informer.request_relist`)."""


@dataclass
class ResourceSpec(Generic[T]):
    """What to watch: a list call (which also watches with ``watch=True``) and options."""

    name: str
    list_call: ListCall
    label_selector: str | None = None
    field_selector: str | None = None
    #: What is kept of each object: a dict, or a :class:`Record` (then ``T`` says which).
    transform: Callable[[Obj], T] = strip_managed_fields  # type: ignore[assignment]
    #: Secondary index (e.g. pods by node): a key per object, or None for none.
    index: Callable[[T], Any] | None = None
    #: Items per LIST page. A page is parsed whole before it is trimmed, so for a
    #: big, heavily trimmed kind (pods) smaller pages lower the startup peak.
    page_size: int = 500
    #: Record which index keys changed, for ``Informer.index_changes`` (opt-in: a set
    #: nobody drains would grow with every key ever seen).
    track_index_changes: bool = False
    #: The fields ``transform`` reads, as a ``TypedDict`` (see :mod:`gpuop.kube.shapes`):
    #: watch events and LIST pages are then parsed into those fields only, so the rest
    #: of a big object (managedFields, the pod spec) is never built in Python. None:
    #: parse whole objects.
    shape: Any = None
    #: A 404 (the kind is not served: its CRD is not installed) counts as listed and
    #: empty, for a kind whose absence is an answer readers need (no GPUCluster can
    #: exist without its CRD): without it the cache never lists and whoever waits for
    #: it waits for ever. The list is still retried with the capped backoff, so a CRD
    #: installed later is picked up. Off: a 404 is a failure like any other.
    absent_is_empty: bool = False
    #: Decodes the kind's Kubernetes protobuf (:mod:`gpuop.kube._pb_wire`): lists and
    #: watches then ask for protobuf, and take JSON where the server answers that.
    #: None: JSON only.
    codec: Codec | None = None
    #: Is the new version of an object the same as the cached one for every reader?
    #: A MODIFIED event (or a relist) that changes nothing they read then replaces the
    #: cached object without telling the handler, so it wakes no pass (the cache still
    #: holds the newest version, so resourceVersion order is kept). None: every change
    #: is told.
    unchanged: Callable[[T, T], bool] | None = None
    #: A protobuf watch is read in batches: after the frames at hand, its connection
    #: stops handing on data for this long, so what arrives meanwhile is decrypted,
    #: parsed and handled together rather than one socket wake-up, TLS read and parser
    #: call per event (a rollout's pods watch carries thousands). Each event waits at
    #: most this long more; an idle watch pauses only after an event. 0: read each
    #: frame as it comes.
    batch_seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


class Informer(Generic[T]):
    """One resource's cache, kept current by a watch; calls ``handler`` on changes."""

    def __init__(
        self,
        spec: ResourceSpec[T],
        handler: Handler[T],
        silence: float = SILENCE_SECONDS,
        retry: Backoff = RETRY,
    ) -> None:
        self.spec = spec
        self.handler = handler
        self._decode = Decoder(spec.shape)
        self.silence = silence
        self.store: dict[str, T] = {}
        self._index: dict[Any, list[T]] = {}
        #: Index keys whose bucket changed since the last ``index_changes()``: lets a
        #: reader redo only what changed (the per-node rollout view, pods by node).
        self._index_changed: set[Any] = set()
        #: key -> (uid, deletion resourceVersion, monotonic time), oldest first.
        self._tombstones: OrderedDict[str, tuple[str, str, float]] = OrderedDict()
        self._retry = Retry(retry)
        #: Monotonic time of the first failure since the last good list or watch.
        self._failing_since: float | None = None
        self.synced = asyncio.Event()
        self.resource_version = ""
        self.relists = 0
        self.reconnects = 0
        #: Bumped whenever the store changes: readers memoise what they derive from
        #: the whole store (the GPU nodes, say) and redo it only after a change.
        self.version = 0
        self._relist_wanted = False
        self._stream: aiohttp.ClientResponse | None = None
        #: The kind is not served (``absent_is_empty``): said once in the log, until it is.
        self._not_served = False
        #: Watch events received (bookmarks not counted), and those of them that the
        #: cache took without telling the handler (``ResourceSpec.unchanged``).
        self.events = 0
        self.unchanged = 0

    # ----------------------------------------------------------- public
    def get(self, key: str) -> T | None:
        return self.store.get(key)

    def values(self) -> list[T]:
        return list(self.store.values())

    def indexed(self, value: Any) -> list[T]:
        """Objects whose index key is ``value`` (O(1), not a scan of the store)."""
        return list(self._index.get(value, ()))

    def index_changes(self) -> set[Any]:
        """Index keys whose objects changed (put, replaced or dropped, by the watch, a
        relist or :meth:`observe`) since the last call; the set is then started anew.
        Only one reader may use it: a second would miss what the first took."""
        changed, self._index_changed = self._index_changed, set()
        return changed

    def unavailable_for(self, now: float | None = None) -> float:
        """Seconds this informer has been unable to list or watch (0 while it can)."""
        if self._failing_since is None:
            return 0.0
        return (time.monotonic() if now is None else now) - self._failing_since

    def request_relist(self) -> None:
        """List again as soon as possible: the transform now keeps something it dropped
        (a node label a new selector reads), which only a fresh list brings back. The
        open watch stream is closed, so the loop notices at once."""
        self._relist_wanted = True
        if self._stream is not None:
            self._stream.close()

    def observe(self, raw: Obj) -> None:
        """Store what a write of ours returned, so the next pass does not act on the
        stale copy and write the same thing again. Never replaces a newer version and
        never brings back an object the watch has deleted; the watch event that
        follows finds nothing changed."""
        obj = self.spec.transform(raw)
        key = key_of(obj)
        if self._is_dead(key, obj):
            return
        current = self.store.get(key)
        if current is None or not _older(obj, current):
            self._put(key, obj)

    async def run(self) -> None:
        """List and watch forever; transient failures back off and retry."""
        while True:
            try:
                await self._list()
                await self._watch()
            except asyncio.CancelledError:
                raise
            except RelistRequested:
                log.info("relisting on request", resource=self.spec.name)
                continue
            except GoneError:
                log.info("watch expired, relisting", resource=self.spec.name)
                continue
            except Exception as err:  # any failure: log, back off, relist
                if self.spec.absent_is_empty and _is_not_found(err):
                    await asyncio.sleep(self._absent())
                    continue
                delay = self._failed()
                log.warning(
                    "watch failed, relisting",
                    resource=self.spec.name,
                    error=f"{type(err).__name__}: {err}",
                    retry_in=round(delay, 2),
                )
                await asyncio.sleep(delay)

    # ------------------------------------------------------------ internals
    def _put(self, key: str, obj: T) -> None:
        self._drop(key)
        self.store[key] = obj
        self.version += 1
        if self.spec.index is not None:
            ikey = self.spec.index(obj)
            if ikey is not None:
                self._index.setdefault(ikey, []).append(obj)
                if self.spec.track_index_changes:
                    self._index_changed.add(ikey)

    def _drop(self, key: str) -> T | None:
        old = self.store.pop(key, None)
        if old is not None:
            self.version += 1
        if old is not None and self.spec.index is not None:
            ikey = self.spec.index(old)
            bucket = self._index.get(ikey)
            if bucket is not None:
                if self.spec.track_index_changes:
                    self._index_changed.add(ikey)
                # Buckets hold a few objects (a node's operand pods), so a list
                # rather than a dict; removal is by identity.
                bucket[:] = [o for o in bucket if o is not old]
                if not bucket:
                    del self._index[ikey]
        return old

    def _same(self, before: T, after: T) -> bool:
        """Does ``after`` change nothing a reader reads of ``before`` (same object)?"""
        same = self.spec.unchanged
        return same is not None and same(before, after) and _uid(before) == _uid(after)

    def _swap(self, key: str, old: T, new: T) -> None:
        """Hold ``new`` instead of ``old``, silently: readers see no change (no
        ``version`` bump, no index change); only its resourceVersion is newer. It moves
        to the end of the store and of its index bucket, as ``_put`` would move it."""
        del self.store[key]
        self.store[key] = new
        if self.spec.index is not None:
            bucket = self._index.get(self.spec.index(old))
            if bucket is not None:
                bucket[:] = [o for o in bucket if o is not old]
                bucket.append(new)

    def _bury(self, key: str, uid: str, rv: str) -> None:
        """Remember that ``key`` was gone at ``rv``; forget tombstones older than
        ``TOMBSTONE_SECONDS``."""
        now = time.monotonic()
        self._tombstones.pop(key, None)
        self._tombstones[key] = (uid, rv, now)
        while self._tombstones:
            oldest = next(iter(self._tombstones.values()))
            if now - oldest[2] <= TOMBSTONE_SECONDS:
                break
            self._tombstones.popitem(last=False)

    def _is_dead(self, key: str, obj: T) -> bool:
        """Is ``obj`` a version from before the deletion the watch reported?

        By version when they order; else by uid (a deleted uid never comes back;
        a watch with a label selector also reports DELETED when an object merely
        stops matching, and the watch's later ADDED is never checked here)."""
        tomb = self._tombstones.get(key)
        if tomb is None:
            return False
        uid, rv, _ = tomb
        order = _rv_cmp(_rv(obj), rv)
        if order is not None:
            return order <= 0
        return bool(uid) and _uid(obj) == uid

    def _ok(self) -> None:
        self._retry.succeeded()
        self._failing_since = None

    def _failed(self) -> float:
        if self._failing_since is None:
            self._failing_since = time.monotonic()
        return self._retry.failed()

    def _selectors(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = dict(self.spec.extra)
        if self.spec.label_selector:
            kwargs["label_selector"] = self.spec.label_selector
        if self.spec.field_selector:
            kwargs["field_selector"] = self.spec.field_selector
        return kwargs

    async def _list(self) -> None:
        items: dict[str, T] = {}
        cont: str | None = None
        while True:
            kwargs = self._selectors()
            kwargs["limit"] = self.spec.page_size
            if cont:
                kwargs["_continue"] = cont
            if self.spec.codec is not None:
                kwargs["_accept"] = ACCEPT
            resp = await self.spec.list_call(_preload_content=False, **kwargs)
            data = await _read_body(resp)
            codec = self._codec(resp)
            body = codec.page(data) if codec is not None else self._decode.page(data)
            for raw in body.get("items") or []:
                obj = self.spec.transform(raw) if isinstance(raw, dict) else raw
                items[key_of(obj)] = obj
            meta = body.get("metadata") or {}
            cont = meta.get("continue")
            if not cont:
                self.resource_version = str(meta.get("resourceVersion", ""))
                break
        self._ok()
        self.relists += 1
        if self._not_served:
            self._not_served = False
            log.info("resource served now", resource=self.spec.name)
        self._replace(items)

    def _absent(self) -> float:
        """The kind is not served: the cache holds none (what it held is reported
        deleted) and has listed, so readers know there are none rather than waiting.
        Not a failure for ``/healthz`` (a cluster may well lack an optional CRD); the
        retry backs off as a failure's does. Returns the delay before listing again."""
        if not self._not_served:
            self._not_served = True
            log.warning(
                "resource not served (its CRD is not installed): counted as none",
                resource=self.spec.name,
            )
        self._failing_since = None
        self.resource_version = ""
        self._replace({})
        return self._retry.failed()

    def _replace(self, items: dict[str, T]) -> None:
        """Make ``items`` (a list's result) the store, telling the handler what changed,
        and mark the cache listed."""
        old = self.store
        # What our writes returned while the list was read may be newer than the
        # snapshot (and objects we created may be missing from it): keep those. The
        # watch from the list's version delivers them, or their deletion, in order.
        for key, held in old.items():
            listed = items.get(key)
            if listed is None:
                if (_rv_cmp(_rv(held), self.resource_version) or 0) > 0:
                    items[key] = held
            elif _older(listed, held):
                items[key] = held
        self.store = {}
        self.version += 1
        if self.spec.track_index_changes:
            self._index_changed.update(self._index)  # what the relist dropped, too
        self._index = {}
        for key, obj in items.items():
            self._put(key, obj)
        for key, obj in items.items():
            before = old.get(key)
            if before is None:
                self.handler("ADDED", None, obj)
            elif (_rv(before) != _rv(obj) or before != obj) and not self._same(before, obj):
                # The same version kept differently is news too: a relist asked for
                # because the transform now keeps more (``request_relist``).
                self.handler("MODIFIED", before, obj)
        for key, before in old.items():
            if key not in items:
                # Gone at the list's version; when exactly is unknown.
                self._bury(key, _uid(before), self.resource_version)
                self.handler("DELETED", before, None)
        self.synced.set()

    async def _watch(self) -> None:
        """Watch until the server's history no longer has our version (GoneError).

        A stream the server ends, or one silent past ``silence``, is reopened at once;
        a connection that fails before the server answers backs off, so an
        unreachable API server costs a few attempts a minute, not thousands a second.
        """
        while True:
            if self._relist_wanted:
                self._relist_wanted = False
                raise RelistRequested()
            kwargs = self._selectors()
            if self.spec.codec is not None:
                kwargs["_accept"] = ACCEPT
            kwargs.update(
                watch=True,
                resource_version=self.resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=random.randint(*WATCH_TIMEOUT_SECONDS),
                _request_timeout=aiohttp.ClientTimeout(
                    connect=10, sock_connect=10, sock_read=self.silence
                ),
            )
            answered = False
            try:
                resp = await self.spec.list_call(_preload_content=False, **kwargs)
                if resp.status == 410:
                    raise GoneError()
                if resp.status != 200:
                    await _read_json(resp)  # raises with the server's message
                answered = True
                self._ok()
                self._stream = resp
                codec = self._codec(resp)
                try:
                    async with resp:
                        if codec is not None:
                            await self._read_frames(resp, codec)
                        else:
                            await self._read_lines(resp)
                finally:
                    self._stream = None
            except (TimeoutError, aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as err:
                if self._relist_wanted:
                    continue  # our own close (request_relist): list again at the loop's top
                self.reconnects += 1
                if answered:
                    log.debug("watch reconnect", resource=self.spec.name, reason=type(err).__name__)
                    continue
                delay = self._failed()
                log.warning(
                    "watch connection failed",
                    resource=self.spec.name,
                    error=f"{type(err).__name__}: {err}",
                    retry_in=round(delay, 2),
                )
                await asyncio.sleep(delay)

    async def _read_lines(self, resp: Any) -> None:
        """Handle a JSON watch's lines until the server ends it (then the caller
        reconnects from our version) or a relist is asked for."""
        while not self._relist_wanted:
            line = await resp.content.readline()
            if not line:
                return
            self._on_line(line)

    async def _read_frames(self, resp: Any, codec: Codec) -> None:
        """Handle a protobuf watch's frames until the server ends it (then the caller
        reconnects from our version) or a relist is asked for; in batches when the
        spec says so (``ResourceSpec.batch_seconds``)."""
        frames = Frames()
        while not self._relist_wanted:
            chunk = await resp.content.read(READ_CHUNK)
            if not chunk:
                frames.end()
                return
            for frame in frames.feed(chunk):
                self._on_event(codec.event(frame))
            if self.spec.batch_seconds > 0:
                await _gather(resp, self.spec.batch_seconds)

    def _codec(self, resp: Any) -> Codec | None:
        """The spec's codec when the server answered protobuf; None for JSON."""
        if self.spec.codec is None:
            return None
        return self.spec.codec if is_protobuf(resp.headers.get("Content-Type")) else None

    def _on_line(self, line: bytes) -> None:
        self._on_event(self._decode.event(line))

    def _on_event(self, event: Obj) -> None:
        kind = event.get("type")
        raw: Any = event.get("object") or {}
        if kind == "ERROR":
            code = raw.get("code")
            if code == 410:
                raise GoneError()
            raise ApiException(status=code or 500, reason=str(raw.get("message", raw)))
        # A codec may hand the cache's record itself (``PodCodec(build=...)``).
        built = not isinstance(raw, dict)
        rv = _rv(raw) if built else (raw.get("metadata") or {}).get("resourceVersion")
        if kind == "BOOKMARK":
            if rv:
                self.resource_version = str(rv)
            return
        self.events += 1
        obj = raw if built else self.spec.transform(raw)
        key = key_of(obj)
        if rv:
            self.resource_version = str(rv)
        before = self.store.get(key)
        if kind == "DELETED":
            self._bury(key, _uid(obj), _rv(obj))
            if before is not None and _uid(before) != _uid(obj) and _older(obj, before):
                return  # we already hold a newer object of that name (created since)
            if self._drop(key) is not None:
                self.handler("DELETED", before, None)
            return
        # The watch is ordered: after a DELETED, an ADDED is a newer object.
        if before is not None and (_rv(before) == _rv(obj) or _older(obj, before)):
            return  # our own write already put this version, or a newer one, here
        if before is not None and self._same(before, obj):
            self._swap(key, before, obj)
            self.unchanged += 1
            return
        self._put(key, obj)
        self.handler("ADDED" if before is None else "MODIFIED", before, obj)


async def _gather(resp: Any, seconds: float) -> None:
    """Let a stream's next bytes gather for ``seconds``: its transport hands nothing
    on meanwhile (TLS keeps the encrypted bytes as they come, the kernel the rest), and
    a relist's close of the stream still ends the wait's next read."""
    transport = getattr(resp.connection, "transport", None)
    if transport is None:
        return
    transport.pause_reading()
    try:
        await asyncio.sleep(seconds)
    finally:
        transport.resume_reading()


def _rv_cmp(a: str, b: str) -> int | None:
    """Order two resourceVersions when both are integers (etcd revisions), else None."""
    try:
        x, y = int(a), int(b)
    except ValueError:
        return None
    return (x > y) - (x < y)


def _older(obj: Any, than: Any) -> bool:
    """Is ``obj`` a strictly older version than ``than``? False when they cannot be ordered."""
    return (_rv_cmp(_rv(obj), _rv(than)) or 0) < 0


def _rv(obj: Obj | Record) -> str:
    if not isinstance(obj, dict):
        return obj.resource_version
    return str(obj.get("metadata", {}).get("resourceVersion") or "")


def _uid(obj: Obj | Record) -> str:
    if not isinstance(obj, dict):
        return obj.uid
    return str(obj.get("metadata", {}).get("uid") or "")


async def _read_body(resp: Any) -> bytes:
    """Read a whole response; raise ``ApiException`` with the server's words on errors."""
    try:
        data: bytes = await resp.read()
    finally:
        with contextlib.suppress(Exception):
            resp.release()
    if resp.status == 410:
        raise GoneError()
    if not 200 <= resp.status <= 299:
        protobuf = is_protobuf(getattr(resp, "headers", {}).get("Content-Type"))
        reason = error_text(data) if protobuf else data.decode(errors="replace")
        raise ApiException(status=resp.status, reason=reason[:500])
    return data


async def _read_json(resp: Any) -> Obj:
    parsed: Obj = json.loads(await _read_body(resp))
    return parsed


def _is_not_found(err: Exception) -> bool:
    """A 404 from a list or a watch: the kind itself is not served (a collection that
    is served answers an empty list, never 404)."""
    return isinstance(err, ApiException) and err.status == 404
