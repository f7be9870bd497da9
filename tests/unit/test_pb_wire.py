"""The pods watch as Kubernetes protobuf (gpuop.kube._pb_wire, gpuop.kube._pb_pod): what the API
server sent of the same pods in JSON and in protobuf (recorded by ``python -m
tests.bench.record_wire``) becomes the same cache entries, and what a recording does
not hold (waiting containers, restarts, ERROR and BOOKMARK events) is built with our
own descriptors."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from gpuop.kube import _pb_pod as pb
from gpuop.kube._pb_wire import (
    MAGIC,
    MAX_FRAME,
    POD_CODEC,
    Frames,
    PodCodec,
    WireError,
    error_text,
    is_protobuf,
    unwrap,
)
from gpuop.kube.informer import GoneError, Informer, ResourceSpec
from gpuop.kube.shapes import Decoder
from gpuop.operator.controller.views.pod_records import (
    PodShape,
    pod_index,
    record_of_message,
    same_pod,
    trim_pod,
)

DATA = Path(__file__).parent.parent / "data"


def _frames(stream: bytes) -> list[bytes]:
    frames, at = [], 0
    while at < len(stream):
        size = int.from_bytes(stream[at : at + 4], "big")
        frames.append(stream[at + 4 : at + 4 + size])
        at += 4 + size
    return frames


JSON_EVENTS = (DATA / "operand_pods.watch.jsonl").read_bytes().splitlines()
PB_EVENTS = _frames((DATA / "operand_pods.watch.pb").read_bytes())
#: The operand pods cache's codec: protobuf straight into records.
RECORDS = PodCodec(build=record_of_message)
BOTH_CODECS = pytest.mark.parametrize("codec", [POD_CODEC, RECORDS], ids=["dicts", "records"])


def _envelope(kind: str, message: Any) -> bytes:
    unknown = pb.Unknown(raw=message.SerializeToString())
    unknown.typeMeta.apiVersion = "v1"
    unknown.typeMeta.kind = kind
    return MAGIC + unknown.SerializeToString()


def _frame(event_type: str, kind: str, message: Any) -> bytes:
    event = pb.WatchEvent(type=event_type)
    event.object.raw = _envelope(kind, message)
    return bytes(event.SerializeToString())


def test_recorded_events_decode_to_the_same_records_both_ways() -> None:
    assert len(JSON_EVENTS) == len(PB_EVENTS) > 40
    shaped = Decoder(PodShape)
    for line, frame in zip(JSON_EVENTS, PB_EVENTS, strict=True):
        whole = json.loads(line)
        event = POD_CODEC.event(frame)
        assert event["type"] == whole["type"]
        record = trim_pod(event["object"])
        assert record == trim_pod(whole["object"]) == trim_pod(shaped.event(line)["object"])
        assert RECORDS.event(frame) == {"type": whole["type"], "object": record}
        assert record.resource_version == whole["object"]["metadata"]["resourceVersion"]
    records = [trim_pod(POD_CODEC.event(f)["object"]) for f in PB_EVENTS]
    # The recording exercises what the cache keeps, not only empty fields.
    assert {r.phase for r in records} >= {"Pending", "Running"}
    assert any(r.ready for r in records)
    assert any(r.deleting for r in records)
    assert any(r.config_digest for r in records)
    assert all(r.node for r in records)


def test_recorded_list_page_decodes_to_the_same_page() -> None:
    body = json.loads((DATA / "operand_pods.list.json").read_bytes())
    page = POD_CODEC.page((DATA / "operand_pods.list.pb").read_bytes())
    assert page["metadata"] == {
        "resourceVersion": body["metadata"]["resourceVersion"],
        "continue": body["metadata"]["continue"],
    }
    assert [trim_pod(p) for p in page["items"]] == [trim_pod(p) for p in body["items"]]
    built = RECORDS.page((DATA / "operand_pods.list.pb").read_bytes())
    assert built == {"metadata": page["metadata"], "items": [trim_pod(p) for p in body["items"]]}


def test_fields_no_recording_holds_decode_as_json_would() -> None:
    pod = pb.Pod()
    pod.metadata.name, pod.metadata.namespace = "p", "ns"
    pod.metadata.uid, pod.metadata.resourceVersion = "not-a-uuid", "a7"
    pod.metadata.creationTimestamp.seconds = 1_700_000_000
    pod.metadata.deletionTimestamp.seconds = 1_700_000_100
    pod.metadata.labels.update({"z": "1", "app": "nvidia-driver-daemonset"})
    pod.spec.nodeName = "n1"
    pod.spec.containers.add().env.add(name="OTHER", value="x")
    first = pod.status.containerStatuses.add(restartCount=2)
    first.state.waiting.reason = ""
    second = pod.status.containerStatuses.add(restartCount=5)
    second.state.waiting.reason = "ImagePullBackOff"
    pod.status.phase = "Pending"
    pod.status.conditions.add(type="Ready", status="False")
    as_json = {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "not-a-uuid",
            "resourceVersion": "a7",
            "creationTimestamp": "2023-11-14T22:13:20Z",
            "deletionTimestamp": "2023-11-14T22:15:00Z",
            "labels": {"app": "nvidia-driver-daemonset", "z": "1"},
        },
        "spec": {"nodeName": "n1", "containers": [{"env": [{"name": "OTHER", "value": "x"}]}]},
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "Ready", "status": "False"}],
            "containerStatuses": [
                {"restartCount": 2, "state": {"waiting": {}}},
                {"restartCount": 5, "state": {"waiting": {"reason": "ImagePullBackOff"}}},
            ],
        },
    }
    record = trim_pod(POD_CODEC.event(_frame("MODIFIED", "Pod", pod))["object"])
    assert record == trim_pod(as_json)
    assert RECORDS.event(_frame("MODIFIED", "Pod", pod))["object"] == record
    assert (record.restarts, record.waiting, record.deleting) == (7, "ImagePullBackOff", True)
    assert list(record.labels) == ["app", "z"]  # sorted, as Kubernetes writes maps


def test_error_event_is_its_status_and_relists_on_410() -> None:
    status = pb.Status(status="Failure", message="too old resource version", code=410)
    event = POD_CODEC.event(_frame("ERROR", "Status", status))
    assert event == {
        "type": "ERROR",
        "object": {
            "kind": "Status",
            "status": "Failure",
            "message": "too old resource version",
            "reason": "",
            "code": 410,
        },
    }
    informer = _informer([])
    with pytest.raises(GoneError):
        informer._on_event(event)
    other = POD_CODEC.event(_frame("ERROR", "Status", pb.Status(code=500, message="boom")))
    with pytest.raises(ApiException):
        informer._on_event(other)


@BOTH_CODECS
def test_bookmark_moves_the_resource_version_only(codec: PodCodec) -> None:
    pod = pb.Pod()
    pod.metadata.resourceVersion = "4242"
    informer = _informer([])
    informer._on_event(codec.event(_frame("BOOKMARK", "Pod", pod)))
    assert (informer.resource_version, informer.store, informer.events) == ("4242", {}, 0)


def test_not_protobuf_is_refused() -> None:
    with pytest.raises(WireError):
        unwrap(b'{"kind": "PodList"}')
    with pytest.raises(WireError):
        POD_CODEC.page(_envelope("Status", pb.Status(code=500)))
    assert is_protobuf("application/vnd.kubernetes.protobuf;stream=watch")
    assert is_protobuf("application/vnd.kubernetes.protobuf")
    assert not is_protobuf("application/json")
    assert not is_protobuf(None)


def test_frames_are_split_whole_from_chunks_of_any_size() -> None:
    """A batch read hands over many frames at once, and a chunk may end anywhere in
    one: each frame comes out whole, once, in order."""
    stream = b"".join(len(f).to_bytes(4, "big") + f for f in PB_EVENTS[:3])
    assert Frames().feed(stream) == PB_EVENTS[:3]
    for step in (1, 3, 7, 64):
        frames, found = Frames(), []
        for at in range(0, len(stream), step):
            found += frames.feed(stream[at : at + step])
        frames.end()
        assert found == PB_EVENTS[:3], step
    cut = Frames()
    assert cut.feed(stream[:-1]) == PB_EVENTS[:2]
    with pytest.raises(WireError):
        cut.end()  # the stream ended inside the third frame
    with pytest.raises(WireError):
        Frames().feed((MAX_FRAME + 1).to_bytes(4, "big"))


def _informer(told: list[tuple[str, Any, Any]], unchanged: bool = True) -> Informer[Any]:
    async def never(**_: Any) -> Any:
        raise AssertionError("no API calls in this test")

    spec = ResourceSpec(
        "pods",
        never,
        transform=trim_pod,
        index=pod_index,
        codec=POD_CODEC,
        unchanged=same_pod if unchanged else None,
        track_index_changes=True,
    )
    return Informer(spec, lambda *event: told.append(event))


@BOTH_CODECS
def test_replayed_protobuf_stream_keeps_the_json_cache_with_fewer_events(codec: PodCodec) -> None:
    """The recorded stream through the protobuf path (into dicts the transform trims, or
    straight into records), unchanged events taken at intake, and through the JSON
    path, every event told: after each event both caches hold the same records, and
    every event the first did not tell changed no record."""
    by_json: list[tuple[str, Any, Any]] = []
    by_pb: list[tuple[str, Any, Any]] = []
    plain, quiet = _informer(by_json, unchanged=False), _informer(by_pb)
    for line, frame in zip(JSON_EVENTS, PB_EVENTS, strict=True):
        told = len(by_pb)
        plain._on_line(line)
        quiet._on_event(codec.event(frame))
        assert list(quiet.store.items()) == list(plain.store.items())  # order too
        assert quiet.resource_version == plain.resource_version
        assert {k: [p.key for p in v] for k, v in quiet._index.items()} == {
            k: [p.key for p in v] for k, v in plain._index.items()
        }
        if len(by_pb) == told:  # not told: the same record but for its version
            old, new = by_json[-1][1], by_json[-1][2]
            assert old is not None
            assert new is not None
            assert same_pod(old, new)
    assert quiet.events == plain.events == len(JSON_EVENTS)
    assert quiet.unchanged == len(by_json) - len(by_pb) > 0
    news = [e[0] for e in by_json if e[0] != "MODIFIED" or not same_pod(e[1], e[2])]
    assert [e[0] for e in by_pb] == news


@BOTH_CODECS
def test_an_unchanged_event_moves_the_version_but_wakes_nothing(codec: PodCodec) -> None:
    told: list[tuple[str, Any, Any]] = []
    informer = _informer(told)
    pod = pb.Pod()
    pod.metadata.name, pod.metadata.namespace, pod.metadata.uid = "p", "ns", "u"
    pod.metadata.resourceVersion = "10"
    pod.spec.nodeName = "n1"
    informer._on_event(codec.event(_frame("ADDED", "Pod", pod)))
    informer.index_changes()
    version = informer.version
    pod.metadata.resourceVersion = "11"
    pod.metadata.creationTimestamp.seconds = 0  # a field the cache keeps: told
    informer._on_event(codec.event(_frame("MODIFIED", "Pod", pod)))
    assert len(told) == 2
    assert informer.version > version
    informer.index_changes()
    version = informer.version
    pod.metadata.resourceVersion = "12"  # an annotation, another condition: not kept
    informer._on_event(codec.event(_frame("MODIFIED", "Pod", pod)))
    held = informer.get("ns/p")
    assert held is not None
    assert held.resource_version == "12"
    assert informer.indexed("n1") == [held]
    assert (len(told), informer.version, informer.index_changes()) == (2, version, set())
    # Versions stay ordered by the newest held: an older one is ignored.
    pod.metadata.resourceVersion = "11"
    informer._on_event(codec.event(_frame("MODIFIED", "Pod", pod)))
    assert informer.get("ns/p") is held
    assert len(told) == 2


def test_error_bodies_in_protobuf_are_told_in_words() -> None:
    status = pb.Status(code=403, reason="Forbidden", message="pods is forbidden")
    assert error_text(_envelope("Status", status)) == "403 Forbidden: pods is forbidden"
    assert error_text(b'{"kind": "Status"}') == '{"kind": "Status"}'
    assert error_text(MAGIC + b"\xff\xff") == (MAGIC + b"\xff\xff").decode(errors="replace")


class _Transport:
    """What batching asks of a connection's transport: pause and resume, counted."""

    def __init__(self) -> None:
        self.paused = 0
        self.resumed = 0

    def pause_reading(self) -> None:
        assert self.paused == self.resumed, "paused twice"
        self.paused += 1

    def resume_reading(self) -> None:
        self.resumed += 1


