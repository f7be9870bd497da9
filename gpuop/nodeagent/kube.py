"""The few Kubernetes calls the cuda and plugin checks make, behind a tiny interface.

Checks see plain dicts (the API's JSON shape, camelCase keys), so a test can stand in
an in-memory stub and the reading of a pod's state stays a pure function.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, cast

import aiohttp


class KubeError(Exception):
    """An API call failed for a reason other than "not found"."""


class KubeApi(Protocol):
    async def create_pod(self, namespace: str, manifest: Mapping[str, Any]) -> None: ...

    async def get_pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The pod as JSON, or None when it does not exist."""
        ...

    async def delete_pod(self, namespace: str, name: str) -> None:
        """Delete now (no grace period); a missing pod is not an error."""
        ...

    async def get_node_allocatable(self, name: str) -> Mapping[str, str] | None:
        """``status.allocatable`` of the node, or None when the node does not exist."""
        ...


@dataclass(frozen=True, slots=True)
class PodObservation:
    phase: str
    reason: str


def observe_pod(pod: Mapping[str, Any]) -> PodObservation:
    """The pod's phase and the most specific one-line reason it gives for its state."""
    status: Mapping[str, Any] = pod.get("status") or {}
    phase = str(status.get("phase") or "Pending")
    reasons: list[str] = []
    for cs in status.get("containerStatuses") or []:
        state: Mapping[str, Any] = cs.get("state") or {}
        name = cs.get("name", "?")
        if term := state.get("terminated"):
            if term.get("exitCode", 0) != 0 or phase == "Failed":
                detail = f"{term.get('reason') or 'terminated'} (exit code {term.get('exitCode')})"
                if msg := term.get("message"):
                    detail += f": {msg}"
                reasons.append(f"container {name} {detail}")
        elif (wait := state.get("waiting")) and wait.get("reason"):
            detail = str(wait["reason"])
            if msg := wait.get("message"):
                detail += f": {msg}"
            reasons.append(f"container {name} waiting: {detail}")
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            reasons.append(
                f"not scheduled: {cond.get('reason') or ''} {cond.get('message') or ''}".strip()
            )
    if status.get("reason") or status.get("message"):
        reasons.insert(0, f"{status.get('reason') or ''} {status.get('message') or ''}".strip())
    return PodObservation(phase, " ".join("; ".join(reasons).split()) or f"phase {phase}")


class KubernetesApi:
    """:class:`KubeApi` over ``kubernetes_asyncio``, sharing the caller's ``ApiClient``."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes_asyncio import client

        self._client = api_client
        self._core = client.CoreV1Api(api_client)

    async def _call(self, coro: Any) -> Any:
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            return await coro
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise KubeError(f"API error {exc.status}: {exc.reason}") from exc
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise KubeError(f"API unreachable: {exc}") from exc

    async def create_pod(self, namespace: str, manifest: Mapping[str, Any]) -> None:
        await self._call(self._core.create_namespaced_pod(namespace, cast(Any, dict(manifest))))

    async def get_pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        pod = await self._call(self._core.read_namespaced_pod(name, namespace))
        if pod is None:
            return None
        data: Mapping[str, Any] = self._client.sanitize_for_serialization(pod)
        return data

    async def delete_pod(self, namespace: str, name: str) -> None:
        await self._call(self._core.delete_namespaced_pod(name, namespace, grace_period_seconds=0))

    async def get_node_allocatable(self, name: str) -> Mapping[str, str] | None:
        node = await self._call(self._core.read_node(name))
        if node is None:
            return None
        return dict((node.status and node.status.allocatable) or {})

    async def get_node_capacity(self, name: str) -> Mapping[str, str] | None:
        """``status.capacity`` of the node (what upstream's exporter counts GPUs in)."""
        node = await self._call(self._core.read_node(name))
        if node is None:
            return None
        return dict((node.status and node.status.capacity) or {})

    async def get_node_labels(self, name: str) -> Mapping[str, str] | None:
        """The node's labels (its workload, its CC capability), or None when the node
        does not exist."""
        node = await self._call(self._core.read_node(name))
        if node is None:
            return None
        return dict((node.metadata and node.metadata.labels) or {})
