"""``python -m tests.bench.parse``: CPU per pods-watch event, whole JSON against the shape.

No cluster needed. The operand pods in ``tests/data/operand_pods.json`` (captured from
a 1,000-node benchmark cluster, managedFields and all) are wrapped as watch events
and turned into cache entries both ways: ``json.loads`` then ``trim_pod``, and
:class:`gpuop.shapes.Decoder` with :class:`PodShape` then ``trim_pod``. Prints
microseconds per event for each (best of ``--rounds``).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import gpuop  # noqa: F401  (installs the lazy kubernetes-asyncio packages first)
from gpuop.controller._pods import PodShape, trim_pod
from gpuop.shapes import Decoder

FIXTURE = Path(__file__).parent.parent / "data" / "operand_pods.json"


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


if __name__ == "__main__":
    main()
