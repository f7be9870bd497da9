"""A thin, counted REST layer over the shared ``ApiClient``.

Every request the operator makes goes through here, so it is counted by verb
and resource: tests assert that a no-op reconcile writes nothing, benchmarks
report API load. Objects are plain dicts (what the caches hold); paths come
from a small table of the kinds we manage rather than per-kind generated APIs.
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
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from components.dra import KINDS as DRA_KINDS
from components.dra import RESOURCE_KINDS as DRA_RESOURCE_KINDS
from components.registry import OWNED_KINDS

FIELD_MANAGER = "gpuop"
Obj = dict[str, Any]


@dataclass(frozen=True)
class Kind:
    api_version: str
    kind: str
    plural: str
    namespaced: bool

    def base(self) -> str:
        return (
            f"/api/{self.api_version}"
            if "/" not in self.api_version
            else f"/apis/{self.api_version}"
        )

    def collection(self, namespace: str | None = None) -> str:
        if self.namespaced and namespace:
            return f"{self.base()}/namespaces/{namespace}/{self.plural}"
        return f"{self.base()}/{self.plural}"

    def item(self, name: str, namespace: str | None = None) -> str:
        return f"{self.collection(namespace if self.namespaced else None)}/{quote(name)}"


_KINDS = [
    Kind("v1", "Node", "nodes", False),
    Kind("v1", "Pod", "pods", True),
    Kind("v1", "PodTemplate", "podtemplates", True),
    Kind("v1", "Namespace", "namespaces", False),
    Kind("v1", "Event", "events", True),
    Kind("apps/v1", "Deployment", "deployments", True),
    Kind("apps/v1", "ControllerRevision", "controllerrevisions", True),
    Kind("nvidia.com/v1", "ClusterPolicy", "clusterpolicies", False),
    Kind("nvidia.com/v1alpha1", "NVIDIADriver", "nvidiadrivers", False),
    Kind("nvidia.com/v1alpha1", "GPUCluster", "gpuclusters", False),
    Kind("coordination.k8s.io/v1", "Lease", "leases", True),
    Kind("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets", True),
    Kind("apiextensions.k8s.io/v1", "CustomResourceDefinition", "customresourcedefinitions", False),
]
_KINDS += [
    Kind(k.api_version, k.kind, k.plural, k.namespaced)
    for k in (*OWNED_KINDS, *DRA_KINDS, *DRA_RESOURCE_KINDS)
]
"""Operand kinds come from the operand registry: a new operand's kinds need no entry here."""
KINDS: dict[tuple[str, str], Kind] = {(k.api_version, k.kind): k for k in _KINDS}


def kind_of(obj: Mapping[str, Any]) -> Kind:
    try:
        return KINDS[(str(obj["apiVersion"]), str(obj["kind"]))]
    except KeyError as err:
        raise ValueError(f"unsupported kind {obj.get('apiVersion')}/{obj.get('kind')}") from err


def by_kind(api_version: str, kind: str) -> Kind:
    return KINDS[(api_version, kind)]


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

    def __init__(self, api: client.ApiClient, timeout: float = REQUEST_TIMEOUT) -> None:
        self.api = api
        self.counts: Counter[tuple[str, str]] = Counter()
        #: Told of every request (verb, resource) as it is counted: the operator's
        #: ``gpu_operator_api_requests_total``. The REST layer knows no metrics library.
        self.observer: Callable[[str, str], None] | None = None
        connect = min(timeout, CONNECT_TIMEOUT)
        #: Applied to every request that does not bring its own (only watches do).
        self.timeout = aiohttp.ClientTimeout(total=timeout, connect=connect, sock_connect=connect)

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
    ) -> Any:
        """One request; a 429 with Retry-After (API priority and fairness, storage
        still initialising) is retried a few times, except where 429 means an answer
        (evictions blocked by a PodDisruptionBudget)."""
        for attempt in range(_MAX_429_RETRIES + 1):
            try:
                return await self._once(
                    verb, method, path, resource, query, body, content_type, preload, timeout
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
    ) -> Any:
        self.counts[(verb, resource)] += 1
        if self.observer is not None:
            self.observer(verb, resource)
        headers = {"Accept": "application/json"}
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
        """A list/watch call in the shape ``Informer`` expects (keyword names of the SDK)."""
        path = kind.collection(namespace)

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
            )

        return call

    async def get(self, kind: Kind, name: str, namespace: str | None = None) -> Obj | None:
        try:
            got: Obj = await self._call("GET", "GET", kind.item(name, namespace), kind.plural)
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
        body: Obj = await self._call("LIST", "GET", kind.collection(namespace), kind.plural, query)
        items: list[Obj] = body.get("items") or []
        return items

    # ------------------------------------------------------------ writes
    async def apply(self, obj: Mapping[str, Any], force: bool = True) -> Obj:
        """Server-side apply with field manager ``gpuop``."""
        kind = kind_of(obj)
        meta = obj["metadata"]
        query = [("fieldManager", FIELD_MANAGER), ("force", "true" if force else "false")]
        applied: Obj = await self._call(
            "APPLY",
            "PATCH",
            kind.item(meta["name"], meta.get("namespace")),
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
        path = kind.item(name, namespace) + (f"/{subresource}" if subresource else "")
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
            kind.item(body["metadata"]["name"], namespace),
            kind.plural,
            body=dict(body),
        )
        return replaced

    async def create(
        self, kind: Kind, body: Mapping[str, Any], namespace: str | None = None
    ) -> Obj:
        created: Obj = await self._call(
            "CREATE", "POST", kind.collection(namespace), kind.plural, body=dict(body)
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
                kind.item(name, namespace),
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
        pod = by_kind("v1", "Pod")
        await self._call(
            "CREATE",
            "POST",
            pod.item(name, namespace) + "/eviction",
            "pods/eviction",
            body={
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": name, "namespace": namespace},
            },
            retry_429=False,
        )
