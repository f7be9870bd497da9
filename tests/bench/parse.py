"""``python -m tests.bench.parse``: CPU per pods-watch event, whole JSON against the shape.

No cluster needed. The operand pods in ``tests/data/operand_pods.json`` (captured from
a 1,000-node benchmark cluster, managedFields and all) are wrapped as watch events
and turned into cache entries both ways: ``json.loads`` then ``trim_pod``, and
:class:`gpuop.kube.shapes.Decoder` with :class:`PodShape` then ``trim_pod``. Prints
microseconds per event for each (best of ``--rounds``).

Then the same for the pods watch as the API server sent it both ways (recorded by
``python -m tests.bench.record_wire``: the same events of ten operand pods in JSON
and in Kubernetes protobuf): JSON through the shape, and protobuf through
:data:`gpuop.kube._pb_wire.POD_CODEC`, each then ``trim_pod``, and protobuf straight
into records as the operand pods cache decodes it (``PodCodec(build=record_of_message)``);
and how many of those events
the pods cache takes at intake because they change no record (``same_pod``).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import gpuop  # noqa: F401  (installs the lazy kubernetes-asyncio packages first)
from gpuop.kube._pb_wire import POD_CODEC, Frames, PodCodec
from gpuop.kube.shapes import Decoder
from gpuop.operator.controller.views.pod_records import (
    PodRecord,
    PodShape,
    record_of_message,
    same_pod,
    trim_pod,
)

DATA = Path(__file__).parent.parent / "data"
#: The operand pods cache's codec: protobuf straight into records.
RECORDS = PodCodec(build=record_of_message)
FIXTURE = DATA / "operand_pods.json"


def _per_event(lines: list[bytes], decode: Callable[[bytes], object], repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        for line in lines:
            decode(line)
    return (time.perf_counter() - start) / (repeat * len(lines))


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m tests.bench.parse", description=__doc__)
    p.add_argument("--repeat", type=int, default=300, help="passes over the fixture per round")
    p.add_argument("--rounds", type=int, default=5, help="rounds; the best is printed")
    args = p.parse_args()
    pods = json.loads(FIXTURE.read_text())
    lines = [json.dumps({"type": "MODIFIED", "object": pod}).encode() for pod in pods]
    shaped = Decoder(PodShape)
    ways: dict[str, Callable[[bytes], object]] = {
        "json.loads + trim_pod": lambda line: trim_pod(json.loads(line)["object"]),
        "Decoder(PodShape) + trim_pod": lambda line: trim_pod(shaped.event(line)["object"]),
    }
    size = sum(map(len, lines)) / len(lines)
    print(f"{len(lines)} operand pods, {size / 1024:.1f} KiB of JSON per event on average")
    for name, decode in ways.items():
        best = min(_per_event(lines, decode, args.repeat) for _ in range(args.rounds))
        print(f"{name:32s} {best * 1e6:8.1f} us per event")
    _recorded(args.repeat // 10 or 1, args.rounds)


def _frames(stream: bytes) -> list[bytes]:
    frames = Frames()
    found = frames.feed(stream)
    frames.end()
    return found


def _recorded(repeat: int, rounds: int) -> None:
    """JSON and protobuf of the same recorded watch events, decoded into records."""
    lines = (DATA / "operand_pods.watch.jsonl").read_bytes().splitlines()
    frames = _frames((DATA / "operand_pods.watch.pb").read_bytes())
    shaped = Decoder(PodShape)
    ways: dict[str, tuple[list[bytes], Callable[[bytes], object]]] = {
        "JSON: json.loads + trim_pod": (lines, lambda b: trim_pod(json.loads(b)["object"])),
        "JSON: Decoder(PodShape) + trim_pod": (
            lines,
            lambda b: trim_pod(shaped.event(b)["object"]),
        ),
        "protobuf: POD_CODEC + trim_pod": (
            frames,
            lambda b: trim_pod(POD_CODEC.event(b)["object"]),
        ),
        "protobuf: POD_CODEC alone": (frames, POD_CODEC.event),
        "protobuf: PodCodec(record_of_message)": (frames, RECORDS.event),
    }
    print(
        f"\nrecorded pods watch: {len(lines)} events, "
        f"{sum(map(len, lines)) / len(lines) / 1024:.1f} KiB per event as JSON, "
        f"{sum(map(len, frames)) / len(frames) / 1024:.1f} KiB as protobuf"
    )
    for name, (data, decode) in ways.items():
        best = min(_per_event(data, decode, repeat) for _ in range(rounds))
        print(f"{name:38s} {best * 1e6:8.1f} us per event")
    held: dict[str, PodRecord] = {}
    told = 0
    for frame in frames:
        event = POD_CODEC.event(frame)
        record = trim_pod(event["object"])
        before = held.get(record.key)
        if event["type"] == "DELETED":
            held.pop(record.key, None)
        else:
            held[record.key] = record
        if event["type"] != "MODIFIED" or before is None or not same_pod(before, record):
            told += 1
    print(f"events that change a pod record (reach the operator): {told} of {len(frames)}")


if __name__ == "__main__":
    main()
