"""``python -m tests.bench.cache_size``: bytes the operator's caches hold per GPU node.

No cluster needed: one GPU node and its seven operand pods, as the API server
returned them (captured from a local cluster into ``fixtures/gpu-node.json``),
are copied to N nodes with unique names, uids and resourceVersions, decoded one
JSON document at a time (as watch events are), and fed through the operator's
own transforms into real :class:`~gpuop.informer.Informer` stores with the pod
index. tracemalloc reports what stays allocated. ``--all-pods`` feeds all seven
pods per node instead of only those the operator's pod watch selects.
"""

from __future__ import annotations

import argparse
import gc
import json
import tracemalloc
from pathlib import Path
from typing import Any

import gpuop  # noqa: F401  (installs the lazy kubernetes-asyncio packages first)
from gpuop.controller._nodes import trim_node
from gpuop.controller._pods import WATCHED_APPS, pod_index, trim_pod
from gpuop.informer import Informer, ResourceSpec, key_of

FIXTURE = Path(__file__).parent / "fixtures" / "gpu-node.json"


async def _never(**_: Any) -> None:  # the stores are filled directly
    raise AssertionError("not called")


def measure(nodes: int, all_pods: bool) -> tuple[float, int]:
    """(KiB per GPU node, pods per node) held by the node and pod caches."""
    fixture = json.loads(FIXTURE.read_text())
    name = fixture["node"]["metadata"]["name"]
    node_text = json.dumps(fixture["node"])
    pods = [
        p for p in fixture["pods"] if all_pods or p["metadata"]["labels"]["app"] in WATCHED_APPS
    ]
    pod_texts = [json.dumps(p) for p in pods]
    gc.collect()
    tracemalloc.start()
    node_cache = Informer(ResourceSpec("nodes", _never, transform=trim_node), lambda *_: None)
    pod_cache = Informer(
        ResourceSpec("pods", _never, transform=trim_pod, index=pod_index), lambda *_: None
    )
    for i in range(nodes):
        this = f"bench-node-{i:05d}"
        node = trim_node(json.loads(node_text.replace(name, this)))
        node_cache._put(key_of(node), node)
        for j, text in enumerate(pod_texts):
            raw = json.loads(text.replace(name, this))
            meta = raw["metadata"]
            meta["name"] = f"{meta['name']}-{i:05d}"
            meta["uid"] = f"{meta['uid'][:-6]}{i:06d}"
            meta["resourceVersion"] = str(1_000_000 + i * 10 + j)
            pod = trim_pod(raw)
            pod_cache._put(key_of(pod), pod)
    gc.collect()
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return held / nodes / 1024, len(pods)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m tests.bench.cache_size", description=__doc__)
    p.add_argument("--nodes", type=int, default=1000, help="simulated GPU nodes (1000)")
    p.add_argument("--all-pods", action="store_true", help="all seven operand pods per node")
    args = p.parse_args()
    kib, pods = measure(args.nodes, args.all_pods)
    print(f"{args.nodes} GPU nodes, {pods} pods each: {kib:.1f} KiB per GPU node")


if __name__ == "__main__":
    main()
