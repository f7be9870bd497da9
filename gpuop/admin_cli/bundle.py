"""`gpuop support-bundle`: what a bug report needs, read through the API into one archive.

The policies (ClusterPolicies, NVIDIADrivers, GPUClusters, status included), the
operator namespace's DaemonSets, Deployments and pods, its ConfigMaps by name only (no
Secret is read), every node's labels, annotations, taints and conditions, the Events of
the operator namespace and those about nodes and policies, and the logs of every pod of
the operator namespace (the operator's and the operands'), and cluster-wide the pods
asking for GPUs (a summary each) and the PrometheusRules. What cannot be read (a CRD
not installed, a node without a kubelet to serve logs, no right to a kind) becomes a
note in the archive, never a failure; only a cluster that cannot be reached at all is.
``manifest.json`` indexes the archive.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import re
import tarfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from gpuop import __version__
from gpuop.kube.client import api_client
from gpuop.kube.kinds import KINDS, by_kind
from gpuop.kube.rest import Rest
from gpuop.progress import Progress
from gpuop.upgrades_cli._commands import kubeconfig_for

Obj = dict[str, Any]

POLICY_KINDS = (
    ("clusterpolicies", by_kind("nvidia.com/v1", "ClusterPolicy")),
    ("nvidiadrivers", by_kind("nvidia.com/v1alpha1", "NVIDIADriver")),
    ("gpuclusters", by_kind("nvidia.com/v1alpha1", "GPUCluster")),
)
NAMESPACE_KINDS = (
    ("daemonsets", by_kind("apps/v1", "DaemonSet")),
    ("deployments", by_kind("apps/v1", "Deployment")),
    ("pods", by_kind("v1", "Pod")),
)
CONFIG_MAP = by_kind("v1", "ConfigMap")
NODE = by_kind("v1", "Node")
POD = by_kind("v1", "Pod")
EVENT = by_kind("v1", "Event")
PROMETHEUS_RULE = by_kind("monitoring.coreos.com/v1", "PrometheusRule")
EVENT_SUBJECTS = ("Node", "ClusterPolicy", "NVIDIADriver", "GPUCluster")
"""Cluster-scoped kinds whose Events (in whatever namespace) the bundle keeps."""

LOG_LIMIT_BYTES = 10 * 1024 * 1024
"""At most this much of one container's log (its most recent part)."""
LOG_TIMEOUT_SECONDS = 20
LOG_CONCURRENCY = 8

