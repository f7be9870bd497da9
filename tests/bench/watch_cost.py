"""``python -m tests.bench.watch_cost``: what one pods watch costs kube-apiserver and
its reader, as JSON and as protobuf, on a local cluster of its own.

The API server encodes each watch event once per encoding and shares it among the
watchers of that encoding; the operator's was the cluster's only JSON pods watch, so
every pod event was encoded to JSON for it alone. Here ``--pods`` operand pods (the
driver pod of ``tests/bench/fixtures/gpu-node.json``) run on kwok nodes; then, in
alternating rounds, one pods cache (``gpuop.kube.informer.Informer`` with the operator's
pod transform) watches them as JSON or as protobuf while every pod gets
``--patches`` annotation patches (one watch event each). Per round: kube-apiserver's
CPU seconds, and this process's (the watch's decoding plus the patch requests, the
same for both wires). The difference between the wires is the encoding and sending
of one watch's events, and its decoding; what the patches cost is in both. Then, in
the same round, ``--lists`` LISTs of every pod in pages of 100 (a relist, a restart),
decoded as the operator decodes them: there the API server encodes every pod anew
for each request, so the wire's share is larger.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import gpuop  # noqa: F401  (installs the lazy kubernetes-asyncio packages first)
from gpuop.devcluster import LocalCluster
from gpuop.kube._pb_wire import POD_CODEC, PROTOBUF
from gpuop.kube.client import api_client
from gpuop.kube.informer import Informer, ResourceSpec
from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Rest
from gpuop.kube.shapes import Decoder
from gpuop.operator.controller.views.pod_records import PodShape, trim_pod

from ._harness import process_cpu_seconds

POD = by_kind("v1", "Pod")
NAMESPACE = by_kind("v1", "Namespace")
SERVICE_ACCOUNT = by_kind("v1", "ServiceAccount")
FIXTURE = Path(__file__).parent / "fixtures" / "gpu-node.json"
SHAPED = Decoder(PodShape)


def _pod(name: str, node: str, namespace: str) -> dict[str, Any]:
    driver = next(
        p for p in json.loads(FIXTURE.read_text())["pods"] if "driver" in p["metadata"]["name"]
    )
    spec = {k: v for k, v in driver["spec"].items() if k not in ("affinity", "runtimeClassName")}
    spec.update(nodeName=node, serviceAccountName="default")
    meta = {"name": name, "namespace": namespace, "labels": driver["metadata"]["labels"]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


async def _batched(calls: list[Any], width: int = 16) -> None:
    for at in range(0, len(calls), width):
        await asyncio.gather(*calls[at : at + width])


async def _round(
    rest: Rest,
    namespace: str,
    names: list[str],
    protobuf: bool,
    patches: int,
    lists: int,
    apiserver: int,
    tag: str,
) -> dict[str, float]:
    spec = ResourceSpec(
        "pods",
        rest.lister(POD, namespace),
        transform=trim_pod,
        shape=PodShape,
        codec=POD_CODEC if protobuf else None,
        page_size=100,
    )
    informer: Informer[Any] = Informer(spec, lambda *_: None)
    task = asyncio.create_task(informer.run())
    try:
        await asyncio.wait_for(informer.synced.wait(), 60)
        await asyncio.sleep(1)
        server, own = process_cpu_seconds(apiserver), time.process_time()
        events = informer.events
        for n in range(patches):
            body = {"metadata": {"annotations": {"round": f"{tag}-{n}"}}}
            await _batched([rest.merge_patch(POD, name, body, namespace) for name in names])
        want = events + patches * len(names)
        await _until(lambda: informer.events >= want)
        watched = {
            "apiserver_cpu_s": process_cpu_seconds(apiserver) - server,
            "reader_cpu_s": time.process_time() - own,
        }
        server, own = process_cpu_seconds(apiserver), time.process_time()
        for _ in range(lists):
            await _list(rest, namespace, protobuf)
        return {
            **watched,
            "list_apiserver_cpu_s": process_cpu_seconds(apiserver) - server,
            "list_reader_cpu_s": time.process_time() - own,
        }
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _until(check: Any, timeout: float = 120.0) -> None:
    for _ in range(int(timeout / 0.05)):
        if check():
            return
        await asyncio.sleep(0.05)
    raise TimeoutError("the watch did not see every patch")


async def _list(rest: Rest, namespace: str, protobuf: bool) -> None:
    """Every pod, in pages of 100 as the operator lists them, decoded the same way."""
    call = rest.lister(POD, namespace)
    cont = ""
    while True:
        kwargs: dict[str, Any] = {"limit": 100, "_continue": cont}
        if protobuf:
            kwargs["_accept"] = PROTOBUF
        resp = await call(**kwargs)
        data = await resp.read()
        resp.release()
        page = POD_CODEC.page(data) if protobuf else SHAPED.page(data)
        for pod in page["items"]:
            trim_pod(pod)
        cont = page["metadata"].get("continue") or ""
        if not cont:
            return


async def measure(
    kubeconfig: Path, apiserver: int, pods: int, patches: int, lists: int, rounds: int
) -> dict[str, list[dict[str, float]]]:
    namespace = f"watch-cost-{uuid.uuid4().hex[:6]}"
    results: dict[str, list[dict[str, float]]] = {"json": [], "protobuf": []}
    async with api_client(kubeconfig) as api:
        rest = Rest(api, {})
        await rest.create(NAMESPACE, {"metadata": {"name": namespace}})
        for _ in range(300):
            if await rest.get(SERVICE_ACCOUNT, "default", namespace) is not None:
                break
            await asyncio.sleep(0.2)
        names = [f"driver-{i}" for i in range(pods)]
        await _batched(
            [
                rest.create(POD, _pod(n, f"gpu-node-{i % 4:04d}", namespace), namespace)
                for i, n in enumerate(names)
            ]
        )
        await asyncio.sleep(10)  # kwok: Running and Ready
        for r in range(rounds):
            order = ("json", "protobuf") if r % 2 == 0 else ("protobuf", "json")
            for wire in order:
                protobuf = wire == "protobuf"
                tag = f"{r}{wire}"
                got = await _round(rest, namespace, names, protobuf, patches, lists, apiserver, tag)
                results[wire].append(got)
                print(
                    f"round {r + 1} {wire:8s} " + " ".join(f"{k}={v:.2f}" for k, v in got.items()),
                    flush=True,
                )
        await rest.delete(NAMESPACE, namespace)
    return results


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.0f} ({min(values):.0f}..{max(values):.0f})"


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m tests.bench.watch_cost", description=__doc__)
    p.add_argument("--pods", type=int, default=200, help="operand pods watched (200)")
    p.add_argument(
        "--patches", type=int, default=3, help="annotation patches per pod per round (3)"
    )
    p.add_argument("--lists", type=int, default=10, help="LISTs of every pod per round (10)")
    p.add_argument("--rounds", type=int, default=6, help="rounds per wire, alternating (6)")
    p.add_argument("--cluster-dir", type=Path, default=Path("/tmp/gpuop-watch-cost-cluster"))
    p.add_argument("--output", type=Path, default=None, help="raw figures as JSON")
    args = p.parse_args()
    cluster = LocalCluster(args.cluster_dir)
    cluster.down()
    info = cluster.up(nodes=6, gpu_nodes=4, tie_to_parent=True)
    try:
        apiserver = cluster.pids()["kube-apiserver"]
        results = asyncio.run(
            measure(info.kubeconfig, apiserver, args.pods, args.patches, args.lists, args.rounds)
        )
    finally:
        cluster.down()
    events, listed = args.pods * args.patches, args.pods * args.lists
    for wire, runs in results.items():
        for what, key, per in (
            ("watch event", "", events),
            ("listed pod", "list_", listed),
        ):
            server = [r[f"{key}apiserver_cpu_s"] / per * 1e6 for r in runs]
            reader = [r[f"{key}reader_cpu_s"] / per * 1e6 for r in runs]
            print(
                f"{wire:8s} per {what}: kube-apiserver {_spread(server)} us, "
                f"this process {_spread(reader)} us ({len(runs)} rounds of {per})"
            )
    if args.output:
        args.output.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
