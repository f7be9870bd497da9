"""The pods watch as Kubernetes protobuf against the real API server: a protobuf cache
and a JSON cache of the same pods hold the same records through creations, kwok's
status updates, label and annotation changes and deletions (the protobuf one taking
the events that change no record at intake); a kind served without protobuf (a custom
resource) falls back to JSON. (An ERROR frame is built in tests/unit/test_pb_wire.py:
this API server serves a watch from a compacted version instead of answering 410.)"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gpuop.kube._pb_wire import PodCodec
from gpuop.kube.informer import Informer, ResourceSpec
from gpuop.kube.kinds import KINDS, by_kind
from gpuop.kube.rest import Rest
from gpuop.operator.controller.views.pod_records import (
    PodShape,
    pod_index,
    record_of_message,
    same_pod,
    trim_pod,
)
from tests.integration.harness import POLICY, eventually

pytestmark = pytest.mark.integration

POD = by_kind("v1", "Pod")
SERVICE_ACCOUNT = by_kind("v1", "ServiceAccount")
#: An operand pod as a 1,000-node benchmark cluster had it (the driver's: env, digest).
TEMPLATE = json.loads(
    (Path(__file__).parent.parent / "bench" / "fixtures" / "gpu-node.json").read_text()
)["pods"]


class CountingCodec(PodCodec):
    """The operand pods cache's codec (protobuf straight into records), counting what it
    decoded: proof that protobuf came."""

    def __init__(self) -> None:
        super().__init__(build=record_of_message)
        self.frames = 0
        self.pages = 0

    def event(self, frame: bytes) -> dict[str, Any]:
        self.frames += 1
        return super().event(frame)

    def page(self, body: bytes) -> dict[str, Any]:
        self.pages += 1
        return super().page(body)


def _pod(name: str, node: str, namespace: str) -> dict[str, Any]:
    driver = next(p for p in TEMPLATE if "driver" in p["metadata"]["name"])
    spec = {k: v for k, v in driver["spec"].items() if k not in ("affinity", "runtimeClassName")}
    spec["nodeName"] = node
    spec["serviceAccountName"] = "default"
    labels = {**driver["metadata"]["labels"], "test": "pb"}
    meta = {"name": name, "namespace": namespace, "labels": labels}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


@contextlib.asynccontextmanager
async def _running(*informers: Informer[Any]) -> AsyncIterator[None]:
    tasks = [asyncio.create_task(i.run()) for i in informers]
    try:
        for informer in informers:
            await asyncio.wait_for(informer.synced.wait(), 20)
        yield
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _pods_informer(rest: Rest, namespace: str, codec: PodCodec | None) -> Informer[Any]:
    spec = ResourceSpec(
        "pods",
        rest.lister(POD, namespace),
        label_selector="test=pb",
        transform=trim_pod,
        shape=PodShape,
        codec=codec,
        unchanged=same_pod if codec is not None else None,
        index=pod_index,
        page_size=2,  # the LIST pages too, with continue
    )
    return Informer(spec, lambda *_: None, silence=5.0)


async def test_protobuf_and_json_pod_caches_hold_the_same_records(
    rest: Rest, namespace: str
) -> None:
    async def account() -> bool:
        return await rest.get(SERVICE_ACCOUNT, "default", namespace) is not None

    await eventually(account, timeout=30, what="default ServiceAccount")
    nodes = [f"gpu-node-{i:04d}" for i in range(3)]
    for i in range(3):  # some before the caches list (LIST pages), the rest watched
        await rest.create(POD, _pod(f"early-{i}", nodes[i % 3], namespace), namespace)
    codec = CountingCodec()
    by_pb = _pods_informer(rest, namespace, codec)
    by_json = _pods_informer(rest, namespace, None)
    async with _running(by_pb, by_json):
        assert codec.pages >= 2
        assert len(by_pb.store) == 3
        for i in range(4):
            await rest.create(POD, _pod(f"late-{i}", nodes[i % 3], namespace), namespace)
        await rest.merge_patch(POD, "late-0", {"metadata": {"annotations": {"a": "b"}}}, namespace)
        await rest.merge_patch(POD, "late-1", {"metadata": {"labels": {"x": "y"}}}, namespace)
        await rest.delete(POD, "early-0", namespace)

        async def settled() -> bool:
            ready = {k for k, p in by_json.store.items() if p.ready and p.phase == "Running"}
            agree = list(by_pb.store.items()) == list(by_json.store.items())
            gone = f"{namespace}/early-0" not in by_json.store
            labelled = "x" in by_json.store[f"{namespace}/late-1"].labels
            return agree and gone and labelled and len(ready) == 6

        await eventually(settled, timeout=60, what="both caches: the same 6 Ready pods")
        assert codec.frames > 0
        assert by_pb.events == by_json.events
        assert by_pb.unchanged >= 1  # the annotation, at least
        assert by_pb.resource_version
        assert by_json.resource_version


async def test_a_kind_without_protobuf_falls_back_to_json(rest: Rest) -> None:
    await rest.apply(
        {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": "pb-test"}}
    )
    try:
        codec = CountingCodec()
        informer = Informer(
            ResourceSpec("clusterpolicies", Rest(rest.api, KINDS).lister(POLICY), codec=codec),
            lambda *_: None,
        )
        async with _running(informer):
            assert "pb-test" in informer.store
            await rest.merge_patch(POLICY, "pb-test", {"metadata": {"labels": {"a": "b"}}})

            async def seen() -> bool:
                return "a" in informer.store["pb-test"]["metadata"].get("labels", {})

            await eventually(seen, timeout=20, what="the label by a JSON watch")
        assert (codec.pages, codec.frames) == (0, 0)
    finally:
        await rest.delete(POLICY, "pb-test")
