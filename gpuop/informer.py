"""Watch caches: list once, then watch from the list's resourceVersion.

Modelled on client-go's reflector and kopf's watch loop: bookmarks keep the
resourceVersion fresh, a 410 Gone (history compacted) triggers a relist, and a
stream silent for longer than the bookmark interval is reconnected. Objects are
kept as plain dicts, trimmed by a per-resource transform (``managedFields`` and
whatever the operator never reads), so memory stays flat as the fleet grows.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException

from gpuop.log import get_logger

log = get_logger(__name__)

Obj = dict[str, Any]
#: ``(event_type, old, new)``: ADDED has no old, DELETED has no new.
Handler = Callable[[str, Obj | None, Obj | None], None]
ListCall = Callable[..., Awaitable[Any]]

#: The API server sends a bookmark about once a minute; silence well past that
#: means a dead connection the TCP stack has not noticed.
SILENCE_SECONDS = 90.0
_MAX_BACKOFF = 30.0


def key_of(obj: Obj) -> str:
    meta = obj.get("metadata", {})
    ns = meta.get("namespace")
    return f"{ns}/{meta['name']}" if ns else str(meta["name"])


def strip_managed_fields(obj: Obj) -> Obj:
    obj.get("metadata", {}).pop("managedFields", None)
    return obj


class GoneError(Exception):
    """The resourceVersion we hold is older than the server's history: relist."""


@dataclass
class ResourceSpec:
    """What to watch: a list call (which also watches with ``watch=True``) and options."""

    name: str
    list_call: ListCall
    label_selector: str | None = None
    field_selector: str | None = None
    transform: Callable[[Obj], Obj] = strip_managed_fields
    #: Secondary index (e.g. pods by node): a key per object, or None for none.
    index: Callable[[Obj], Any] | None = None
    #: Items per LIST page. A page is parsed whole before it is trimmed, so for a
    #: big, heavily trimmed kind (pods) smaller pages lower the startup peak.
    page_size: int = 500
    extra: dict[str, Any] = field(default_factory=dict)


