"""A thin, counted REST layer over the shared ``ApiClient``.

Every request the operator makes goes through here, so it is counted by verb
and resource: tests assert that a no-op reconcile writes nothing, benchmarks
report API load. Objects are plain dicts (what the caches hold); paths come
from the kinds the caller hands in (the operator's table, ``gpuop.kube.kinds``)
rather than per-kind generated APIs.
Every request except a watch (which sets its own read timeout) is bounded by
``REQUEST_TIMEOUT``: the SDK's default is no timeout at all, so a request on a
connection that died silently hung a worker, a LIST or a lease renewal forever.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, Protocol
from urllib.parse import quote

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

FIELD_MANAGER = "gpuop"
Obj = dict[str, Any]


class Kind(Protocol):
    """What a request needs to know of a kind: its API version and plural, and whether
    it lives in a namespace. The REST layer knows no kinds of its own; the operator's
    table (``gpuop.kube.kinds``, built from the operand registry) hands them in."""

    @property
    def api_version(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def plural(self) -> str: ...
    @property
    def namespaced(self) -> bool: ...


KindTable = Mapping[tuple[str, str], Kind]
"""Kinds by ``(apiVersion, kind)``: how `Rest.apply` finds the path of a whole object."""


def collection_path(kind: Kind, namespace: str | None = None) -> str:
    base = f"/apis/{kind.api_version}" if "/" in kind.api_version else f"/api/{kind.api_version}"
    if kind.namespaced and namespace:
        return f"{base}/namespaces/{namespace}/{kind.plural}"
    return f"{base}/{kind.plural}"


def item_path(kind: Kind, name: str, namespace: str | None = None) -> str:
    return f"{collection_path(kind, namespace if kind.namespaced else None)}/{quote(name)}"


_READ_VERBS = {"GET", "LIST", "WATCH"}
_MAX_429_RETRIES = 5
#: Whole-request bound (connect, send, read the body) for everything but watches.
REQUEST_TIMEOUT = 30.0
CONNECT_TIMEOUT = 10.0


def _retry_after(err: ApiException) -> float:
    """The server's retryAfterSeconds (capped), else one second."""
    try:
        details = json.loads(err.reason or "{}").get("details") or {}
        return float(min(5, max(0.1, details.get("retryAfterSeconds", 1))))
    except (ValueError, AttributeError):
        return 1.0


