"""What the controller keeps of a Node, and which changes deserve a reconcile.

Nodes are most of the operator's memory at fleet scale; keeping only the fields
it reads (its labels and annotations, schedulability, taints, Ready, the node agent's
GPUHealthy, allocatable) keeps
a node to a few hundred bytes instead of several kilobytes. Labels, schedulability
and status are shared between nodes alike, annotations (timestamps, unique to the
node) are a read-only dict of interned strings (:mod:`gpuop.kube.compact`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from components.keys import NFD_GPU_LABELS, is_gpu_node, nfd_labels_away
from components.labels import any_mig_capable
from gpuop.kube.compact import frozen, shared
from gpuop.kube.informer import Informer
from statemachine.remediation import CONDITION_GPU_HEALTHY as GPU_HEALTHY
from statemachine.stale_pods import out_of_service

Obj = dict[str, Any]

#: The node labels the operator reads: its own and GFD's (``nvidia.com/``), NFD's
#: PCI device labels (how a GPU node is recognised) and NFD's OS release and kernel
#: (the driver image tag). Real nodes carry dozens of other NFD and cloud labels;
#: keeping them would cost memory on every node and wake a reconcile whenever one
#: changed, for nothing.
READ_LABEL_PREFIXES = (
    "nvidia.com/",
    "feature.node.kubernetes.io/pci-",
    "feature.node.kubernetes.io/system-os_release.ID",
    "feature.node.kubernetes.io/system-os_release.VERSION_ID",
    "feature.node.kubernetes.io/kernel-version.full",
)
#: Read-prefixed labels the operator never reads and that differ on every node: GFD's
#: ``nvidia.com/gfd.timestamp`` (when it last labelled the node). Left out, the labels
#: the operator keeps are the same on every node of one GPU model and state, so they
#: are pooled (one shared dict for all of them; ``tests.bench.cache_size``) instead of
#: one dict of 20 to 40 entries per node.
UNREAD_UNIQUE_LABELS = frozenset({"nvidia.com/gfd.timestamp"})
#: The node annotations the operator reads: the upgrade state it records.
READ_ANNOTATION_PREFIXES = ("nvidia.com/", "gpuop.io/")


def trim_node(node: Obj, extra_labels: frozenset[str] = frozenset()) -> Obj:
    """What the cache keeps of ``node``: the labels under ``READ_LABEL_PREFIXES`` and those
    named in ``extra_labels`` (keys an NVIDIADriver's ``nodeSelector`` reads)."""
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    ready = [c for c in status.get("conditions") or [] if c.get("type") == "Ready"]
    info = status.get("nodeInfo") or {}
    health = [c for c in status.get("conditions") or [] if c.get("type") == GPU_HEALTHY]
    trimmed = {
        "metadata": {
            "name": shared(meta.get("name")),  # also every pod's nodeName
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
            # When a new node's pods started to be due (per-node rollout, stuck nodes).
            "creationTimestamp": meta.get("creationTimestamp"),
            "labels": shared(_labels(meta.get("labels"), extra_labels)),
            "annotations": frozen(_read(meta.get("annotations"), READ_ANNOTATION_PREFIXES)),
        },
        "spec": shared({k: spec[k] for k in ("unschedulable", "taints") if k in spec}),
        "status": shared(
            {
                "conditions": [{"type": "Ready", "status": c.get("status")} for c in ready],
                "allocatable": status.get("allocatable") or {},
                # Which runtime the toolkit must configure (shared: nodes alike).
                "nodeInfo": {"containerRuntimeVersion": info.get("containerRuntimeVersion")},
            }
        ),
    }
    if health:
        # Apart from the pooled status: its transition time is unique to the node, and
        # pooling unique values costs more than it saves (1000 nodes, tests/bench
        # fixture: 6.0 KiB per node pooled, 4.0 apart, 3.7 without the condition).
        trimmed[GPU_HEALTHY] = frozen(
            {k: str(health[0][k]) for k in _HEALTH_FIELDS if k in health[0]}
        )
    return trimmed


def _labels(values: dict[str, str] | None, extra: frozenset[str]) -> dict[str, str]:
    kept = _read(values, READ_LABEL_PREFIXES, UNREAD_UNIQUE_LABELS)
    for key in extra:
        if values and key in values:
            kept[key] = values[key]
    return kept


def selector_label_keys(selectors: Iterable[Mapping[str, str] | None]) -> frozenset[str]:
    """The label keys of ``selectors`` the cache does not keep by prefix: a node
    selector on any label must see it (NVIDIADriver ``nodeSelector``: a cloud
    node-pool label, say)."""
    return frozenset(
        key
        for selector in selectors
        for key in selector or {}
        if not key.startswith(READ_LABEL_PREFIXES) or key in UNREAD_UNIQUE_LABELS
    )


@dataclass
class NodeTrim:
    """The node cache's transform: :func:`trim_node` with the label keys some selector
    reads beyond the prefixes. Changing them asks the cache to list again, so the
    kept labels of every node follow."""

    extra_labels: frozenset[str] = frozenset()

    def __call__(self, node: Obj) -> Obj:
        return trim_node(node, self.extra_labels)


#: Of the node agent's condition, what remediation reads (not the heartbeat time, which
#: would make every report a change).
_HEALTH_FIELDS = ("type", "status", "reason", "message", "lastTransitionTime")


def gpu_health(node: Obj) -> Obj | None:
    """The node's GPUHealthy condition as kept, or None."""
    kept = node.get(GPU_HEALTHY)
    return dict(kept) if kept is not None else None


def _read(
    values: dict[str, str] | None, prefixes: tuple[str, ...], unread: frozenset[str] = frozenset()
) -> dict[str, str]:
    """The entries the operator reads: under ``prefixes``, less the ``unread`` keys."""
    return {k: v for k, v in (values or {}).items() if k.startswith(prefixes) and k not in unread}


def node_fingerprint(node: Obj | None) -> Any:
    """Everything a node reconcile reads; heartbeats alone do not change it."""
    if node is None:
        return None
    meta = node["metadata"]
    return (
        tuple(sorted(meta["labels"].items())),
        tuple(sorted(meta["annotations"].items())),
        node["spec"].get("unschedulable", False),
        repr(node["spec"].get("taints")),
        is_ready(node),
        (node["status"].get("nodeInfo") or {}).get("containerRuntimeVersion"),
        repr(gpu_health(node)),
    )


def is_ready(node: Obj) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in node["status"].get("conditions", [])
    )


