"""``python -m tests.bench.record_wire --kubeconfig K``: record operand pods as the API
server sends them, in JSON and in protobuf, for the codec's unit tests and the decode
micro-benchmark (``python -m tests.bench.parse``).

The operand pods of ``tests/bench/fixtures/gpu-node.json`` and ``tests/data/
operand_pods.json`` (spec and labels as a 1,000-node benchmark cluster had them) are
created in a fresh namespace on the local cluster's GPU nodes, where kwok makes them
Running and Ready; one gets an annotation (a change the pods cache does not keep) and a
label; then all are deleted. Two watches from the same resourceVersion, one JSON, one
protobuf, see the same events; both streams are written as received
(``tests/data/operand_pods.watch.{jsonl,pb}``), with one LIST page of the pods in each
encoding (``operand_pods.list.{json,pb}``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import gpuop  # noqa: F401  (installs the lazy kubernetes-asyncio packages first)
from gpuop.kube._pb_wire import PROTOBUF, Frames
from gpuop.kube.client import api_client
from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Rest

POD = by_kind("v1", "Pod")
NAMESPACE = by_kind("v1", "Namespace")
SERVICE_ACCOUNT = by_kind("v1", "ServiceAccount")
DATA = Path(__file__).parent.parent / "data"
SOURCES = (Path(__file__).parent / "fixtures" / "gpu-node.json", DATA / "operand_pods.json")


def _templates() -> list[dict[str, Any]]:
    pods: list[dict[str, Any]] = []
    node = json.loads(SOURCES[0].read_text())
    pods += node["pods"]
    pods += json.loads(SOURCES[1].read_text())
    return pods


def _pod(template: dict[str, Any], i: int, namespace: str) -> dict[str, Any]:
    """The pod as it can be created again: its labels and spec, on a local GPU node."""
    meta = template["metadata"]
    spec = dict(template["spec"])
    spec["nodeName"] = f"gpu-node-{i % 4:04d}"
    spec.pop("affinity", None)  # kwok nodes of the local cluster have other names
    spec.pop("runtimeClassName", None)  # no RuntimeClass in a bare namespace
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{meta['name']}-{i}",
            "namespace": namespace,
            "labels": meta["labels"],
        },
        "spec": spec,
    }


async def _watch(rest: Rest, namespace: str, rv: str, accept: str, pods: int) -> bytes:
    """The raw watch stream from ``rv`` until every one of ``pods`` pods is deleted."""
    call = rest.lister(POD, namespace)
    resp = await call(watch=True, resource_version=rv, timeout_seconds=120, _accept=accept)
    chunks: list[bytes] = []
    deleted = 0
    frames = Frames()
    async with resp:
        protobuf = resp.headers.get("Content-Type", "").startswith(PROTOBUF)
        while deleted < pods:
            if protobuf:
                chunk = await resp.content.readany()
                if not chunk:
                    break
                for frame in frames.feed(chunk):
                    chunks.append(len(frame).to_bytes(4, "big") + frame)
                    deleted += b"DELETED" in frame[:16]
            else:
                line = await resp.content.readline()
                if not line:
                    break
                chunks.append(line)
                deleted += json.loads(line)["type"] == "DELETED"
    return b"".join(chunks)


async def _page(rest: Rest, namespace: str, accept: str) -> bytes:
    resp = await rest.lister(POD, namespace)(limit=6, _accept=accept)
    data: bytes = await resp.read()
    resp.release()
    return data


async def record(kubeconfig: Path) -> dict[str, bytes]:
    """The recordings by file name."""
    namespace = f"wire-{uuid.uuid4().hex[:6]}"
    async with api_client(kubeconfig) as api:
        rest = Rest(api, {})
        await rest.create(NAMESPACE, {"metadata": {"name": namespace}})
        try:
            listed = await rest.lister(POD, namespace)()
            rv = json.loads(await listed.read())["metadata"]["resourceVersion"]
            listed.release()
            templates = _templates()
            watches = [
                asyncio.create_task(_watch(rest, namespace, rv, accept, len(templates)))
                for accept in ("application/json", PROTOBUF)
            ]
            accounts = {t["spec"].get("serviceAccountName") or "default" for t in templates}
            for account in sorted(accounts):
                body = {"metadata": {"name": account}}
                await rest.create(SERVICE_ACCOUNT, body, namespace)
            names = []
            for i, template in enumerate(templates):
                created = await rest.create(POD, _pod(template, i, namespace), namespace)
                names.append(created["metadata"]["name"])
            await asyncio.sleep(5)  # kwok: Running and Ready
            patch = {"metadata": {"annotations": {"recorded": "yes"}}}
            await rest.merge_patch(POD, names[0], patch, namespace)
            patch = {"metadata": {"labels": {"recorded": "yes"}}}
            await rest.merge_patch(POD, names[0], patch, namespace)
            pages = {
                accept: await _page(rest, namespace, accept)
                for accept in ("application/json", PROTOBUF)
            }
            for name in names:
                await rest.delete(POD, name, namespace)
            streams = await asyncio.wait_for(asyncio.gather(*watches), 120)
        finally:
            await rest.delete(NAMESPACE, namespace)
    return {
        "operand_pods.watch.jsonl": streams[0],
        "operand_pods.watch.pb": streams[1],
        "operand_pods.list.json": pages[0],
        "operand_pods.list.pb": pages[1],
    }


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m tests.bench.record_wire", description=__doc__)
    p.add_argument("--kubeconfig", type=Path, required=True, help="the local cluster's")
    p.add_argument("--out", type=Path, default=DATA, help="where the recordings go")
    args = p.parse_args()
    recorded = asyncio.run(record(args.kubeconfig))
    args.out.mkdir(parents=True, exist_ok=True)
    for name, data in recorded.items():
        (args.out / name).write_bytes(data)
    events = recorded["operand_pods.watch.jsonl"].count(b"\n")
    print(f"{events} events of {len(_templates())} pods written to {args.out}")


if __name__ == "__main__":
    main()