class Informer:
    """One resource's cache, kept current by a watch; calls ``handler`` on changes."""

    def __init__(
        self, spec: ResourceSpec, handler: Handler, silence: float = SILENCE_SECONDS
    ) -> None:
        self.spec = spec
        self.handler = handler
        self.silence = silence
        self.store: dict[str, Obj] = {}
        self._index: dict[Any, list[Obj]] = {}
        self.synced = asyncio.Event()
        self.resource_version = ""
        self.relists = 0
        self.reconnects = 0

    # ----------------------------------------------------------- public
    def get(self, key: str) -> Obj | None:
        return self.store.get(key)

    def values(self) -> list[Obj]:
        return list(self.store.values())

    def indexed(self, value: Any) -> list[Obj]:
        """Objects whose index key is ``value`` (O(1), not a scan of the store)."""
        return list(self._index.get(value, ()))

    def _put(self, key: str, obj: Obj) -> None:
        self._drop(key)
        self.store[key] = obj
        if self.spec.index is not None:
            ikey = self.spec.index(obj)
            if ikey is not None:
                self._index.setdefault(ikey, []).append(obj)

    def _drop(self, key: str) -> Obj | None:
        old = self.store.pop(key, None)
        if old is not None and self.spec.index is not None:
            ikey = self.spec.index(old)
            bucket = self._index.get(ikey)
            if bucket is not None:
                # Buckets hold one or two objects (a pod per node and app), so a
                # list (64 bytes) rather than a dict (184); removal is by identity.
                bucket[:] = [o for o in bucket if o is not old]
                if not bucket:
                    del self._index[ikey]
        return old

    def observe(self, raw: Obj) -> None:
        """Store what a write of ours returned, so the next pass does not act on the
        stale copy and write the same thing again. Older versions never overwrite newer
        ones; the watch event that follows finds nothing changed."""
        obj = self.spec.transform(raw)
        key = key_of(obj)
        current = self.store.get(key)
        if current is None or _rv_int(obj) >= _rv_int(current):
            self._put(key, obj)

    async def run(self) -> None:
        """List and watch forever; transient failures back off and retry."""
        backoff = 0.5
        while True:
            try:
                await self._list()
                backoff = 0.5
                await self._watch()
            except asyncio.CancelledError:
                raise
            except GoneError:
                log.info("watch expired, relisting", resource=self.spec.name)
                continue
            except Exception as err:  # any failure: log, back off, relist
                log.warning(
                    "watch failed, relisting",
                    resource=self.spec.name,
                    error=f"{type(err).__name__}: {err}",
                    retry_in=backoff,
                )
                await asyncio.sleep(backoff)
                backoff = min(_MAX_BACKOFF, backoff * 2)

    # ------------------------------------------------------------ internals
    def _selectors(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = dict(self.spec.extra)
        if self.spec.label_selector:
            kwargs["label_selector"] = self.spec.label_selector
        if self.spec.field_selector:
            kwargs["field_selector"] = self.spec.field_selector
        return kwargs

    async def _list(self) -> None:
        items: dict[str, Obj] = {}
        cont: str | None = None
        while True:
            kwargs = self._selectors()
            kwargs["limit"] = self.spec.page_size
            if cont:
                kwargs["_continue"] = cont
            resp = await self.spec.list_call(_preload_content=False, **kwargs)
            body = await _read_json(resp)
            for raw in body.get("items") or []:
                obj = self.spec.transform(raw)
                items[key_of(obj)] = obj
            meta = body.get("metadata") or {}
            cont = meta.get("continue")
            if not cont:
                self.resource_version = str(meta.get("resourceVersion", ""))
                break
        self.relists += 1
        old = self.store
        self.store = {}
        self._index = {}
        for key, obj in items.items():
            self._put(key, obj)
        for key, obj in items.items():
            before = old.get(key)
            if before is None:
                self.handler("ADDED", None, obj)
            elif _rv(before) != _rv(obj):
                self.handler("MODIFIED", before, obj)
        for key, before in old.items():
            if key not in items:
                self.handler("DELETED", before, None)
        self.synced.set()

    async def _watch(self) -> None:
        """Watch until the server's history no longer has our version (GoneError)."""
        while True:
            kwargs = self._selectors()
            kwargs.update(
                watch=True,
                resource_version=self.resource_version,
                allow_watch_bookmarks=True,
                # Server-side end of each watch, staggered so caches do not all
                # reconnect at once; the client side detects silence.
                timeout_seconds=random.randint(240, 360),
                _request_timeout=aiohttp.ClientTimeout(
                    connect=10, sock_connect=10, sock_read=self.silence
                ),
            )
            try:
                resp = await self.spec.list_call(_preload_content=False, **kwargs)
                if resp.status == 410:
                    raise GoneError()
                if resp.status != 200:
                    await _read_json(resp)  # raises with the server's message
                async with resp:
                    while True:
                        line = await resp.content.readline()
                        if not line:
                            break  # server ended the watch: reconnect from our version
                        self._on_line(line)
            except (TimeoutError, aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as err:
                self.reconnects += 1
                log.debug("watch reconnect", resource=self.spec.name, reason=type(err).__name__)

    def _on_line(self, line: bytes) -> None:
        event = json.loads(line)
        kind = event.get("type")
        raw: Obj = event.get("object") or {}
        if kind == "ERROR":
            code = raw.get("code")
            if code == 410:
                raise GoneError()
            raise ApiException(status=code or 500, reason=str(raw.get("message", raw)))
        rv = (raw.get("metadata") or {}).get("resourceVersion")
        if kind == "BOOKMARK":
            if rv:
                self.resource_version = str(rv)
            return
        obj = self.spec.transform(raw)
        key = key_of(obj)
        if rv:
            self.resource_version = str(rv)
        if kind == "DELETED":
            before = self._drop(key)
            self.handler("DELETED", before, None)
            return
        before = self.store.get(key)
        self._put(key, obj)
        self.handler("ADDED" if before is None else "MODIFIED", before, obj)


def _rv_int(obj: Obj) -> int:
    try:
        return int(_rv(obj))
    except ValueError:
        return 0


def _rv(obj: Obj) -> str:
    return str(obj.get("metadata", {}).get("resourceVersion", ""))


async def _read_json(resp: Any) -> Obj:
    """Read a whole response; raise ``ApiException`` with the server's words on errors."""
    try:
        data = await resp.read()
    finally:
        with contextlib.suppress(Exception):
            resp.release()
    if resp.status == 410:
        raise GoneError()
    if not 200 <= resp.status <= 299:
        raise ApiException(status=resp.status, reason=data.decode(errors="replace")[:500])
    parsed: Obj = json.loads(data)
    return parsed