_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``30m``, ``2h``, ``1h30m`` as seconds (more than 0)."""
    text = text.strip()
    match = _DURATION.match(text)
    if text.isdigit():
        seconds = float(text)
    elif match and text:
        hours, minutes, secs = (int(g or 0) for g in match.groups())
        seconds = float(hours * 3600 + minutes * 60 + secs)
    else:
        raise ValueError(f"invalid duration {text!r}: use e.g. 90s, 30m, 2h or 1h30m")
    if seconds <= 0:
        raise ValueError(f"invalid duration {text!r}: must be more than 0")
    return seconds


def _why(err: BaseException) -> str:
    if isinstance(err, ApiException):
        return f"the API server answered {err.status} {(err.reason or '').strip()[:300]}".strip()
    if isinstance(err, TimeoutError):
        return "no answer in time"
    return " ".join((str(err) or type(err).__name__).split())


def _lean(obj: Obj) -> Obj:
    """An object without its managed fields (bulk no one reads)."""
    meta = dict(obj.get("metadata") or {})
    meta.pop("managedFields", None)
    return {**obj, "metadata": meta}


GPU_RESOURCE_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-")
"""Resources that make a pod a GPU user (as the driver manager's ``podUsesGPU``)."""


def gpu_pod_facts(pod: Obj) -> Obj | None:
    """What a pod asking for GPUs (a ``nvidia.com/gpu*`` or ``nvidia.com/mig-*`` request
    or limit, or a ResourceClaim) is and where it runs; None for any other pod. These
    are what keeps a driver from unloading (``gpuop doctor``'s driver-in-use)."""
    spec = pod.get("spec") or {}
    gpus: dict[str, str] = {}
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        resources = c.get("resources") or {}
        for section in ("limits", "requests"):
            for name, value in (resources.get(section) or {}).items():
                if str(name).startswith(GPU_RESOURCE_PREFIXES):
                    gpus.setdefault(str(name), str(value))
    claims = [str(r.get("name")) for r in spec.get("resourceClaims") or []]
    if not gpus and not claims:
        return None
    meta = pod.get("metadata") or {}
    owner = next((r for r in meta.get("ownerReferences") or [] if r.get("controller")), None)
    return {
        "namespace": meta.get("namespace"),
        "name": meta.get("name"),
        "node": spec.get("nodeName"),
        "phase": (pod.get("status") or {}).get("phase"),
        "gpus": gpus,
        "claims": claims,
        "owner": f"{owner.get('kind')}/{owner.get('name')}" if owner else None,
    }


def _node_facts(node: Obj) -> Obj:
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    return {
        "name": meta.get("name"),
        "labels": meta.get("labels") or {},
        "annotations": meta.get("annotations") or {},
        "taints": spec.get("taints") or [],
        "unschedulable": bool(spec.get("unschedulable")),
        "conditions": status.get("conditions") or [],
        "capacity": status.get("capacity") or {},
        "allocatable": status.get("allocatable") or {},
        "nodeInfo": status.get("nodeInfo") or {},
    }


class Bundle:
    """The archive's files as they are collected, and the index of them."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.files: dict[str, bytes] = {}
        self.index: dict[str, Obj] = {}

    def json(self, path: str, data: Any, **facts: Any) -> None:
        self.files[path] = (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()
        self.index[path] = {"bytes": len(self.files[path]), **facts}

    def text(self, path: str, data: bytes, **facts: Any) -> None:
        self.files[path] = data
        self.index[path] = {"bytes": len(data), **facts}

    def note(self, path: str, why: str) -> None:
        """What could not be collected for `path`, as a file next to where it would be."""
        self.text(f"{path}.unavailable.txt", f"{path}: not collected: {why}\n".encode(), note=why)

    def write(self, output: Path, manifest: Obj) -> None:
        """Atomically: a half-written archive never takes the output's name."""
        self.json("manifest.json", {**manifest, "files": self.index})
        partial = output.with_name(f".{output.name}.partial")
        with tarfile.open(partial, "w:gz") as tar:
            for path, data in sorted(self.files.items()):
                info = tarfile.TarInfo(f"{self.root}/{path}")
                info.size = len(data)
                info.mtime = int(time.time())
                info.mode = 0o644
                tar.addfile(info, io.BytesIO(data))
        os.replace(partial, output)


async def _list(
    bundle: Bundle, path: str, read: Callable[[], Awaitable[list[Obj]]]
) -> list[Obj] | None:
    """The items, or None (and a note for `path`) when they cannot be read."""
    try:
        items = await read()
    except (ApiException, aiohttp.ClientError, TimeoutError) as err:
        bundle.note(path, _why(err))
        return None
    return items


async def _log(
    core: client.CoreV1Api,
    bundle: Bundle,
    pod: Obj,
    container: str,
    since: float,
    previous: bool,
) -> None:
    name = pod["metadata"]["name"]
    path = f"logs/{name}/{container}{'.previous' if previous else ''}.log"
    try:
        text = await core.read_namespaced_pod_log(
            name,
            pod["metadata"]["namespace"],
            container=container,
            since_seconds=max(1, int(since)),
            timestamps=True,
            previous=previous,
            limit_bytes=LOG_LIMIT_BYTES,
            _request_timeout=LOG_TIMEOUT_SECONDS,
        )
    except (ApiException, aiohttp.ClientError, TimeoutError) as err:
        # A node without a kubelet (kwok's), a container not started yet, a node gone.
        bundle.note(path, _why(err))
        return
    data = text.encode() if isinstance(text, str) else bytes(text or b"")
    bundle.text(path, data, pod=name, container=container)


def _containers(pod: Obj) -> list[tuple[str, bool]]:
    """(container, previous) of every log worth reading: each container's current one,
    and the one before for containers that restarted."""
    spec = pod.get("spec") or {}
    restarts = {
        s.get("name"): int(s.get("restartCount") or 0)
        for s in [
            *((pod.get("status") or {}).get("initContainerStatuses") or []),
            *((pod.get("status") or {}).get("containerStatuses") or []),
        ]
    }
    found: list[tuple[str, bool]] = []
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        found.append((c["name"], False))
        if restarts.get(c["name"]):
            found.append((c["name"], True))
    return found


async def collect(
    api: client.ApiClient,
    namespace: str,
    since: float,
    bundle: Bundle,
    progress: Progress,
    logs_of: Callable[[Obj, str], bool] | None = None,
) -> Obj:
    """Everything into `bundle`; returns what manifest.json says of the cluster.
    ``logs_of(pod, container)`` picks the logs to read (default: every container's)."""
    rest = Rest(api, KINDS)
    version = await client.VersionApi(api).get_code()  # unreachable: the one error line
    progress.total = len(POLICY_KINDS) + len(NAMESPACE_KINDS) + 4

    for name, kind in POLICY_KINDS:
        path = f"cluster/{name}.json"
        items = await _list(bundle, path, lambda kind=kind: rest.list(kind))  # type: ignore[misc]
        if items is not None:
            bundle.json(path, [_lean(i) for i in items], items=len(items))
        progress.advance(detail=name)

    pods: list[Obj] = []
    for name, kind in NAMESPACE_KINDS:
        path = f"namespace/{name}.json"
        items = await _list(bundle, path, lambda kind=kind: rest.list(kind, namespace))  # type: ignore[misc]
        if items is not None:
            bundle.json(path, [_lean(i) for i in items], items=len(items))
        if name == "pods":
            pods = items or []
        progress.advance(detail=name)

    path = "namespace/configmaps.json"
    maps = await _list(bundle, path, lambda: rest.list(CONFIG_MAP, namespace))
    if maps is not None:
        names = sorted(m["metadata"]["name"] for m in maps)
        bundle.json(path, names, items=len(names), content="names only")
    progress.advance(detail="configmaps")

    path = "nodes.json"
    nodes = await _list(bundle, path, lambda: rest.list(NODE))
    if nodes is not None:
        bundle.json(path, [_node_facts(n) for n in nodes], items=len(nodes))
    progress.advance(detail="nodes")

    # Cluster-wide: the pods holding GPUs (whatever their namespace) and the alert
    # rules (wherever a Prometheus reads them); a CRD not installed is a note.
    path = "cluster/gpu-pods.json"
    live = "status.phase!=Succeeded,status.phase!=Failed"
    every_pod = await _list(bundle, path, lambda: rest.list(POD, field_selector=live))
    if every_pod is not None:
        users = [f for f in map(gpu_pod_facts, every_pod) if f is not None]
        bundle.json(path, users, items=len(users), content="pods asking for GPUs")
    path = "cluster/prometheusrules.json"
    rules = await _list(bundle, path, lambda: rest.list(PROMETHEUS_RULE))
    if rules is not None:
        bundle.json(path, [_lean(r) for r in rules], items=len(rules))
    progress.advance(detail="gpu pods, alert rules")

    events: dict[str, Obj] = {}
    path = "events.json"
    readers: list[Callable[[], Awaitable[list[Obj]]]] = [lambda: rest.list(EVENT, namespace)]
    for subject in EVENT_SUBJECTS:
        selector = f"involvedObject.kind={subject}"
        readers.append(lambda s=selector: rest.list(EVENT, field_selector=s))  # type: ignore[misc]
    for read in readers:
        for event in await _list(bundle, path, read) or []:
            events[event["metadata"].get("uid") or event["metadata"]["name"]] = _lean(event)
    ordered = sorted(
        events.values(),
        key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""),
    )
    bundle.json(path, ordered, items=len(ordered))
    progress.advance(detail="events")

    logs = [
        (pod, c, prev)
        for pod in pods
        for c, prev in _containers(pod)
        if logs_of is None or logs_of(pod, c)
    ]
    progress.total += len(logs)
    core = client.CoreV1Api(api)
    gate = asyncio.Semaphore(LOG_CONCURRENCY)

    async def one(pod: Obj, container: str, previous: bool) -> None:
        async with gate:
            await _log(core, bundle, pod, container, since, previous)
        progress.advance(detail=f"logs {pod['metadata']['name']}/{container}")

    await asyncio.gather(*(one(*log) for log in logs))
    return {"server": getattr(version, "git_version", None)}


def default_output() -> Path:
    return Path(f"gpuop-support-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.tar.gz")


async def _main(args: argparse.Namespace) -> int:
    output = Path(args.output) if args.output else default_output()
    if not output.parent.is_dir():
        raise ValueError(f"--output {output}: no directory {output.parent}")
    root = output.name.removesuffix(".tar.gz").removesuffix(".tgz") or "gpuop-support"
    bundle = Bundle(root)
    kubeconfig = kubeconfig_for(args)
    progress = Progress("support-bundle", total=1)
    async with api_client(kubeconfig, user_agent="gpuop-support-bundle") as api:
        try:
            cluster = await collect(api, args.namespace, args.since, bundle, progress)
        except BaseException:
            progress.finish("failed")
            raise
    manifest = {
        "gpuop": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "namespace": args.namespace,
        "sinceSeconds": int(args.since),
        **cluster,
    }
    bundle.write(output, manifest)
    notes = sum("note" in facts for facts in bundle.index.values())
    progress.finish(f"{len(bundle.index)} files, {notes} not collected (see manifest.json)")
    print(f"support bundle: {output}")
    return 0


def cmd_support_bundle(args: argparse.Namespace) -> int:
    code: int = asyncio.run(_main(args))
    return code