class Rest:
    """Counted requests: ``counts[(verb, resource)]``; ``writes`` sums the mutating ones."""

    def __init__(
        self, api: client.ApiClient, kinds: KindTable, timeout: float = REQUEST_TIMEOUT
    ) -> None:
        self.api = api
        #: Where `apply` finds a whole object's kind; every other request is handed its kind.
        self.kinds = kinds
        self.counts: Counter[tuple[str, str]] = Counter()
        #: Told of every request (verb, resource) as it is counted: the operator's
        #: ``gpu_operator_api_requests_total``. The REST layer knows no metrics library.
        self.observer: Callable[[str, str], None] | None = None
        connect = min(timeout, CONNECT_TIMEOUT)
        #: Applied to every request that does not bring its own (only watches do).
        self.timeout = aiohttp.ClientTimeout(total=timeout, connect=connect, sock_connect=connect)

    def kind_of(self, obj: Mapping[str, Any]) -> Kind:
        """The kind of a whole object, from the table this client was given."""
        try:
            return self.kinds[(str(obj["apiVersion"]), str(obj["kind"]))]
        except KeyError as err:
            raise ValueError(f"unsupported kind {obj.get('apiVersion')}/{obj.get('kind')}") from err

    @property
    def writes(self) -> int:
        return sum(n for (verb, _), n in self.counts.items() if verb not in _READ_VERBS)

    def write_counts(self) -> dict[str, int]:
        return {
            f"{verb} {res}": n for (verb, res), n in self.counts.items() if verb not in _READ_VERBS
        }

    async def _call(
        self,
        verb: str,
        method: str,
        path: str,
        resource: str,
        query: list[tuple[str, Any]] | None = None,
        body: Any = None,
        content_type: str | None = None,
        preload: bool = True,
        timeout: Any = None,
        retry_429: bool = True,
        accept: str = "application/json",
    ) -> Any:
        """One request; a 429 with Retry-After (API priority and fairness, storage
        still initialising) is retried a few times, except where 429 means an answer
        (evictions blocked by a PodDisruptionBudget)."""
        for attempt in range(_MAX_429_RETRIES + 1):
            try:
                return await self._once(
                    verb,
                    method,
                    path,
                    resource,
                    query,
                    body,
                    content_type,
                    preload,
                    timeout,
                    accept,
                )
            except ApiException as err:
                if not retry_429 or err.status != 429 or attempt == _MAX_429_RETRIES:
                    raise
                # The server's advice, spread a little so throttled callers do not
                # all come back in the same instant.
                await asyncio.sleep(_retry_after(err) * (1.0 + 0.25 * random.random()))
        raise AssertionError("unreachable")

    async def _once(
        self,
        verb: str,
        method: str,
        path: str,
        resource: str,
        query: list[tuple[str, Any]] | None,
        body: Any,
        content_type: str | None,
        preload: bool,
        timeout: Any,
        accept: str = "application/json",
    ) -> Any:
        self.counts[(verb, resource)] += 1
        if self.observer is not None:
            self.observer(verb, resource)
        headers = {"Accept": accept}
        if content_type:
            headers["Content-Type"] = content_type
        resp = await self.api.call_api(
            path,
            method,
            query_params=query or [],
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
            _preload_content=False,
            _return_http_data_only=True,
            _request_timeout=self.timeout if timeout is None else timeout,
        )
        if not preload:
            return resp
        data = await resp.read()
        resp.release()
        if not 200 <= resp.status <= 299:
            raise ApiException(status=resp.status, reason=data.decode(errors="replace")[:1000])
        return json.loads(data) if data else None

    # ------------------------------------------------------------- reads
    def lister(self, kind: Kind, namespace: str | None = None) -> Any:
        """A list/watch call in the shape ``Informer`` expects (keyword names of the SDK;
        ``_accept``: the media types asked for, JSON when not given)."""
        path = collection_path(kind, namespace)

        async def call(**kwargs: Any) -> Any:
            query: list[tuple[str, Any]] = []
            names = {
                "label_selector": "labelSelector",
                "field_selector": "fieldSelector",
                "limit": "limit",
                "_continue": "continue",
                "resource_version": "resourceVersion",
                "allow_watch_bookmarks": "allowWatchBookmarks",
                "timeout_seconds": "timeoutSeconds",
            }
            for py, wire in names.items():
                value = kwargs.get(py)
                if value not in (None, ""):
                    query.append((wire, str(value).lower() if isinstance(value, bool) else value))
            watching = bool(kwargs.get("watch"))
            if watching:
                query.append(("watch", "true"))
            return await self._call(
                "WATCH" if watching else "LIST",
                "GET",
                path,
                kind.plural,
                query,
                preload=False,
                timeout=kwargs.get("_request_timeout"),
                accept=kwargs.get("_accept") or "application/json",
            )

        return call

    async def get(self, kind: Kind, name: str, namespace: str | None = None) -> Obj | None:
        try:
            got: Obj = await self._call("GET", "GET", item_path(kind, name, namespace), kind.plural)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return got

    async def api_group_exists(self, group_version: str) -> bool:
        """Discovery: is ``group/version`` served (a CRD installed)?"""
        try:
            await self._call("GET", "GET", f"/apis/{group_version}", "discovery")
        except ApiException as err:
            if err.status == 404:
                return False
            raise
        return True

    async def api_resource_exists(self, group_version: str, plural: str) -> bool:
        """Discovery: is ``plural`` served in ``group/version``? One CRD of a group may
        be installed without the others (a ServiceMonitor CRD, no PrometheusRule's)."""
        try:
            body: Obj = await self._call("GET", "GET", f"/apis/{group_version}", "discovery")
        except ApiException as err:
            if err.status == 404:
                return False
            raise
        return any(r.get("name") == plural for r in body.get("resources") or [])

    async def list(self, kind: Kind, namespace: str | None = None, **selectors: str) -> list[Obj]:
        query = [
            ("labelSelector" if k == "label_selector" else "fieldSelector", v)
            for k, v in selectors.items()
        ]
        body: Obj = await self._call(
            "LIST", "GET", collection_path(kind, namespace), kind.plural, query
        )
        items: list[Obj] = body.get("items") or []
        return items

    # ------------------------------------------------------------ writes
    async def apply(self, obj: Mapping[str, Any], force: bool = True) -> Obj:
        """Server-side apply with field manager ``gpuop``."""
        kind = self.kind_of(obj)
        meta = obj["metadata"]
        query = [("fieldManager", FIELD_MANAGER), ("force", "true" if force else "false")]
        applied: Obj = await self._call(
            "APPLY",
            "PATCH",
            item_path(kind, meta["name"], meta.get("namespace")),
            kind.plural,
            query,
            body=dict(obj),
            content_type="application/apply-patch+yaml",
        )
        return applied

    async def merge_patch(
        self,
        kind: Kind,
        name: str,
        patch: Mapping[str, Any],
        namespace: str | None = None,
        subresource: str | None = None,
    ) -> Obj:
        path = item_path(kind, name, namespace) + (f"/{subresource}" if subresource else "")
        patched: Obj = await self._call(
            "PATCH",
            "PATCH",
            path,
            kind.plural + (f"/{subresource}" if subresource else ""),
            body=dict(patch),
            content_type="application/merge-patch+json",
        )
        return patched

    async def replace(
        self, kind: Kind, body: Mapping[str, Any], namespace: str | None = None
    ) -> Obj:
        """PUT with the body's resourceVersion: a conflict (409) means someone else won."""
        replaced: Obj = await self._call(
            "UPDATE",
            "PUT",
            item_path(kind, body["metadata"]["name"], namespace),
            kind.plural,
            body=dict(body),
        )
        return replaced

    async def create(
        self, kind: Kind, body: Mapping[str, Any], namespace: str | None = None
    ) -> Obj:
        created: Obj = await self._call(
            "CREATE", "POST", collection_path(kind, namespace), kind.plural, body=dict(body)
        )
        return created

    async def delete(
        self,
        kind: Kind,
        name: str,
        namespace: str | None = None,
        body: Mapping[str, Any] | None = None,
    ) -> bool:
        """Delete; ``False`` when it was already gone."""
        try:
            await self._call(
                "DELETE",
                "DELETE",
                item_path(kind, name, namespace),
                kind.plural,
                body=dict(body) if body else None,
            )
        except ApiException as err:
            if err.status == 404:
                return False
            raise
        return True

    async def evict(self, name: str, namespace: str) -> None:
        """Eviction API; raises ``ApiException`` (429 when a PodDisruptionBudget forbids it now)."""
        await self._call(
            "CREATE",
            "POST",
            f"/api/v1/namespaces/{namespace}/pods/{quote(name)}/eviction",
            "pods/eviction",
            body={
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": name, "namespace": namespace},
            },
            retry_429=False,
        )
