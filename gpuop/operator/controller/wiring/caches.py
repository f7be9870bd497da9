"""The operator's watch caches: what each one lists and keeps, and whom it tells.

Built once by the operator; every unit reads them, none builds its own copy. Each
cache names its event handler at construction (:class:`CacheEvents`), so this module
knows nothing of what an event wakes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from components._k8s import MANAGED_BY, MANAGED_BY_LABEL
from gpuop.kube._pb_wire import PodCodec
from gpuop.kube.informer import Informer, Obj, ResourceSpec
from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Kind, Rest
from gpuop.operator.controller.base.optional_watches import ALWAYS_WATCHED, OptionalWatches
from gpuop.operator.controller.views.active_policy import ActivePolicies
from gpuop.operator.controller.views.node_views import NodeTrim
from gpuop.operator.controller.views.pod_records import (
    PodRecord,
    PodShape,
    pod_index,
    record_of_message,
    trim_pod,
    trim_revision,
)

MANAGED_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY}"
UPSTREAM_MANAGED_BY = "gpu-operator"
"""What NVIDIA's operator's operand pods carry (its chart's `daemonsets.labels`)."""
DRA_VALIDATOR_SELECTOR = "app.kubernetes.io/name=nvidia-dra-validator"
"""The DRA validator's pods (`components.dra.monitoring.VALIDATOR`'s own label)."""
OPERAND_SELECTOR = MANAGED_BY_LABEL
"""Operand pods and revisions: every one with a `managed-by` label, whatever its value.
The policy's `daemonsets.labels` win on pods (as upstream), so ours may say `gpuop`,
`gpu-operator` (upstream's chart policy) or anything else; and the pods NVIDIA's
operator left running carry `gpu-operator` and mostly no `part-of`, and must be seen
after a hand-over (restarted, not reinstalled, by the upgrade machine). Any other pod
in the operator's namespace that has the label (the operator's own) costs one entry."""
BOUND_PODS = "spec.nodeName!="
"""The operand pods cache holds only pods the scheduler has placed. A DaemonSet's pod
is created unbound and bound a moment later; nothing reads it before (it is in no
node's view and runs nothing), and its binding comes as its ADDED: a third of a
rollout's pod events, and their encoding in the API server (issue 49). Our unbound
pods, which a GPU claim asks about, are read from the API
(``WorkloadHandovers.claimants_now``)."""
POD_BATCH_S = 0.02
"""The operand pods watch is read in batches this long (``ResourceSpec.batch_seconds``):
a rollout's pod events then cost one socket wake-up and TLS read per batch, not per
event; each waits at most 20 ms more (event to write p99: 200 ms allowed)."""
NODE = by_kind("v1", "Node")
POLICY = by_kind("nvidia.com/v1", "ClusterPolicy")
POD = by_kind("v1", "Pod")
REVISION = by_kind("apps/v1", "ControllerRevision")


class CacheEvents(Protocol):
    """Where each cache's events go (the operator's router)."""

    def on_node(self, event: str, old: Obj | None, new: Obj | None) -> None: ...
    def on_policy(self, event: str, old: Obj | None, new: Obj | None) -> None: ...
    def on_owned(self, kind: Kind, event: str, old: Obj | None, new: Obj | None) -> None: ...
    def on_pod(self, event: str, old: PodRecord | None, new: PodRecord | None) -> None: ...
    def pod_unchanged(self, old: PodRecord, new: PodRecord) -> bool: ...
    def on_dra_validator(
        self, event: str, old: PodRecord | None, new: PodRecord | None
    ) -> None: ...
    def on_revision(self, event: str, old: Obj | None, new: Obj | None) -> None: ...


@dataclass(frozen=True, kw_only=True)
class Caches:
    """Every cache the operator watches through (the NVIDIADriver, GPUCluster and
    site-ConfigMap caches belong to the units that follow those kinds)."""

    nodes: Informer
    node_trim: NodeTrim
    """What the node cache keeps; NVIDIADriver node selectors widen it."""
    policies: Informer
    active: ActivePolicies
    owned: dict[str, Informer]
    watches: OptionalWatches
    """Kinds a CRD may serve (ServiceMonitor): watched once discovery finds them."""
    pods: Informer[PodRecord]
    """Every operand pod bound to a node, as a PodRecord: the per-node rollout reads
    each component's pod, so the pods outnumber every other object we keep."""
    dra_validators: Informer[PodRecord]
    """The DRA validator's pods: beside a GPUCluster an NVIDIADriver upgrade's
    validation waits for them (they carry upstream's labels only, so the operand pods
    cache, selected on managed-by, does not hold them)."""
    revisions: Informer


def build_caches(
    rest: Rest, namespace: str, to: CacheEvents, on_new_watch: Callable[[], None]
) -> Caches:
    """The caches, not yet running (``Informer.run``); ``on_new_watch`` hears when
    discovery starts an optional one."""
    node_trim = NodeTrim()
    nodes = Informer(
        # A LIST page is parsed whole before it is trimmed, and all caches list at
        # once on start: small pages keep the restart's peak RSS down.
        ResourceSpec("nodes", rest.lister(NODE), transform=node_trim, page_size=100),
        to.on_node,
    )
    policies = Informer(ResourceSpec("clusterpolicies", rest.lister(POLICY)), to.on_policy)

    def owned_informer(kind: Kind) -> Informer:
        lister = rest.lister(kind, namespace if kind.namespaced else None)
        spec = ResourceSpec(kind.plural, lister, label_selector=MANAGED_SELECTOR)
        return Informer(spec, lambda event, old, new: to.on_owned(kind, event, old, new))

    owned: dict[str, Informer] = {k.kind: owned_informer(k) for k in ALWAYS_WATCHED}
    pods: Informer[PodRecord] = Informer(
        pod_spec(
            rest,
            namespace,
            "pods",
            OPERAND_SELECTOR,
            # As protobuf: the API server encodes it far cheaper than JSON, which it
            # builds for this one watch on the cluster (issue 49); decoded straight
            # into records.
            codec=PodCodec(build=record_of_message),
            field_selector=BOUND_PODS,
            batch_seconds=POD_BATCH_S,
            unchanged=to.pod_unchanged,
            track_index_changes=True,  # the per-node view redoes only changed nodes
        ),
        to.on_pod,
    )
    revisions = Informer(
        ResourceSpec(
            "controllerrevisions",
            rest.lister(REVISION, namespace),
            label_selector=OPERAND_SELECTOR,
            transform=trim_revision,
        ),
        to.on_revision,
    )
    return Caches(
        nodes=nodes,
        node_trim=node_trim,
        policies=policies,
        active=ActivePolicies(policies),
        owned=owned,
        watches=OptionalWatches(owned, owned_informer, on_new_watch),
        pods=pods,
        dra_validators=Informer(
            pod_spec(rest, namespace, "dra-validator-pods", DRA_VALIDATOR_SELECTOR),
            to.on_dra_validator,
        ),
        revisions=revisions,
    )


def pod_spec(
    rest: Rest, namespace: str, name: str, selector: str, **extra: Any
) -> ResourceSpec[PodRecord]:
    """A pods cache of the operator's namespace kept as :class:`PodRecord`, indexed by
    node; ``extra`` adds what only the operand pods cache needs."""
    return ResourceSpec(
        name,
        rest.lister(POD, namespace),
        label_selector=selector,
        transform=trim_pod,
        shape=PodShape,
        index=pod_index,
        page_size=100,
        **extra,
    )
