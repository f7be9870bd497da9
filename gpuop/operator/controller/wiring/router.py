"""The operator's event router: every watch event and every unit's own news ends here.

Each handler keeps the operator's books (the applier's, the pace's, the driver pods
NVIDIADrivers follows), asks :mod:`gpuop.operator.controller.views.routes` once what the event
wakes,
and queues that: no unit queues anything from an event.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from gpuop.log import get_logger
from gpuop.operator.controller.base.keys import CLUSTER_KEY, node_key
from gpuop.operator.controller.views.node_views import selector_label_keys
from gpuop.operator.controller.views.objects import is_driver_object
from gpuop.operator.controller.views.pod_records import PodRecord, same_pod
from gpuop.operator.controller.views.routes import (
    Wake,
    reads_validators,
    route_gpucluster,
    route_gpucluster_object,
    route_gpucluster_presence,
    route_node,
    route_nvidiadriver,
    route_nvidiadrivers_listed,
    route_owned,
    route_pod,
    route_policy,
    route_revision,
    route_site_config,
)
from gpuop.operator.controller.writers.apply import Applier, object_key

if TYPE_CHECKING:
    from gpuop.kube.informer import Obj
    from gpuop.kube.rest import Kind
    from gpuop.kube.workqueue import WorkQueue
    from gpuop.operator.controller.base.pace import ProgressPace
    from gpuop.operator.controller.passes.cluster import ClusterReconciler
    from gpuop.operator.controller.passes.node import NodeReconciler
    from gpuop.operator.controller.passes.nvidiadriver import NVIDIADrivers
    from gpuop.operator.controller.passes.remediation import Remediation
    from gpuop.operator.controller.views.driver_owners import DriverOwners
    from gpuop.operator.controller.wiring.caches import Caches
    from gpuop.operator.metrics import OperatorMetrics

log = get_logger(__name__)


class Routed(Protocol):
    """What the router reads of the operator: its queue, caches and the units whose
    books an event keeps."""

    @property
    def queue(self) -> WorkQueue: ...
    @property
    def caches(self) -> Caches: ...
    @property
    def metrics(self) -> OperatorMetrics: ...
    @property
    def pace(self) -> ProgressPace: ...
    @property
    def namespace(self) -> str: ...
    @property
    def owners(self) -> DriverOwners: ...
    @property
    def applier(self) -> Applier: ...
    @property
    def nvd(self) -> NVIDIADrivers: ...
    @property
    def remediation(self) -> Remediation: ...
    @property
    def cluster(self) -> ClusterReconciler: ...
    @property
    def node_passes(self) -> NodeReconciler: ...


class EventRouter:
    """Turns events into work-queue keys
    (:class:`gpuop.operator.controller.wiring.caches.CacheEvents`,
    and the units' ``wake``/``on_*`` hooks)."""

    def __init__(self, op: Routed) -> None:
        self.op = op
        #: ``pod_events_total`` by outcome: the child looked up once, not per event.
        self._pod_events: dict[str, Any] = {}

    def _count_pod_event(self, outcome: str) -> None:
        child = self._pod_events.get(outcome)
        if child is None:
            child = self._pod_events[outcome] = self.op.metrics.pod_events_total.labels(outcome)
        child.inc()

    def wake(self, wake: Wake) -> None:
        wake.apply(self.op.queue.add, self.op.node_passes.fleet_soon, self.progress)

    def progress(self) -> None:
        """Something the cluster pass only counts moved: run it soon, coalescing the
        storm of pod and DaemonSet status events a rollout brings (see
        ``ClusterReconciler.coalesce_seconds``). Once every DaemonSet reports all its
        pods ready, the last pod events are not held back: they end the rollout."""
        wait = self.op.pace.wait(self.op.cluster.coalesce_seconds())
        self.op.queue.add_after(CLUSTER_KEY, wait)

    def site_config_changed(self) -> None:
        self.wake(route_site_config())

    def on_node(self, event: str, old: Obj | None, new: Obj | None) -> None:
        self.wake(
            route_node(
                event,
                old,
                new,
                remediation_reads=self.op.remediation.wants_node,
                labels_awaited=bool(self.op.cluster.label_gate.waiting_nodes),
            )
        )

    def on_policy(self, event: str, old: Obj | None, new: Obj | None) -> None:
        self.wake(route_policy(event, old, new, self.op.caches.nodes.store.items()))

    def on_nvidiadriver(self, event: str, old: Obj | None, new: Obj | None) -> None:
        self.follow_selectors()
        self.wake(route_nvidiadriver(event, old, new, self.op.caches.nodes.store.items()))

    def nvidiadrivers_listed(self) -> None:
        self.follow_selectors()
        self.wake(route_nvidiadrivers_listed(self.op.caches.nodes.store.items()))

    def follow_selectors(self) -> None:
        """Keep in the node cache every label an NVIDIADriver's ``nodeSelector`` reads
        (the cache keeps only the prefixes the operator reads): when that set changes,
        the nodes are listed again, and the relist's events wake the passes."""
        keys = selector_label_keys(
            (d.get("spec") or {}).get("nodeSelector") for d in self.op.owners.drivers.values()
        )
        trim = self.op.caches.node_trim
        if keys != trim.extra_labels:
            log.info("node labels kept for NVIDIADriver selectors", keys=sorted(keys))
            trim.extra_labels = keys
            self.op.caches.nodes.request_relist()

    def on_gpucluster(self, event: str, old: Obj | None, new: Obj | None) -> None:
        self.wake(route_gpucluster(event, old, new, self.op.caches.nodes.store.items()))

    def gpucluster_known(self) -> None:
        self.wake(route_gpucluster_presence(self.op.caches.nodes.store.items()))

    def on_gpucluster_object(self, event: str, old: Obj | None, new: Obj | None) -> None:
        self.wake(route_gpucluster_object(event, old, new))

    def on_owned(self, kind: Kind, event: str, old: Obj | None, new: Obj | None) -> None:
        obj = new or old
        assert obj is not None
        daemonsets = self.op.caches.owned["DaemonSet"]
        settled = kind.kind == "DaemonSet" and self.op.pace.daemonsets_changed(daemonsets.values())
        if event == "DELETED":
            self.op.applier.deleted(object_key(obj, kind.kind))
        self.wake(
            route_owned(
                event, old, new, daemonsets_settled=settled, driver_object=is_driver_object(obj)
            )
        )

    def pod_unchanged(self, old: PodRecord, new: PodRecord) -> bool:
        """A pod event that changes nothing the pods cache keeps (another condition's
        time, an annotation, the pod's IP) is taken at intake and wakes nothing."""
        same = same_pod(old, new)
        if same:
            self._count_pod_event("unchanged")
        return same

    def on_pod(self, event: str, old: PodRecord | None, new: PodRecord | None) -> None:
        """Routed once (`views.routes.route_pod`); NVIDIADrivers only follows its driver pods."""
        driver = self.op.nvd.follow_pod(old, new)
        wake = route_pod(
            event,
            old,
            new,
            driver=driver,
            upgrades_queued=self.op.node_passes.upgrades_queued,
            validators_read=lambda node: reads_validators(self.op.caches.nodes.get(node)),
        )
        woke = bool(wake.keys or wake.fleet or wake.progress)
        self._count_pod_event("woke" if woke else "idle")
        self.wake(wake)

    def on_dra_validator(self, event: str, old: PodRecord | None, new: PodRecord | None) -> None:
        """A DRA validator pod's news: its node's upgrade step may be waiting for it."""
        pod = new or old
        if pod is not None and pod.node:
            self.wake(Wake(keys=(node_key(pod.node),)))

    def on_revision(self, event: str, old: Obj | None, new: Obj | None) -> None:
        rev = new or old
        assert rev is not None
        driver = self._is_driver_revision(rev)
        nodes = self.op.caches.nodes.store.items()
        driver_nodes = self.op.nvd.driver_pods.nodes()
        self.wake(
            route_revision(event, old, new, driver=driver, nodes=nodes, driver_nodes=driver_nodes)
        )

    def _is_driver_revision(self, rev: Obj) -> bool:
        """Is ``rev`` a revision of a driver DaemonSet (the ClusterPolicy's or an
        NVIDIADriver's)? One whose DaemonSet is not cached yet counts as one."""
        for ref in rev["metadata"].get("ownerReferences") or ():
            if ref.get("kind") != "DaemonSet":
                continue
            name = str(ref.get("name"))
            ds = self.op.caches.owned["DaemonSet"].get(f"{self.op.namespace}/{name}")
            return ds is None or is_driver_object(ds)
        return False
