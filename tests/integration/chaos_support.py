"""What the chaos tests of the VM hand-over and of GPUCluster deletion share: the seed,
a watcher over every pod and node event whose two streams are compared by revision, a
marker that moves both streams past a known revision, and the operator process killed
at the seed's moments (``tests.integration.test_chaos``'s process and watcher).

Pods and nodes come in two watches. Inside one stream every event is a true moment of
the cluster, so a check over the pods alone (or the nodes alone) is exact at each
event. Across the streams only the etcd revision orders events: a test keeps, per node,
what the pods showed at each revision (:meth:`EveryEvent.at`) and judges a node event
against the pods at that very revision once the pod stream has read past it
(:meth:`EveryEvent.catch_up`).
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any

from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Rest
from tests.integration.harness import eventually
from tests.integration.test_chaos import NODE, POD, OperatorProcess, Watcher

NAMESPACE = by_kind("v1", "Namespace")
MARKER_ANNOTATION = "chaos.gpuop.io/marker"


def chaos_seed() -> tuple[int, random.Random]:
    """``GPUOP_CHAOS_SEED`` or a fresh seed, printed (pytest shows it on a failure)."""
    seed = int(os.environ.get("GPUOP_CHAOS_SEED") or random.SystemRandom().randrange(2**32))
    print(f"chaos seed: {seed} (replay with GPUOP_CHAOS_SEED={seed})")
    return seed, random.Random(seed)


def labels_of(obj: dict[str, Any]) -> dict[str, str]:
    return dict(obj["metadata"].get("labels") or {})


def node_of(pod: dict[str, Any]) -> str | None:
    """The node a pod is bound to; a pod counts there from its binding until its DELETED
    event, terminating (a deletionTimestamp kwok has not acted on yet) included."""
    node = (pod.get("spec") or {}).get("nodeName")
    return str(node) if node else None


def pod_ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    alive = not pod["metadata"].get("deletionTimestamp")
    return alive and any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


@dataclass
class EveryEvent(Watcher):
    """Every pod event (all namespaces) and every node event. After each, ``observe`` gets
    the stream (``Pod`` or ``Node``), a description, the revision and the nodes it
    changed, so a state goes on record once, when it begins; ``history`` keeps
    per node what ``snapshot`` made of its pods at each revision the pod stream changed
    it, so a node event can be judged against the pods at its revision."""

    revision: dict[str, int] = field(default_factory=lambda: {"Pod": 0, "Node": 0})
    history: dict[str, list[tuple[int, Any]]] = field(default_factory=dict)
    #: Why the watches stopped, if they did: :meth:`catch_up` says it at once rather
    #: than waiting out its timeout for events that will never come.
    stopped: BaseException | None = None

    async def run(self) -> None:
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._watch(NODE, None, self.nodes, ""))
                group.create_task(self._watch(POD, None, self.pods, ""))
        except BaseException as err:
            self.stopped = err
            raise

    def check(self, what: str, rv: int = 0) -> None:
        self.observations += 1
        _, stream, name = what.split()[:3]
        self.revision[stream] = rv
        changed = [name]
        if stream == "Pod":
            by_node: dict[str, list[dict[str, Any]]] = {}
            for pod in self.pods.values():
                if (node := node_of(pod)) is not None:
                    by_node.setdefault(node, []).append(pod)
            changed = []
            for node in self.nodes:
                now = self.snapshot(node, by_node.get(node, []))
                past = self.history.setdefault(node, [])
                if not past or past[-1][1] != now:
                    past.append((rv, now))
                    changed.append(node)
        try:
            self.observe(stream, what, rv, changed)
        except Exception as err:  # a broken check must fail the test, not the watch
            self.violations.append(f"{what}: the check raised {err!r}")

    def snapshot(self, node: str, pods: list[dict[str, Any]]) -> Any:
        """What a test keeps of one node's pods (compared for changes)."""
        return len(pods)

    def observe(self, stream: str, what: str, rv: int, nodes: list[str]) -> None:
        """A test's checks after one event; ``nodes``: those it changed (the node of a
        node event; the nodes whose pod snapshot a pod event changed)."""

    def at(self, node: str, rv: int) -> Any:
        """``snapshot`` of the node's pods at revision ``rv``; the pod stream must have
        read past ``rv`` (:meth:`catch_up`)."""
        assert self.revision["Pod"] >= rv, (node, rv, self.revision)
        before = [snap for version, snap in self.history.get(node, []) if version <= rv]
        assert before, f"no pod snapshot of {node} at or before revision {rv}"
        return before[-1]

    def _still_watching(self) -> None:
        """Fail at once, with its cause, once the watches have stopped."""
        if self.stopped is not None:
            raise AssertionError(f"the watcher stopped: {self.stopped!r}") from self.stopped

    async def catch_up(self, rest: Rest, marker: tuple[str, str], node: str) -> None:
        """Both streams past one write each made now: the marker pod's annotation and
        ``node``'s. The writes wait for both LISTs: one made before a LIST is in what it
        lists, and no watch event would ever show its revision."""

        async def listed() -> bool:
            self._still_watching()
            return {"Pod", "Node"} <= self.listed

        await eventually(listed, 30, interval=0.05, what="watcher listed")
        stamp = {"metadata": {"annotations": {MARKER_ANNOTATION: str(time.monotonic())}}}
        pod_rv = int(
            (await rest.merge_patch(POD, marker[1], stamp, marker[0]))["metadata"][
                "resourceVersion"
            ]
        )
        node_rv = int((await rest.merge_patch(NODE, node, stamp))["metadata"]["resourceVersion"])

        async def read() -> bool:
            self._still_watching()
            return self.revision["Pod"] >= pod_rv and self.revision["Node"] >= node_rv

        await eventually(read, 30, interval=0.1, what="watcher past the marker")


async def marker_pod(rest: Rest, namespace: str, node: str) -> tuple[str, str]:
    """A pause pod on a CPU node whose annotation :meth:`EveryEvent.catch_up` writes."""
    if await rest.get(NAMESPACE, namespace) is None:
        await rest.create(NAMESPACE, {"metadata": {"name": namespace}})
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "chaos-marker", "namespace": namespace},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "pause", "image": "pause"}],
        },
    }
    if await rest.get(POD, "chaos-marker", namespace) is None:
        await rest.create(POD, body, namespace)
    return namespace, "chaos-marker"


@dataclass
class Killer:
    """SIGKILLs the operator process and starts a new one, noting when and during what."""

    operator: OperatorProcess
    began: float = field(default_factory=time.monotonic)
    kills: list[tuple[float, str]] = field(default_factory=list)

    def __call__(self, during: str) -> None:
        self.alive()
        self.operator.kill()
        self.kills.append((round(time.monotonic() - self.began, 1), during))
        self.operator.start()

    def alive(self) -> None:
        assert self.operator.alive(), f"operator exited by itself:\n{self.operator.tail()}"