async def test_a_batched_watch_hands_on_every_frame_and_always_resumes_its_transport() -> None:
    """Frames split across the chunks the stream hands over (and several in one) reach
    the cache in order; after each chunk's frames the transport is paused for the
    batch and resumed, and the end of the stream ends the read cleanly."""
    told: list[tuple[str, Any, Any]] = []
    informer = _informer(told, unchanged=False)
    informer.spec.batch_seconds = 0.001
    plain: list[tuple[str, Any, Any]] = []
    reference = _informer(plain, unchanged=False)
    for frame in PB_EVENTS:
        reference._on_event(POD_CODEC.event(frame))
    stream = b"".join(len(f).to_bytes(4, "big") + f for f in PB_EVENTS)
    content = asyncio.StreamReader()
    transport = _Transport()
    resp = SimpleNamespace(content=content, connection=SimpleNamespace(transport=transport))

    async def feed() -> None:
        for at in range(0, len(stream), 5000):  # chunks that end inside frames
            content.feed_data(stream[at : at + 5000])
            await asyncio.sleep(0)
        content.feed_eof()

    await asyncio.gather(informer._read_frames(resp, POD_CODEC), feed())
    assert [e[0] for e in told] == [e[0] for e in plain]
    assert list(informer.store.items()) == list(reference.store.items())
    assert 0 < transport.paused == transport.resumed
