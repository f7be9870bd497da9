"""An in-memory :class:`~gpuop.nodeagent.kube.KubeApi` for unit tests and local runs.

A created pod walks through ``pod_statuses`` one step per read (the last one sticks),
which is enough to play a pod that pulls, runs and succeeds or fails.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from gpuop.nodeagent.kube import KubeError

SUCCEEDS: tuple[Mapping[str, Any], ...] = ({"phase": "Pending"}, {"phase": "Succeeded"})


class InMemoryKube:
    def __init__(
        self,
        allocatable: Mapping[str, Mapping[str, str]] | None = None,
        pod_statuses: tuple[Mapping[str, Any], ...] = SUCCEEDS,
    ) -> None:
        self.allocatable = {k: dict(v) for k, v in (allocatable or {}).items()}
        self.pod_statuses = pod_statuses
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.created: list[dict[str, Any]] = []
        self.deleted: list[tuple[str, str]] = []
        self.error: KubeError | None = None  # raised by every call while set
        self._plans: dict[tuple[str, str], list[Mapping[str, Any]]] = {}

    def _check(self) -> None:
        if self.error is not None:
            raise self.error

    async def create_pod(self, namespace: str, manifest: Mapping[str, Any]) -> None:
        self._check()
        pod = copy.deepcopy(dict(manifest))
        key = (namespace, pod["metadata"]["name"])
        if key in self.pods:
            raise KubeError("API error 409: AlreadyExists")
        pod["metadata"]["namespace"] = namespace
        pod["status"] = {"phase": "Pending"}
        self.pods[key] = pod
        self.created.append(pod)
        self._plans[key] = list(self.pod_statuses)

    async def get_pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        self._check()
        key = (namespace, name)
        pod = self.pods.get(key)
        if pod is None:
            return None
        plan = self._plans.get(key, [])
        if plan:
            pod["status"] = dict(plan.pop(0) if len(plan) > 1 else plan[0])
        return copy.deepcopy(pod)

    async def delete_pod(self, namespace: str, name: str) -> None:
        self._check()
        if self.pods.pop((namespace, name), None) is not None:
            self.deleted.append((namespace, name))
        self._plans.pop((namespace, name), None)

    async def get_node_allocatable(self, name: str) -> Mapping[str, str] | None:
        self._check()
        return self.allocatable.get(name)