def node_out_of_service(node: Obj) -> bool:
    """:func:`statemachine.stale_pods.out_of_service` of a cached node."""
    conditions = node["status"].get("conditions") or []
    ready = next((str(c.get("status")) for c in conditions if c.get("type") == "Ready"), None)
    return out_of_service(ready, node["spec"].get("taints") or [])


def labels(node: Obj) -> dict[str, str]:
    result: dict[str, str] = node["metadata"]["labels"]
    return result


def node_annotations(node: Obj) -> dict[str, str]:
    """The node's annotations as kept (those under ``READ_ANNOTATION_PREFIXES``)."""
    result: dict[str, str] = node["metadata"].get("annotations") or {}
    return result


class GpuFleet(NamedTuple):
    nodes: tuple[Obj, ...]
    """The GPU nodes, by name."""
    has_nfd: bool
    """NFD labelled some node (a GPU node or not)."""
    mig_capable: bool
    """Some GPU node is MIG-capable (the MIG manager is wanted)."""
    out_of_service: tuple[Obj, ...] = ()
    """The GPU nodes not Ready and marked out of service (:func:`node_out_of_service`),
    by name: the only ones whose pods the cluster pass may force-delete, so it need not
    look at the others on every pass."""
    nfd_away: int = 0
    """How many GPU nodes are GPU nodes only because NFD's labels are away from them
    (:func:`components.keys.nfd_labels_away`): their OS and kernel are unknown meanwhile."""
    version: int = 0
    """The node cache's version these were read at: what a memo of anything worked out
    from them must be keyed on. The cache's version read later may be newer (a node
    pass wrote labels while the cluster pass awaited the API server), and a memo keyed
    on that kept a count of the older nodes: new DaemonSets held for a minute."""


class GpuNodes:
    """The node cache's GPU nodes and what the cluster pass reads of the whole fleet,
    worked out again only once the cache changed: the pass runs on a rollout's pod
    events, and scanning every node's labels each time was about a sixth of its CPU
    (py-spy, 1,000 nodes)."""

    def __init__(self, nodes: Informer) -> None:
        self._nodes = nodes
        self._memo: tuple[int, GpuFleet] | None = None

    def __call__(self) -> GpuFleet:
        version = self._nodes.version
        if self._memo is None or self._memo[0] != version:
            nodes = self._nodes.values()
            gpu = tuple(
                sorted(
                    (n for n in nodes if is_gpu_node(labels(n))),
                    key=lambda n: str(n["metadata"]["name"]),
                )
            )
            fleet = GpuFleet(
                nodes=gpu,
                has_nfd=any(any(k in labels(n) for k in NFD_GPU_LABELS) for n in nodes),
                mig_capable=any_mig_capable(labels(n) for n in gpu),
                out_of_service=tuple(n for n in gpu if node_out_of_service(n)),
                nfd_away=sum(1 for n in gpu if nfd_labels_away(labels(n))),
                version=version,
            )
            self._memo = (version, fleet)
        return self._memo[1]
