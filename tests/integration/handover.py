"""A watcher that counts what a driver change or a hand-over does to the nodes: cordons,
workload pods deleted or evicted, driver pods whose DRIVER_CONFIG_DIGEST changed, and how
many nodes were at once without a Ready driver pod (the upgrade budget's measure).

It reads watch events (not polls), so a cordon lifted again a moment later still counts.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio import client, watch

from components.driver import digest_in
from components.keys import DEPLOY_LABEL_PREFIX, GPU_PRESENT_LABEL

DRIVER_APP_PREFIX = "nvidia-driver-daemonset"


@dataclass
class Disturbances:
    """What the watcher saw; `driver_digests` maps node -> the digests of its driver
    pods in the order they appeared."""

    cordons: list[str] = field(default_factory=list)
    workload_pods_removed: list[str] = field(default_factory=list)
    driver_digests: dict[str, list[str]] = field(default_factory=dict)
    driver_pods_seen: set[str] = field(default_factory=set)
    upgrade_states: dict[str, list[str]] = field(default_factory=dict)
    labels_dropped: list[tuple[str, str]] = field(default_factory=list)
    """(node, label) each time `nvidia.com/gpu.present` or a deploy label went from
    `true` to anything else or away."""
    most_drivers_down: int = 0
    """The most nodes at once that had run a Ready driver pod and had none Ready."""
    drivers_down_at_once: list[list[str]] = field(default_factory=list)
    """Each time the nodes without a Ready driver pod changed (and some were): which."""

    @property
    def driver_pods_replaced(self) -> int:
        """Driver pods that came after a node's first one."""
        return sum(len(d) - 1 for d in self.driver_digests.values())

    @property
    def digest_changes(self) -> dict[str, list[str]]:
        return {n: d for n, d in self.driver_digests.items() if len(set(d)) > 1}


def _app(pod: dict[str, Any]) -> str:
    return str((pod["metadata"].get("labels") or {}).get("app", ""))


class Watcher:
    """Runs node and pod watches in the background while the `async with` body runs."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        workload_namespace: str,
        is_driver_pod: Callable[[dict[str, Any]], bool] = lambda p: _app(p).startswith(
            DRIVER_APP_PREFIX
        ),
        state_label: str = "nvidia.com/gpu-driver-upgrade-state",
    ) -> None:
        self.core = client.CoreV1Api(api)
        self.workload_namespace = workload_namespace
        self.is_driver_pod = is_driver_pod
        self.state_label = state_label
        self.seen = Disturbances()
        self._tasks: list[asyncio.Task[None]] = []
        self._cordoned: dict[str, bool] = {}
        self._driver_ready: dict[str, dict[str, bool]] = {}
        self._down: set[str] = set()
        self._ever_ready: set[str] = set()
        self._ours: dict[str, set[str]] = {}

    async def __aenter__(self) -> Watcher:
        nodes = await self.core.list_node()
        pods = await self.core.list_pod_for_all_namespaces()
        for pod in pods.items:
            self._pod("ADDED", self.core.api_client.sanitize_for_serialization(pod))
        for node in nodes.items:
            self._node(self.core.api_client.sanitize_for_serialization(node))
        self._tasks = [
            asyncio.create_task(
                self._watch(self.core.list_node, nodes.metadata.resource_version, self._node_event)
            ),
            asyncio.create_task(
                self._watch(
                    self.core.list_pod_for_all_namespaces,
                    pods.metadata.resource_version,
                    self._pod,
                )
            ),
        ]
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.sleep(1.0)  # let the last events arrive
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _watch(self, lister: Any, version: str, handle: Callable[..., None]) -> None:
        while True:
            w = watch.Watch()
            async with w.stream(lister, resource_version=version, timeout_seconds=300) as events:
                async for event in events:
                    raw = event["raw_object"]
                    version = raw["metadata"].get("resourceVersion", version)
                    if event["type"] == "BOOKMARK":
                        continue
                    handle(event["type"], raw)

    def _node_event(self, kind: str, node: dict[str, Any]) -> None:
        if kind != "DELETED":
            self._node(node)

    def _node(self, node: dict[str, Any]) -> None:
        name = node["metadata"]["name"]
        cordoned = bool((node.get("spec") or {}).get("unschedulable"))
        if cordoned and not self._cordoned.get(name):
            self.seen.cordons.append(name)
        self._cordoned[name] = cordoned
        node_labels = node["metadata"].get("labels") or {}
        ours = {
            k
            for k, v in node_labels.items()
            if v == "true" and (k == GPU_PRESENT_LABEL or k.startswith(DEPLOY_LABEL_PREFIX))
        }
        self.seen.labels_dropped += [(name, k) for k in sorted(self._ours.get(name, set()) - ours)]
        self._ours[name] = ours
        state = node_labels.get(self.state_label)
        if state:
            states = self.seen.upgrade_states.setdefault(name, [])
            if not states or states[-1] != state:
                states.append(state)

    def _pod(self, kind: str, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        node = (pod.get("spec") or {}).get("nodeName")
        if meta.get("namespace") == self.workload_namespace:
            gone = kind == "DELETED" or meta.get("deletionTimestamp")
            if gone and meta["name"] not in self.seen.workload_pods_removed:
                self.seen.workload_pods_removed.append(meta["name"])
            return
        if not node or not self.is_driver_pod(pod):
            return
        self._driver_readiness(kind, node, pod)
        if meta.get("deletionTimestamp"):
            return
        if meta["uid"] in self.seen.driver_pods_seen:
            return
        self.seen.driver_pods_seen.add(meta["uid"])
        self.seen.driver_digests.setdefault(node, []).append(digest_in(pod.get("spec") or {}))

    def _driver_readiness(self, kind: str, node: str, pod: dict[str, Any]) -> None:
        pods = self._driver_ready.setdefault(node, {})
        uid = pod["metadata"]["uid"]
        if kind == "DELETED" or pod["metadata"].get("deletionTimestamp"):
            pods.pop(uid, None)
        else:
            status = pod.get("status") or {}
            pods[uid] = status.get("phase") == "Running" and any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in status.get("conditions") or []
            )
        if any(pods.values()):
            self._ever_ready.add(node)
            self._down.discard(node)
        elif node in self._ever_ready:
            self._down.add(node)
        down = sorted(self._down)
        at_once = self.seen.drivers_down_at_once
        if down and (not at_once or at_once[-1] != down):
            at_once.append(down)
        self.seen.most_drivers_down = max(self.seen.most_drivers_down, len(down))
