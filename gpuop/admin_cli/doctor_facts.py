"""What `gpuop doctor` reads, as one value: a support bundle's files turned into a
:class:`Snapshot`. Pure: the shell hands in the files (from an archive, a directory, or
collected from a live cluster into memory), so the rules see the same thing either way.

A file the bundle could not collect (a ``*.unavailable.txt`` note) is ``None`` here,
not an empty list: a rule that needs it stays silent rather than guessing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]

DRIVER_MANAGER = "k8s-driver-manager"
"""The driver pod's init container that unloads the old driver (NVIDIA/k8s-driver-manager)."""
DRIVER_COMPONENTS = ("nvidia-driver", "nvidia-vgpu-host-manager")
"""``app.kubernetes.io/component`` of driver pods (ClusterPolicy and NVIDIADriver)."""
COMPONENT_LABEL = "app.kubernetes.io/component"


@dataclass(frozen=True)
class Finding:
    """One known signature found: its cause and fix, and the objects that show it
    (``kind/name`` or ``namespace/name``), so an admin knows where to look."""

    rule: str
    cause: str
    fix: str
    objects: tuple[str, ...] = ()

    def line(self) -> str:
        where = f" [{', '.join(self.objects)}]" if self.objects else ""
        return f"{self.rule}: {self.cause}{where}; fix: {self.fix}"


@dataclass(frozen=True)
class Excerpt:
    """Text a container left: its log, or a message in its status (a termination
    message, a waiting reason's message), with the pod it came from."""

    pod: str
    container: str
    text: str
    node: str | None = None


@dataclass(frozen=True)
class Snapshot:
    """The cluster as one bundle saw it; ``None`` where the bundle has no such file."""

    namespace: str
    policies: list[Obj] | None = None
    nvidiadrivers: list[Obj] | None = None
    daemonsets: list[Obj] | None = None
    pods: list[Obj] | None = None
    configmaps: list[str] | None = None
    nodes: list[Obj] | None = None
    """Node facts as the bundle keeps them (name, labels, annotations, nodeInfo...)."""
    events: list[Obj] | None = None
    gpu_pods: list[Obj] | None = None
    """Pods of any namespace asking for GPUs (``bundle.gpu_pod_facts``)."""
    prometheus_rules: list[Obj] | None = None
    logs: Mapping[tuple[str, str], str] = field(default_factory=dict)
    """(pod, container) to its log text (the previous run's first, then the current)."""

    def pod_node(self, pod: str) -> str | None:
        for p in self.pods or []:
            if p["metadata"]["name"] == pod:
                node = (p.get("spec") or {}).get("nodeName")
                return str(node) if node else None
        return None

    def active_policy(self) -> Obj | None:
        """The ClusterPolicy that acts: the one not ``ignored`` (the oldest if unsure)."""
        live = [p for p in self.policies or [] if (p.get("status") or {}).get("state") != "ignored"]
        live.sort(key=lambda p: str(p["metadata"].get("creationTimestamp") or ""))
        return live[0] if live else None


def _json(files: Mapping[str, bytes], path: str) -> Any:
    data = files.get(path)
    return None if data is None else json.loads(data)


def _logs(files: Mapping[str, bytes]) -> dict[tuple[str, str], str]:
    """``logs/<pod>/<container>[.previous].log`` joined per container, previous first."""
    found: dict[tuple[str, str], list[tuple[bool, str]]] = {}
    for path, data in files.items():
        parts = path.split("/")
        if len(parts) != 3 or parts[0] != "logs" or not parts[2].endswith(".log"):
            continue
        name = parts[2].removesuffix(".log")
        previous = name.endswith(".previous")
        container = name.removesuffix(".previous")
        text = data.decode(errors="replace")
        found.setdefault((parts[1], container), []).append((not previous, text))
    return {key: "\n".join(t for _, t in sorted(runs)) for key, runs in found.items()}


def snapshot_from_files(files: Mapping[str, bytes]) -> Snapshot:
    """A bundle's files (paths relative to its root) as a snapshot."""
    manifest = _json(files, "manifest.json") or {}
    return Snapshot(
        namespace=str(manifest.get("namespace") or "gpu-operator"),
        policies=_json(files, "cluster/clusterpolicies.json"),
        nvidiadrivers=_json(files, "cluster/nvidiadrivers.json"),
        daemonsets=_json(files, "namespace/daemonsets.json"),
        pods=_json(files, "namespace/pods.json"),
        configmaps=_json(files, "namespace/configmaps.json"),
        nodes=_json(files, "nodes.json"),
        events=_json(files, "events.json"),
        gpu_pods=_json(files, "cluster/gpu-pods.json"),
        prometheus_rules=_json(files, "cluster/prometheusrules.json"),
        logs=_logs(files),
    )


# ----------------------------------------------------------------- pods
def container_statuses(pod: Obj) -> list[Obj]:
    status = pod.get("status") or {}
    return [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]


def status_messages(status: Obj) -> list[str]:
    """The messages of a container status: waiting, terminated, last terminated."""
    states = [status.get("state") or {}, status.get("lastState") or {}]
    return [
        str(s[k]["message"])
        for s in states
        for k in ("waiting", "terminated")
        if (s.get(k) or {}).get("message")
    ]


def troubled(pod: Obj, container: str) -> bool:
    """Whether a container's log may say what is wrong: it restarted, waits, failed, or
    runs without being ready (an init container looping on a check). A healthy or
    not-yet-started container's log is not read (a large cluster has many)."""
    for status in container_statuses(pod):
        if status.get("name") != container:
            continue
        state = status.get("state") or {}
        terminated = state.get("terminated")
        return (
            int(status.get("restartCount") or 0) > 0
            or "waiting" in state
            or (terminated is not None and terminated.get("exitCode") != 0)
            or ("running" in state and not status.get("ready"))
        )
    return False


def is_driver_pod(pod: Obj) -> bool:
    labels = pod.get("metadata", {}).get("labels") or {}
    inits = (pod.get("spec") or {}).get("initContainers") or []
    return labels.get(COMPONENT_LABEL) in DRIVER_COMPONENTS or any(
        c.get("name") == DRIVER_MANAGER for c in inits
    )


def excerpts(snapshot: Snapshot) -> Iterator[Excerpt]:
    """Every text a container of the operator namespace left: its logs where the bundle
    has them, and the messages in its status (what a live cluster without logs, or a
    kubelet's termination message, still tells)."""
    for (name, container), text in sorted(snapshot.logs.items()):
        yield Excerpt(name, container, text, snapshot.pod_node(name))
    for pod in snapshot.pods or []:
        name = pod["metadata"]["name"]
        node = (pod.get("spec") or {}).get("nodeName")
        for status in container_statuses(pod):
            for message in status_messages(status):
                yield Excerpt(name, str(status.get("name")), message, node)
