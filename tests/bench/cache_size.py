"""``python -m tests.bench.cache_size``: bytes the operator's caches hold per GPU node.

No cluster needed: one GPU node and its seven operand pods, as the API server
returned them (captured from a local cluster into ``fixtures/gpu-node.json``),
are copied to N nodes with unique names, uids and resourceVersions, decoded one
watch event at a time the way the operator's watches decode them (pods through
:class:`~gpuop.operator.controller.views.pod_records.PodShape`), and fed through the operator's own
transforms into real :class:`~gpuop.kube.informer.Informer` stores with the pod
index. Every operand pod is kept, as the operator's pods watch selects them all.
tracemalloc reports what stays allocated; then, apart, what the per-node rollout
view (:class:`~gpuop.operator.controller.views.rollout_view.NodeRollouts`) keeps after one pass
over every node for the sample policy's DaemonSets. The slope over the sizes is
their share of the operator's growth per 1,000 GPU nodes (the rest of its peak RSS
is the import floor and what LIST pages and watch streams leave behind).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import tracemalloc
from pathlib import Path
from typing import Any

import crd
import gpuop  # noqa: F401  (installs the lazy kubernetes-asyncio packages first)
from components import RenderContext, desired_objects, node_facts
from components.labels import is_gpu_node
from gpuop.kube.informer import Informer, ResourceSpec, key_of
from gpuop.kube.shapes import Decoder
from gpuop.operator.controller.views.node_views import labels, trim_node
from gpuop.operator.controller.views.pod_records import PodShape, pod_index, trim_pod
from gpuop.operator.controller.views.rollout_view import NodeRollouts

FIXTURE = Path(__file__).parent / "fixtures" / "gpu-node.json"
SIZES = (1000, 3000, 10000)


async def _never(**_: Any) -> None:  # the stores are filled directly
    raise AssertionError("not called")


def measure(nodes: int) -> dict[str, Any]:
    """What the node and pod caches hold for ``nodes`` GPU nodes and their pods."""
    fixture = json.loads(FIXTURE.read_text())
    name = fixture["node"]["metadata"]["name"]
    node_text = json.dumps(fixture["node"])
    pod_texts = [json.dumps(p) for p in fixture["pods"]]
    decode = Decoder(PodShape)
    gc.collect()
    tracemalloc.start()
    node_cache = Informer(ResourceSpec("nodes", _never, transform=trim_node), lambda *_: None)
    pod_cache = Informer(
        ResourceSpec(
            "pods",
            _never,
            transform=trim_pod,
            index=pod_index,
            shape=PodShape,
            track_index_changes=True,
        ),
        lambda *_: None,
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
            line = json.dumps({"type": "ADDED", "object": raw}).encode()
            del raw, meta
            pod = trim_pod(decode.event(line)["object"])
            pod_cache._put(key_of(pod), pod)
    pod_cache.index_changes()  # at rest: each pass of the operator's view drains it
    gc.collect()
    held, _ = tracemalloc.get_traced_memory()
    view = _rollout_view(node_cache, pod_cache, json.loads(node_text))
    gc.collect()
    with_view, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del view
    return {
        "gpu_nodes": nodes,
        "pods_per_node": len(pod_texts),
        "held_mib": round(held / 2**20, 2),
        "kib_per_gpu_node": round(held / nodes / 1024, 2),
        "rollout_view_mib": round((with_view - held) / 2**20, 2),
    }


def _rollout_view(nodes: Informer, pods: Informer[Any], node: dict[str, Any]) -> NodeRollouts:
    """One per-node view pass over every GPU node, for the sample policy's DaemonSets."""
    model, problems = crd.parse_policy(crd.sample_policy())
    assert model is not None, problems
    ctx = RenderContext(
        namespace="gpu-operator",
        operator_image="gpuop:bench",
        mig_capable=True,
        service_monitor_crd=False,
        prometheus_rule_crd=False,
        gpu_nodes=(node_facts(node),),
    )
    desired = desired_objects(model.spec, ctx)

    def empty(name: str) -> Informer:
        return Informer(ResourceSpec(name, _never), lambda *_: None)

    view = NodeRollouts(pods, empty("controllerrevisions"), empty("daemonsets"), "gpu-operator")
    gpu = [n for n in nodes.values() if is_gpu_node(labels(n))]
    view.view(desired, gpu)
    return view


def measure_sizes(sizes: tuple[int, ...] | list[int] = SIZES) -> dict[str, Any]:
    """Each size, and the least-squares slope of the cache in MiB per 1,000 GPU nodes."""
    runs = [measure(n) for n in sizes]
    xs = [float(r["gpu_nodes"]) for r in runs]
    ys = [float(r["held_mib"]) for r in runs]
    views = [float(r["rollout_view_mib"]) for r in runs]
    many = len(runs) > 1
    per_node = statistics.linear_regression(xs, ys).slope if many else None
    view_per_node = statistics.linear_regression(xs, views).slope if many else None
    return {
        "sizes": runs,
        "mib_per_1000_gpu_nodes": None if per_node is None else round(per_node * 1000, 2),
        "rollout_view_mib_per_1000_gpu_nodes": (
            None if view_per_node is None else round(view_per_node * 1000, 2)
        ),
    }


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m tests.bench.cache_size", description=__doc__)
    p.add_argument(
        "--nodes",
        default=",".join(map(str, SIZES)),
        help="simulated GPU nodes, comma list (1000,3000,10000)",
    )
    args = p.parse_args()
    got = measure_sizes([int(x) for x in args.nodes.split(",") if x.strip()])
    for r in got["sizes"]:
        print(
            f"{r['gpu_nodes']} GPU nodes, {r['pods_per_node']} pods each: "
            f"{r['held_mib']:.2f} MiB, {r['kib_per_gpu_node']:.2f} KiB per GPU node; "
            f"per-node rollout view {r['rollout_view_mib']:.2f} MiB"
        )
    if got["mib_per_1000_gpu_nodes"] is not None:
        print(
            f"slope: caches {got['mib_per_1000_gpu_nodes']:.2f}, rollout view "
            f"{got['rollout_view_mib_per_1000_gpu_nodes']:.2f} MiB per 1,000 GPU nodes"
        )


if __name__ == "__main__":
    main()
