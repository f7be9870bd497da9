"""A ClusterPolicy that must stand aside for a GPUCluster never applies its stack while
whether a GPUCluster exists is unknown (issue 43): after a restart the first cluster
pass read the GPUCluster cache before it had listed, found none, and applied all 46
objects (driver and device plugin among them); standing aside never prunes, so both
stacks advertised the same GPUs. The pass now waits for that cache, and its listing
wakes the pass.

A cluster that does not serve the GPUCluster CRD must not hold the ClusterPolicy for
ever: the GPUCluster informer counts a 404 as listed and empty (warned once), and keeps
retrying with its capped backoff, so a CRD installed later is picked up.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from kubernetes_asyncio.client.exceptions import ApiException

import crd
from components.keys import NFD_GPU_LABELS
from gpuop.kube.backoff import Backoff
from gpuop.kube.informer import Informer, ResourceSpec
from gpuop.operator.controller.base.config import OperatorConfig
from gpuop.operator.controller.base.keys import CLUSTER_KEY
from gpuop.operator.controller.wiring.operator import Operator
from gpuop.operator.metrics import OperatorMetrics

Obj = dict[str, Any]
QUICK = Backoff(0.001, 0.001)


class _Rest:
    """Reads find nothing; every write is recorded and answered as stored."""

    observer: Any = None

    def __init__(self, gpuclusters: Callable[..., Awaitable[Any]] | None = None) -> None:
        self.writes: list[tuple[str, str]] = []
        self._gpuclusters = gpuclusters

    def lister(self, kind: Any, namespace: str | None = None) -> Any:
        if kind.kind == "GPUCluster" and self._gpuclusters is not None:
            return self._gpuclusters

        async def never(**_: Any) -> Any:
            raise AssertionError("no informer runs here")

        return never

    async def api_resource_exists(self, api_version: str, plural: str) -> bool:
        return False

    async def get(self, *_: Any, **__: Any) -> Obj | None:
        return None

    async def list(self, *_: Any, **__: Any) -> list[Obj]:
        return []

    async def apply(self, obj: Obj, *_: Any, **__: Any) -> Obj:
        self.writes.append(("apply", f"{obj['kind']}/{obj['metadata']['name']}"))
        stored = copy.deepcopy(obj)
        stored["metadata"]["resourceVersion"] = "1"
        return stored

    async def merge_patch(self, kind: Any, name: str, patch: Obj, *_: Any, **__: Any) -> Obj:
        self.writes.append(("patch", f"{kind.kind}/{name}"))
        stored: Obj = _policy() if kind.kind == "ClusterPolicy" else {"metadata": {"name": name}}
        stored["status"] = patch.get("status")
        stored["metadata"]["resourceVersion"] = "2"
        return stored

    async def delete(self, kind: Any, name: str, *_: Any, **__: Any) -> bool:
        self.writes.append(("delete", f"{kind.kind}/{name}"))
        return True

    async def create(self, kind: Any, body: Obj, *_: Any, **__: Any) -> Obj:
        return body


def _policy() -> Obj:
    policy = crd.sample_policy()
    policy["metadata"].update(
        uid="p", resourceVersion="1", creationTimestamp="2026-01-01T00:00:00Z", generation=1
    )
    return policy


def _operator() -> tuple[Operator, _Rest]:
    """After a restart: every cache of the operator's own has listed, the GPUCluster's
    not yet."""
    rest = _Rest()
    op = Operator(rest, OperatorConfig(), OperatorMetrics())  # type: ignore[arg-type]
    op.policies.observe(_policy())
    op.nodes.observe(
        {
            "metadata": {"name": "gpu-0", "uid": "n", "resourceVersion": "1"},
            "spec": {},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }
    )
    op.nodes.observe(
        {
            "metadata": {
                "name": "gpu-0",
                "uid": "n",
                "resourceVersion": "2",
                "labels": {NFD_GPU_LABELS[0]: "true"},
            },
            "spec": {},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }
    )
    for informer in (*op.informers, op.owners.drivers):
        informer.synced.set()
    return op, rest


async def test_the_cluster_pass_applies_nothing_before_the_gpucluster_cache_listed() -> None:
    op, rest = _operator()
    assert not op.gpuclusters.knows_whether_one_exists()

    await op.cluster.reconcile()

    assert [w for w in rest.writes if w[0] in ("apply", "delete")] == []


async def test_the_listed_gpucluster_cache_wakes_the_pass_which_then_applies() -> None:
    op, rest = _operator()
    queued: list[str] = []
    op.queue.add = queued.append  # type: ignore[method-assign, assignment]
    await op.cluster.reconcile()

    op.gpuclusters.clusters.synced.set()  # listed: none exists
    op.router.gpucluster_known()
    assert CLUSTER_KEY in queued

    await op.cluster.reconcile()
    assert any(verb == "apply" for verb, _ in rest.writes)


async def test_a_listed_gpucluster_makes_the_pass_stand_aside() -> None:
    op, rest = _operator()
    op.gpuclusters.clusters.observe(
        {"metadata": {"name": "gpu-cluster", "uid": "g", "resourceVersion": "1"}}
    )
    op.gpuclusters.clusters.synced.set()

    await op.cluster.reconcile()

    assert [w for w in rest.writes if w[0] in ("apply", "delete")] == []


async def _not_served(**_: Any) -> Any:
    raise ApiException(status=404, reason="the server could not find the requested resource")


async def _wait(event: asyncio.Event) -> None:
    await asyncio.wait_for(event.wait(), timeout=5)


async def test_a_gpucluster_crd_not_served_counts_as_known_absent() -> None:
    op, _ = _operator()
    op.gpuclusters.clusters._retry.policy = QUICK
    op.gpuclusters.clusters.spec.list_call = _not_served
    task = asyncio.create_task(op.gpuclusters.clusters.run())
    try:
        await _wait(op.gpuclusters.clusters.synced)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert op.gpuclusters.knows_whether_one_exists()
    assert op.gpuclusters.conflict() is None
    assert op.gpuclusters.clusters.unavailable_for() == 0.0  # not a failing watch


async def test_a_kind_not_served_is_listed_empty_warned_once_and_picked_up_later() -> None:
    calls = 0
    item = {"metadata": {"name": "gpu-cluster", "uid": "g", "resourceVersion": "5"}}
    listed = asyncio.Event()

    async def later(**kwargs: Any) -> Any:
        nonlocal calls
        if kwargs.get("watch"):
            await asyncio.sleep(3600)  # a watch that stays open
        calls += 1
        if calls <= 3:
            raise ApiException(status=404, reason="not found")
        listed.set()
        return _Page({"metadata": {"resourceVersion": "5"}, "items": [item]})

    events: list[tuple[str, Obj | None, Obj | None]] = []
    spec = ResourceSpec("gpuclusters", later, absent_is_empty=True)
    informer = Informer(spec, lambda e, o, n: events.append((e, o, n)), retry=QUICK)
    with structlog.testing.capture_logs() as logs:
        task = asyncio.create_task(informer.run())
        try:
            await _wait(informer.synced)
            assert informer.store == {}
            await _wait(listed)
            await asyncio.sleep(0.01)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    assert calls == 4  # retried while not served
    assert list(informer.store) == ["gpu-cluster"]
    assert [e for e, _, _ in events] == ["ADDED"]
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert len(warnings) == 1
    assert warnings[0]["resource"] == "gpuclusters"


async def test_a_kind_that_must_be_served_still_fails_on_404() -> None:
    informer = Informer(ResourceSpec("nodes", _not_served), lambda *_: None, retry=QUICK)
    task = asyncio.create_task(informer.run())
    while informer.unavailable_for() == 0.0:  # noqa: ASYNC110 - the informer has no event for this
        await asyncio.sleep(0.01)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert not informer.synced.is_set()


class _Page:
    """A LIST response read whole (``_preload_content=False``)."""

    status = 200

    def __init__(self, body: Obj) -> None:
        self._body = body

    async def read(self) -> bytes:
        return json.dumps(self._body).encode()

    def release(self) -> None:
        return None
