"""The operator process: watch caches, one work queue, and the units its keys dispatch to.

This module only wires: it builds the caches and the reconcile units, routes watch
events to work-queue keys (waking only what a change can affect), and dispatches each
key to its unit: ``cluster`` to :mod:`gpuop.controller._cluster`, ``node/<name>`` and
``upgrades`` to :mod:`gpuop.controller._node`, and the NVIDIADriver, remediation and
stuck-node keys to theirs.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from components._k8s import MANAGED_BY, MANAGED_BY_LABEL
from crd import ClusterPolicy, ClusterPolicySpec
from gpuop._pb_wire import POD_CODEC
from gpuop.controller._active import ActivePolicies
from gpuop.controller._apply import Applier, object_key
from gpuop.controller._cluster import ClusterReconciler
from gpuop.controller._config import OperatorConfig
from gpuop.controller._driver_owners import DriverOwners
from gpuop.controller._gpucluster import GPUClusters
from gpuop.controller._keys import (
    CLUSTER_KEY,
    GC_KEY,
    NVD_KEY,
    REMEDIATION_KEY,
    STUCK_KEY,
    UPGRADES_KEY,
    node_key,
    node_of,
)
from gpuop.controller._node import NodeReconciler
from gpuop.controller._nodes import NodeTrim, selector_label_keys
from gpuop.controller._nvidiadriver import NVD, NVIDIADrivers
from gpuop.controller._nvidiadriver_status import is_driver_object
from gpuop.controller._owned import ALWAYS_WATCHED, OptionalWatches
from gpuop.controller._pace import ProgressPace
from gpuop.controller._pods import (
    PodRecord,
    PodShape,
    pod_index,
    same_pod,
    trim_pod,
    trim_revision,
)
from gpuop.controller._policy_status import PolicyStatusWriter
from gpuop.controller._preflight import Preflight
from gpuop.controller._remediation import Remediation, upgrade_drain
from gpuop.controller._result import DONE, Again, Result
from gpuop.controller._rollback import RollbackTemplates
from gpuop.controller._rollout_gate import RolloutGate
from gpuop.controller._rollout_status import RolloutReports
from gpuop.controller._rollout_view import NodeRollouts
from gpuop.controller._routes import (
    Wake,
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
from gpuop.controller._site_config import SiteConfigMaps
from gpuop.controller._upgrade import Upgrades
from gpuop.controller._upgrade_window import UpgradeWindows
from gpuop.controller._workload import WorkloadHandovers
from gpuop.informer import Informer, Obj, ResourceSpec
from gpuop.kinds import by_kind
from gpuop.log import get_logger
from gpuop.metrics import OperatorMetrics
from gpuop.rest import Kind, Rest

log = get_logger(__name__)

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
NODE = by_kind("v1", "Node")
POLICY = by_kind("nvidia.com/v1", "ClusterPolicy")
POD = by_kind("v1", "Pod")
REVISION = by_kind("apps/v1", "ControllerRevision")


class Operator:
    """Wires watch caches to a work queue. What it holds besides the caches (memos, the
    pace of passes) is derived from them and rebuilt after a restart; every decision
    reads what is stored in the cluster."""

    def __init__(self, rest: Rest, config: OperatorConfig, metrics: OperatorMetrics) -> None:
        from gpuop.workqueue import WorkQueue

        self.rest = rest
        self.config = config
        self.metrics = metrics
        rest.observer = lambda verb, resource: metrics.api_requests_total.labels(
            verb, resource
        ).inc()
        self.queue = WorkQueue(self._reconcile, workers=config.workers)
        self.pace = ProgressPace()
        ns = config.namespace
        #: What the node cache keeps; NVIDIADriver node selectors widen it.
        self.node_trim = NodeTrim()
        self.nodes = Informer(
            # A LIST page is parsed whole before it is trimmed, and all caches list at
            # once on start: small pages keep the restart's peak RSS down.
            ResourceSpec("nodes", rest.lister(NODE), transform=self.node_trim, page_size=100),
            self._on_node,
        )
        self.policies = Informer(
            ResourceSpec("clusterpolicies", rest.lister(POLICY)), self._on_policy
        )
        self._active = ActivePolicies(self.policies)

        def owned_informer(kind: Kind) -> Informer:
            lister = rest.lister(kind, ns if kind.namespaced else None)
            spec = ResourceSpec(kind.plural, lister, label_selector=MANAGED_SELECTOR)
            return Informer(spec, lambda event, old, new: self._on_owned(kind, event, old, new))

        self.owned: dict[str, Informer] = {k.kind: owned_informer(k) for k in ALWAYS_WATCHED}
        #: Kinds a CRD may serve (ServiceMonitor): watched once discovery finds them.
        self.watches = OptionalWatches(
            self.owned, owned_informer, lambda: self.queue.add(CLUSTER_KEY)
        )

        # Every operand pod, as a PodRecord: the per-node rollout reads each
        # component's pod, so the pods outnumber every other object we keep.
        self.pods: Informer[PodRecord] = Informer(
            ResourceSpec(
                "pods",
                rest.lister(POD, ns),
                label_selector=OPERAND_SELECTOR,
                transform=trim_pod,
                shape=PodShape,
                # As protobuf: the API server encodes it far cheaper than JSON, which
                # it builds for this one watch on the cluster (issue 49).
                codec=POD_CODEC,
                unchanged=self._pod_unchanged,
                index=pod_index,
                page_size=100,
                track_index_changes=True,  # the per-node view redoes only changed nodes
            ),
            self._on_pod,
        )
        #: The DRA validator's pods: beside a GPUCluster an NVIDIADriver upgrade's
        #: validation waits for them (they carry upstream's labels only, so the operand
        #: pods cache, selected on managed-by, does not hold them).
        self.dra_validators: Informer[PodRecord] = Informer(
            ResourceSpec(
                "dra-validator-pods",
                rest.lister(POD, ns),
                label_selector=DRA_VALIDATOR_SELECTOR,
                transform=trim_pod,
                shape=PodShape,
                index=pod_index,
            ),
            self._on_dra_validator,
        )
        self.revisions = Informer(
            ResourceSpec(
                "controllerrevisions",
                rest.lister(REVISION, ns),
                label_selector=OPERAND_SELECTOR,
                transform=trim_revision,
            ),
            self._on_revision,
        )
        #: Which driver owns and runs on each node (the read side of NVIDIADrivers),
        #: handed to every unit that asks.
        self.owners = DriverOwners(
            # Without the NVIDIADriver CRD there is none: listed and empty, not "unknown".
            Informer(
                ResourceSpec("nvidiadrivers", rest.lister(NVD), absent_is_empty=True),
                self._on_nvidiadriver,
            ),
            self.nodes,
            self.owned["DaemonSet"],
            self.active_spec,
            gpucluster_mode=self._gpucluster_drives,
        )
        self.upgrades = Upgrades(
            rest,
            metrics,
            ns,
            pods=self.pods,
            revisions=self.revisions,
            daemonsets=self.owned["DaemonSet"],
            nodes=self.nodes,
            owners=self.owners,
            dra_validators=self.dra_validators,
        )
        self.gate = RolloutGate(
            rest, metrics, self.upgrades.events, self.policies, self.owners.drivers
        )
        self.remediation = Remediation(
            rest,
            metrics,
            self.upgrades.events,
            self.nodes,
            self.policies,
            self.active_policy,
            upgrade_drain(self.upgrades),
        )
        #: When the cluster pass wants to run again: its applier's refusal timers and
        #: its status writer's coalescing tell it, and it returns that (`_run_pass`).
        cluster_again = Again()
        self.applier = Applier(rest, self.owned, cluster_again.after, events=self.upgrades.events)
        self.synced = False
        self._started = time.monotonic()
        self.nvd = NVIDIADrivers(
            self,
            self.upgrades.events,
            self.owners,
            on_listed=self._nvidiadrivers_listed,
            wake=self._wake,
        )
        self.gpuclusters = GPUClusters(
            rest,
            ns,
            self.policies,
            self.upgrades.events,
            config.operator_image,
            on_cluster=self._on_gpucluster,
            on_object=self._on_gpucluster_object,
            on_known=self._gpucluster_known,
            on_listed=lambda: self.queue.add(GC_KEY),
            operator_image_pull_policy=config.operator_image_pull_policy,
            operator_image_pull_secrets=config.operator_image_pull_secrets,
        )
        self.rollouts = NodeRollouts(
            self.pods,
            self.revisions,
            self.owned["DaemonSet"],
            ns,
            stuck_seconds=config.node_stuck_seconds,
        )
        #: The ConfigMaps the driver's site configuration names (repositories, certs...).
        self.site_config = SiteConfigMaps(rest, ns, self._site_config_changed)
        self.cluster = ClusterReconciler(
            config=config,
            rest=rest,
            metrics=metrics,
            nodes=self.nodes,
            daemonsets=self.owned["DaemonSet"],
            active_policy=self.active_policy,
            applier=self.applier,
            status=PolicyStatusWriter(
                rest, self.policies, self.upgrades.events, cluster_again.after
            ),
            rollouts=self.rollouts,
            reports=RolloutReports(rest, self.rollouts, self.upgrades.events, metrics),
            nvd=self.nvd,
            watches=self.watches,
            timers=self.queue,
            again=cluster_again,
            site_config=self.site_config,
        )
        self.cluster.gpucluster_conflict = self.gpuclusters.conflict
        self.rollback = RollbackTemplates(
            rest, ns, self.revisions, self.policies, self.owners.drivers
        )
        self.cluster.rollback = self.rollback
        self.gate.on_rollback = lambda: self._wake(Wake(keys=(CLUSTER_KEY, NVD_KEY)))
        self.cluster.gpucluster_known = self.gpuclusters.knows_whether_one_exists
        self.node_passes = NodeReconciler(
            rest=rest,
            nodes=self.nodes,
            queue=self.queue,
            active_policy=self.active_policy,
            upgrades=self.upgrades,
            gate=self.gate,
            owners=self.owners,
            workloads=WorkloadHandovers(self.pods, self.upgrades.emptying, self.upgrades.events),
        )
        self.node_passes.gpuclusters = self.gpuclusters
        self.node_passes.preflight = Preflight(
            rest,
            ns,
            self.owned["DaemonSet"],
            self.owners.driver_app,
            self.upgrades.events,
            config.upgrade_preflight,
        )
        self.node_passes.windows = UpgradeWindows(
            rest, self.upgrades.events, self.policies, self.owners.drivers
        )
        self.node_passes.progress = self._progress

    # ------------------------------------------------------------- informers
    @property
    def informers(self) -> list[Informer[Any]]:
        return [
            self.nodes,
            self.policies,
            self.pods,
            self.dra_validators,
            self.revisions,
            self.site_config.cache,
            *self.owned.values(),
        ]

    async def run(self) -> None:
        """Run until cancelled; any root task dying ends the process (TaskGroup)."""
        async with asyncio.TaskGroup() as group:
            for informer in self.informers:
                group.create_task(informer.run(), name=f"watch-{informer.spec.name}")
            await asyncio.gather(*(i.synced.wait() for i in self.informers))
            self.synced = True
            log.info(
                "caches synced",
                nodes=len(self.nodes.store),
                seconds=round(time.monotonic() - self._started, 2),
            )
            group.create_task(self.queue.run(), name="workqueue")
            group.create_task(self.nvd.run(), name="nvidiadrivers")
            group.create_task(self.gpuclusters.run(), name="gpuclusters")
            group.create_task(self.watches.run(), name="optional-watches")
            self.queue.add(CLUSTER_KEY)
            self.queue.add(UPGRADES_KEY)
            self.queue.add(REMEDIATION_KEY)
            for name in self.nodes.store:
                self.queue.add(node_key(name))

    # -------------------------------------------------------- event routing
    # Each handler keeps the operator's books (the applier's, the pace's, the driver
    # pods NVIDIADrivers follows), asks `_routes` once what the event wakes, and queues
    # that: no unit queues anything from an event.
    def _wake(self, wake: Wake) -> None:
        wake.apply(self.queue.add, self.node_passes.fleet_soon, self._progress)

    def _site_config_changed(self) -> None:
        self._wake(route_site_config())

    def _on_node(self, event: str, old: Obj | None, new: Obj | None) -> None:
        self._wake(
            route_node(
                event,
                old,
                new,
                remediation_reads=self.remediation.wants_node,
                labels_awaited=bool(self.cluster.label_gate.waiting_nodes),
            )
        )

    def _on_policy(self, event: str, old: Obj | None, new: Obj | None) -> None:
        self._wake(route_policy(event, old, new, self.nodes.store.items()))

    def _on_nvidiadriver(self, event: str, old: Obj | None, new: Obj | None) -> None:
        self._follow_selectors()
        self._wake(route_nvidiadriver(event, old, new, self.nodes.store.items()))

    def _nvidiadrivers_listed(self) -> None:
        self._follow_selectors()
        self._wake(route_nvidiadrivers_listed(self.nodes.store.items()))

    def _follow_selectors(self) -> None:
        """Keep in the node cache every label an NVIDIADriver's ``nodeSelector`` reads
        (the cache keeps only the prefixes the operator reads): when that set changes,
        the nodes are listed again, and the relist's events wake the passes."""
        keys = selector_label_keys(
            (d.get("spec") or {}).get("nodeSelector") for d in self.owners.drivers.values()
        )
        if keys != self.node_trim.extra_labels:
            log.info("node labels kept for NVIDIADriver selectors", keys=sorted(keys))
            self.node_trim.extra_labels = keys
            self.nodes.request_relist()

    def _on_gpucluster(self, event: str, old: Obj | None, new: Obj | None) -> None:
        self._wake(route_gpucluster(event, old, new, self.nodes.store.items()))

    def _gpucluster_known(self) -> None:
        self._wake(route_gpucluster_presence(self.nodes.store.items()))

    def _on_gpucluster_object(self, event: str, old: Obj | None, new: Obj | None) -> None:
        self._wake(route_gpucluster_object(event, old, new))

    def _on_owned(self, kind: Kind, event: str, old: Obj | None, new: Obj | None) -> None:
        obj = new or old
        assert obj is not None
        settled = kind.kind == "DaemonSet" and self.pace.daemonsets_changed(
            self.owned["DaemonSet"].values()
        )
        if event == "DELETED":
            self.applier.deleted(object_key(obj, kind.kind))
        self._wake(
            route_owned(
                event, old, new, daemonsets_settled=settled, driver_object=is_driver_object(obj)
            )
        )

    def _pod_unchanged(self, old: PodRecord, new: PodRecord) -> bool:
        """A pod event that changes nothing the pods cache keeps (another condition's
        time, an annotation, the pod's IP) is taken at intake and wakes nothing."""
        same = same_pod(old, new)
        if same:
            self.metrics.pod_events_total.labels("unchanged").inc()
        return same

    def _on_pod(self, event: str, old: PodRecord | None, new: PodRecord | None) -> None:
        """Routed once (`_routes.route_pod`); NVIDIADrivers only follows its driver pods."""
        driver = self.nvd.follow_pod(old, new)
        wake = route_pod(
            event, old, new, driver=driver, upgrades_queued=self.node_passes.upgrades_queued
        )
        woke = bool(wake.keys or wake.fleet or wake.progress)
        self.metrics.pod_events_total.labels("woke" if woke else "idle").inc()
        self._wake(wake)

    def _on_dra_validator(self, event: str, old: PodRecord | None, new: PodRecord | None) -> None:
        """A DRA validator pod's news: its node's upgrade step may be waiting for it."""
        pod = new or old
        if pod is not None and pod.node:
            self._wake(Wake(keys=(node_key(pod.node),)))

    def _progress(self) -> None:
        """Something the cluster pass only counts moved: run it soon, coalescing the
        storm of pod and DaemonSet status events a rollout brings (see
        ``ClusterReconciler.coalesce_seconds``). Once every DaemonSet reports all its
        pods ready, the last pod events are not held back: they end the rollout."""
        self.queue.add_after(CLUSTER_KEY, self.pace.wait(self.cluster.coalesce_seconds()))

    def _on_revision(self, event: str, old: Obj | None, new: Obj | None) -> None:
        rev = new or old
        assert rev is not None
        driver = self._is_driver_revision(rev)
        self._wake(route_revision(event, old, new, driver=driver, nodes=self.nodes.store.items()))

    def _is_driver_revision(self, rev: Obj) -> bool:
        """Is ``rev`` a revision of a driver DaemonSet (the ClusterPolicy's or an
        NVIDIADriver's)? One whose DaemonSet is not cached yet counts as one."""
        for ref in rev["metadata"].get("ownerReferences") or ():
            if ref.get("kind") != "DaemonSet":
                continue
            name = str(ref.get("name"))
            ds = self.owned["DaemonSet"].get(f"{self.config.namespace}/{name}")
            return ds is None or is_driver_object(ds)
        return False

    # ------------------------------------------------------------ dispatch
    async def _reconcile(self, key: str) -> None:
        """The worker loop's one step: run the key's pass, and queue the key again when
        the pass says so (as controller-runtime does with a reconciler's Result)."""
        started = time.monotonic()
        try:
            result = await self._run_pass(key)
        finally:
            self.metrics.reconcile_duration_seconds.labels(_pass_name(key)).observe(
                time.monotonic() - started
            )
        if result.requeue_after is not None:
            self.queue.add_after(key, result.requeue_after)

    async def _run_pass(self, key: str) -> Result:
        node = node_of(key)
        if node is not None:
            await self.node_passes.reconcile_node(node)
        elif key == CLUSTER_KEY:
            return await self.cluster.reconcile()
        elif key == UPGRADES_KEY:
            return await self.node_passes.reconcile_upgrades()
        elif key == REMEDIATION_KEY:
            return Result(await self.remediation.reconcile())
        elif key == NVD_KEY:
            await self.nvd.reconcile()
        elif key == GC_KEY:
            return await self.gpuclusters.reconcile()
        elif key == STUCK_KEY:
            self.queue.add(CLUSTER_KEY)  # a node is due to count as stuck
        return DONE

    def active_policy(self) -> tuple[Obj | None, ClusterPolicy | None, list[str]]:
        """The oldest ClusterPolicy is the active one; parsed once per resourceVersion."""
        return self._active()

    def active_spec(self) -> ClusterPolicySpec | None:
        return self._active.spec()

    def gpucluster_object(self) -> Obj | None:
        """The GPUCluster, while one exists (it owns the driver accounts beside it)."""
        return self.gpuclusters.current()

    def _gpucluster_drives(self) -> bool:
        """A GPUCluster and no ClusterPolicy: NVIDIADrivers install its drivers."""
        return self.active_policy()[0] is None and self.gpuclusters.active()


def _pass_name(key: str) -> str:
    """The pass a work-queue key runs, for metrics: `node/<name>` counts as `node`."""
    return key if node_of(key) is None else "node"
