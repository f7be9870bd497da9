"""The operator process: watch caches, one work queue, and the units its keys dispatch to.

This module only wires: it builds the caches and the reconcile units, routes watch
events to work-queue keys (waking only what a change can affect), and dispatches each
key to its unit: ``cluster`` to :mod:`gpuop.operator.controller.passes.cluster`, ``node/<name>`` and
``upgrades`` to :mod:`gpuop.operator.controller.passes.node`, and the NVIDIADriver, remediation and
stuck-node keys to theirs.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from crd import ClusterPolicy, ClusterPolicySpec
from gpuop.kube.informer import Informer, Obj, ResourceSpec
from gpuop.kube.rest import Rest
from gpuop.log import get_logger
from gpuop.operator.controller.base.config import OperatorConfig
from gpuop.operator.controller.base.keys import (
    CLUSTER_KEY,
    GC_KEY,
    NVD_KEY,
    REMEDIATION_KEY,
    STUCK_KEY,
    UPGRADES_KEY,
    node_key,
    node_of,
)
from gpuop.operator.controller.base.pace import ProgressPace
from gpuop.operator.controller.base.result import DONE, Again, Result
from gpuop.operator.controller.base.site_config import SiteConfigMaps
from gpuop.operator.controller.passes.cluster import ClusterReconciler
from gpuop.operator.controller.passes.gpucluster import GPUClusters
from gpuop.operator.controller.passes.node import NodeReconciler
from gpuop.operator.controller.passes.nvidiadriver import NVD, NVIDIADrivers
from gpuop.operator.controller.passes.remediation import Remediation, upgrade_drain
from gpuop.operator.controller.views.driver_owners import DriverOwners
from gpuop.operator.controller.views.rollout_view import NodeRollouts
from gpuop.operator.controller.views.routes import Wake
from gpuop.operator.controller.wiring.caches import OPERAND_SELECTOR, build_caches
from gpuop.operator.controller.wiring.router import EventRouter
from gpuop.operator.controller.writers.apply import Applier
from gpuop.operator.controller.writers.policy_status import PolicyStatusWriter
from gpuop.operator.controller.writers.preflight import Preflight
from gpuop.operator.controller.writers.rollback import RollbackTemplates
from gpuop.operator.controller.writers.rollout_gate import RolloutGate
from gpuop.operator.controller.writers.rollout_reports import RolloutReports
from gpuop.operator.controller.writers.upgrade import Upgrades
from gpuop.operator.controller.writers.upgrade_window import UpgradeWindows
from gpuop.operator.controller.writers.workload_handover import WorkloadHandovers
from gpuop.operator.events import EventRecorder
from gpuop.operator.metrics import OperatorMetrics

log = get_logger(__name__)

UNITS_LISTED_WAIT_S = 10.0
"""How long the first passes wait for the NVIDIADriver and GPUCluster caches to list."""

__all__ = ["OPERAND_SELECTOR", "Operator"]


class Operator:
    """Wires watch caches to a work queue. What it holds besides the caches (memos, the
    pace of passes) is derived from them and rebuilt after a restart; every decision
    reads what is stored in the cluster."""

    def __init__(self, rest: Rest, config: OperatorConfig, metrics: OperatorMetrics) -> None:
        from gpuop.kube.workqueue import WorkQueue

        self.rest = rest
        self.config = config
        self.metrics = metrics
        self.namespace = config.namespace
        rest.observer = lambda verb, resource: metrics.api_requests_total.labels(
            verb, resource
        ).inc()
        self.queue = WorkQueue(self._reconcile, workers=config.workers)
        self.pace = ProgressPace()
        self.router = EventRouter(self)
        #: One Event recorder, handed to every unit that tells an administrator.
        self.events = EventRecorder(rest)
        self.caches = build_caches(
            rest, config.namespace, self.router, lambda: self.queue.add(CLUSTER_KEY)
        )
        self.nodes = self.caches.nodes
        self.policies = self.caches.policies
        self.owned = self.caches.owned
        self.watches = self.caches.watches
        self.pods = self.caches.pods
        self.dra_validators = self.caches.dra_validators
        self.revisions = self.caches.revisions
        self._active = self.caches.active
        self.synced = False
        self._started = time.monotonic()
        self._build_driver_units()
        self._build_cluster_units()
        self._build_node_passes()

    def _build_driver_units(self) -> None:
        """The driver's read side, upgrade machine, rollout gate and remediation."""
        rest, ns = self.rest, self.namespace
        #: Which driver owns and runs on each node (the read side of NVIDIADrivers),
        #: handed to every unit that asks.
        self.owners = DriverOwners(
            # Without the NVIDIADriver CRD there is none: listed and empty, not "unknown".
            Informer(
                ResourceSpec("nvidiadrivers", rest.lister(NVD), absent_is_empty=True),
                self.router.on_nvidiadriver,
            ),
            self.nodes,
            self.owned["DaemonSet"],
            self.active_spec,
            gpucluster_mode=self._gpucluster_drives,
        )
        self.upgrades = Upgrades(
            rest,
            self.metrics,
            self.events,
            ns,
            pods=self.pods,
            revisions=self.revisions,
            daemonsets=self.owned["DaemonSet"],
            nodes=self.nodes,
            owners=self.owners,
            dra_validators=self.dra_validators,
        )
        self.gate = RolloutGate(rest, self.metrics, self.events, self.policies, self.owners.drivers)
        self.gate.on_rollback = lambda: self.router.wake(Wake(keys=(CLUSTER_KEY, NVD_KEY)))
        self.remediation = Remediation(
            rest,
            self.metrics,
            self.events,
            self.nodes,
            self.policies,
            self.active_policy,
            upgrade_drain(self.upgrades),
        )
        self.rollback = RollbackTemplates(
            rest, ns, self.revisions, self.policies, self.owners.drivers
        )

    def _build_cluster_units(self) -> None:
        """The cluster pass and what it hands work to: the applier, NVIDIADrivers,
        GPUClusters, the per-node rollout view and the site ConfigMaps."""
        rest, ns, config = self.rest, self.namespace, self.config
        #: When the cluster pass wants to run again: its applier's refusal timers and
        #: its status writer's coalescing tell it, and it returns that (`_run_pass`).
        cluster_again = Again()
        self.applier = Applier(rest, self.owned, cluster_again.after, events=self.events)
        self.nvd = NVIDIADrivers(
            self,
            self.events,
            self.owners,
            on_listed=self.router.nvidiadrivers_listed,
            wake=self.router.wake,
        )
        self.gpuclusters = GPUClusters(
            rest,
            ns,
            self.policies,
            self.events,
            config.operator_image,
            on_cluster=self.router.on_gpucluster,
            on_object=self.router.on_gpucluster_object,
            on_known=self.router.gpucluster_known,
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
        self.site_config = SiteConfigMaps(rest, ns, self.router.site_config_changed)
        self.cluster = ClusterReconciler(
            config=config,
            rest=rest,
            metrics=self.metrics,
            nodes=self.nodes,
            daemonsets=self.owned["DaemonSet"],
            active_policy=self.active_policy,
            applier=self.applier,
            status=PolicyStatusWriter(rest, self.policies, self.events, cluster_again.after),
            rollouts=self.rollouts,
            reports=RolloutReports(rest, self.rollouts, self.events, self.metrics),
            nvd=self.nvd,
            watches=self.watches,
            timers=self.queue,
            again=cluster_again,
            site_config=self.site_config,
        )
        self.cluster.gpucluster_conflict = self.gpuclusters.conflict
        self.cluster.rollback = self.rollback
        self.cluster.gpucluster_known = self.gpuclusters.knows_whether_one_exists

    def _build_node_passes(self) -> None:
        """The node and fleet passes, with the holds an upgrade start waits for."""
        self.node_passes = NodeReconciler(
            rest=self.rest,
            nodes=self.nodes,
            queue=self.queue,
            active_policy=self.active_policy,
            upgrades=self.upgrades,
            gate=self.gate,
            owners=self.owners,
            workloads=WorkloadHandovers(self.pods, self.upgrades.emptying),
        )
        self.node_passes.gpuclusters = self.gpuclusters
        self.node_passes.preflight = Preflight(
            self.rest,
            self.namespace,
            self.owned["DaemonSet"],
            self.owners.driver_app,
            self.events,
            self.config.upgrade_preflight,
        )
        self.node_passes.windows = UpgradeWindows(
            self.rest, self.events, self.policies, self.owners.drivers
        )
        self.node_passes.progress = self.router.progress

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
            group.create_task(self.nvd.run(), name="nvidiadrivers")
            group.create_task(self.gpuclusters.run(), name="gpuclusters")
            group.create_task(self.watches.run(), name="optional-watches")
            await self._units_listed()
            group.create_task(self.queue.run(), name="workqueue")
            self.queue.add(CLUSTER_KEY)
            self.queue.add(UPGRADES_KEY)
            self.queue.add(REMEDIATION_KEY)
            for name in self.nodes.store:
                self.queue.add(node_key(name))

    async def _units_listed(self) -> None:
        """Wait (at most ``UNITS_LISTED_WAIT_S``) for the NVIDIADriver and GPUCluster
        caches before the first passes: each wakes every node once it has listed, so a
        pass run before is run again (three node passes per node on every start). A
        cache that cannot list yet holds nothing back for longer: the passes wait for
        it themselves (``has_listed``, ``knows_whether_one_exists``)."""
        listed = (self.owners.drivers.synced.wait(), self.gpuclusters.clusters.synced.wait())
        try:
            await asyncio.wait_for(asyncio.gather(*listed), UNITS_LISTED_WAIT_S)
        except TimeoutError:
            log.warning(
                "passes start before the NVIDIADriver and GPUCluster caches listed",
                waited_s=UNITS_LISTED_WAIT_S,
            )

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
        result.apply(key, self.queue, self.node_passes.fleet_soon, self.router.progress)

    async def _run_pass(self, key: str) -> Result:
        node = node_of(key)
        if node is not None:
            return await self.node_passes.reconcile_node(node)
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
