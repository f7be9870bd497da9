"""The node passes: each node's deploy labels and driver-upgrade step (key
``node/<name>``), and the fleet pass that grants upgrade slots (key ``upgrades``).

A node pass reads once (:class:`NodeReader`: one snapshot from the caches, then the API
reads the plan asks for), decides once (``statemachine.node_plan.plan_node``) and writes
once (``writers.node_write.NodeWriter``); it returns a ``Result`` and never touches the
queue.

Kept apart from the cluster pass because they scale with the fleet: a node pass reads
one node and its pods, and only the serial fleet pass looks at every node, once per
budget (the ClusterPolicy's, and each NVIDIADriver's under its own upgradePolicy).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from components.driver import DAEMONSET_NAME as DRIVER_DS
from components.nvidiadriver import policy_for
from crd import ClusterPolicySpec
from gpuop.kube.informer import Informer, Obj
from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Rest
from gpuop.log import get_logger
from gpuop.operator.controller.base.keys import (
    FLEET_COALESCE_FACTOR,
    FLEET_COALESCE_MAX_S,
    FLEET_COALESCE_S,
    UPGRADES_KEY,
    node_key,
)
from gpuop.operator.controller.base.memo import VersionMemo
from gpuop.operator.controller.base.result import Again, Result
from gpuop.operator.controller.views.active_policy import ActivePolicy
from gpuop.operator.controller.views.node_views import labels
from gpuop.operator.controller.views.upgrade_inputs import policy_view
from gpuop.operator.controller.writers.node_write import NodeWriter
from gpuop.operator.controller.writers.rollout_gate import RolloutGate
from gpuop.operator.controller.writers.upgrade import Upgrades, UpgradeTally
from gpuop.operator.controller.writers.workload_handover import WorkloadHandovers
from statemachine import UpgradePolicyView
from statemachine.node_plan import LiveReads, NodeSnapshot, Reads, plan_node, plan_reads
from statemachine.node_plan import target_owner as target_owner
from statemachine.upgrade_keys import STATE_LABEL, UpgradeState, parse_state

if TYPE_CHECKING:
    from gpuop.kube.workqueue import WorkQueue
    from gpuop.operator.controller.views.driver_owners import DriverOwners
    from gpuop.operator.controller.views.gpucluster_objects import GPUClusterPresence
    from gpuop.operator.controller.writers.eviction import Emptying
    from gpuop.operator.controller.writers.preflight import Preflight
    from gpuop.operator.controller.writers.upgrade import Upgrades
    from gpuop.operator.controller.writers.upgrade_window import UpgradeWindows
    from gpuop.operator.controller.writers.workload_handover import WorkloadHandovers

log = get_logger(__name__)

NODE = by_kind("v1", "Node")
CONFLICT_RETRY_S = 1.0
"""A grant met a node newer than the cache's: the fleet pass counts again this soon."""


@dataclass(kw_only=True)
class NodeReconciler:
    """Node and fleet passes over the operator's caches. It keeps only a memo derived from
    the node cache and the fleet pass's last CPU time (its pace); upgrade progress lives
    in node labels and annotations."""

    rest: Rest
    nodes: Informer
    queue: WorkQueue
    active_policy: ActivePolicy
    upgrades: Upgrades
    gate: RolloutGate
    owners: DriverOwners
    """Which driver owns and runs on a node, and under which upgradePolicy."""
    workloads: WorkloadHandovers
    gpuclusters: GPUClusterPresence | None = None
    """Set by the operator: with no ClusterPolicy, a GPUCluster's labels hold."""
    progress: Callable[[], None] = field(default=lambda: None)
    """Set by the operator: the paced cluster pass (``EventRouter.progress``)."""
    preflight: Preflight | None = None
    """Set by the operator: holds a driver pool whose images its registry lacks."""
    windows: UpgradeWindows | None = None
    """Set by the operator: holds upgrade starts outside the maintenance windows."""
    _fleet_cpu_s: float = field(default=0.0, init=False)
    _queued: VersionMemo[str, bool] = field(default_factory=VersionMemo, init=False)

    def upgrades_queued(self) -> bool:
        """Does any node wait for an upgrade slot (``upgrade-required``)? Only such a
        node's driver pod coming or going can change what the fleet pass starts (a
        candidate without one is passed over), so during a fresh rollout, where every
        node is enrolled ``upgrade-done``, driver pods wake no fleet pass. Memoised by
        the node cache's version."""
        return self._queued.get("", str(self.nodes.version), self._any_queued)

    def _any_queued(self) -> bool:
        return any(
            parse_state(labels(n).get(STATE_LABEL)) is UpgradeState.UPGRADE_REQUIRED
            for n in self.nodes.store.values()
        )

    def fleet_soon(self) -> None:
        """Queue the fleet pass for news it reads (a node's budget facts, a driver pod
        come or gone), coalescing a rollout's stream of them into few passes."""
        wait = min(
            FLEET_COALESCE_MAX_S, max(FLEET_COALESCE_S, FLEET_COALESCE_FACTOR * self._fleet_cpu_s)
        )
        self.queue.add_after(UPGRADES_KEY, wait)

    def __post_init__(self) -> None:
        self._reader = NodeReader(
            nodes=self.nodes,
            active_policy=self.active_policy,
            upgrades=self.upgrades,
            owners=self.owners,
            workloads=self.workloads,
            gpuclusters=lambda: self.gpuclusters,
        )
        self._writer = NodeWriter(
            rest=self.rest, nodes=self.nodes, upgrades=self.upgrades, workloads=self.workloads
        )

    async def reconcile_node(self, name: str) -> Result:
        """One node pass: read, plan, write (:mod:`statemachine.node_plan`). It touches
        no queue: its result says when to run again and what its writes woke."""
        snapshot = await self._reader.read(name)
        plan = plan_node(snapshot)
        return await self._writer.write(plan)

    def _nvd_unknown(self, spec: ClusterPolicySpec | None, owned: bool) -> bool:
        """Whether upgrade decisions would read NVIDIADrivers before their cache listed:
        a node's (or, ``owned``, this node's) driver and upgradePolicy may be a
        resource's, and reading "no resource" as "auto-upgrade off" uncordons nodes in
        the middle of their upgrade and forgets it."""
        if self.owners.has_listed():
            return False
        return owned or (spec is not None and spec.driver.use_nvidia_driver_crd)

    async def reconcile_upgrades(self) -> Result:
        """Start upgrades over the whole fleet: the one writer of slots (persisted states).
        Returns when the pass wants to run again (the rollout gate's clock, a conflict)."""
        cpu = time.thread_time()
        again = Again()
        try:
            await self._reconcile_upgrades(again)
        finally:
            self._fleet_cpu_s = time.thread_time() - cpu
        return again.take()

    async def _reconcile_upgrades(self, again: Again) -> None:
        raw, model, problems = self.active_policy()
        if raw is not None and (model is None or problems):
            return
        # Beside a GPUCluster (no ClusterPolicy) only NVIDIADrivers' nodes upgrade.
        spec = model.spec if model is not None else self.owners.base_spec()
        if spec is None:
            return
        if self._nvd_unknown(spec, bool(self.owners.owned_nodes())):
            return  # the listed NVIDIADriver cache queues this pass again
        # One budget per driver owner: the ClusterPolicy's nodes, and each
        # NVIDIADriver's nodes under that resource's own upgradePolicy.
        groups: dict[str | None, list[Obj]] = {}
        for node in self.nodes.values():
            groups.setdefault(target_owner(labels(node)), []).append(node)
        policies: dict[str | None, UpgradePolicyView] = {}
        if model is not None:
            policies[None] = policy_view(spec)
        policies.update(self.owners.upgrade_policies() or {})
        # The gauges count every owner's nodes, published once all are counted.
        tally = UpgradeTally()
        for owner, nodes in groups.items():
            policy = policies.get(owner, UpgradePolicyView(auto_upgrade=False))
            if not policy.auto_upgrade:
                continue
            held = await self._holds(raw, spec, owner, nodes, again)
            started, conflict = await self.upgrades.grant(nodes, policy, held, tally)
            for name in started:
                self.queue.add(node_key(name))
            if conflict:  # the cache was behind a node: count again once it caught up
                again.after(CONFLICT_RETRY_S)
        tally.publish(self.upgrades.metrics)

    async def _holds(
        self,
        raw: Obj | None,
        spec: ClusterPolicySpec,
        owner: str | None,
        nodes: list[Obj],
        again: Again,
    ) -> Mapping[str, str] | None:
        """What holds ``owner``'s nodes from starting, by node: the canary gate, the
        pre-flight and the maintenance windows; each says when to look again."""
        held = None
        # Canary and halt: one gate per driver owner, each over its own nodes and
        # recorded on its own resource (the ClusterPolicy, or the NVIDIADriver).
        gated = self._gated(raw, spec, owner)
        if gated is not None:
            gate_raw, gate_spec, pools = gated
            # One rollout over all the owner's driver DaemonSets (one per kernel or
            # pool); each node is compared with its own DaemonSet's revision. Until a
            # changed template's revision is in the cache too (two watches), the gate
            # holds its candidates and decides nothing: that event wakes this pass.
            newest, digest, settled = self.upgrades.rollout(pools)
            gate = await self.gate.reconcile(
                gate_raw,
                gate_spec,
                nodes,
                newest,
                self._revision_of,
                digest,
                self._target_of,
                owner=owner,
                restore=functools.partial(self.upgrades.restore_revisions, pools),
                settled=settled,
            )
            held = gate.held
            if gate.requeue_after is not None:
                again.after(gate.requeue_after)
        if self.preflight is not None:  # images missing: that pool cordons nothing
            checked = await self.preflight.hold(nodes)
            held = {**(held or {}), **checked.held}
            if checked.requeue_after is not None:
                again.after(checked.requeue_after)
        if self.windows is not None:  # outside a maintenance window nothing starts
            window = await self.windows.reconcile(raw, owner, nodes)
            held = window.merged(held)
            if window.requeue_after is not None:
                again.after(window.requeue_after)  # the next window opens
        return held

    def _gated(
        self, raw: Obj | None, spec: ClusterPolicySpec, owner: str | None
    ) -> tuple[Obj, ClusterPolicySpec, list[str]] | None:
        """What gates ``owner``'s nodes: the resource carrying its record, the policy its
        canary and halt are read from, and its driver DaemonSets; None when the
        NVIDIADriver is gone (its nodes then wait for their next owner)."""
        if owner is None:
            if raw is None:
                return None  # no ClusterPolicy: its nodes have no policy to wait under
            return raw, spec, [p.name for p in self.owners.policy_pools()] or [DRIVER_DS]
        found = self.owners.drivers.get(owner)
        model = self.owners.model(owner)
        if found is None or model is None:
            return None
        return found, policy_for(model.spec, spec), self.owners.owner_pools(owner)

    def _target_of(self, node: str) -> str | None:
        """The newest revision of the driver DaemonSet ``node`` runs (its kernel's)."""
        app = self.owners.driver_app(node)
        return self.upgrades.newest_driver_revision(app) if app else None

    def _revision_of(self, node: str) -> str | None:
        pod = self.upgrades.driver_pod(node)
        return pod.revision_hash if pod is not None else None


# ------------------------------------------------------------- the read phase
@dataclass(kw_only=True)
class NodeReader:
    """Builds one node pass's snapshot."""

    nodes: Informer
    active_policy: ActivePolicy
    upgrades: Upgrades
    owners: DriverOwners
    workloads: WorkloadHandovers
    gpuclusters: Callable[[], GPUClusterPresence | None]
    clock: Callable[[], float] = time.time

    async def read(self, name: str) -> NodeSnapshot:
        snap = self._cached(name)
        reads = plan_reads(snap)
        if reads == Reads():
            return snap
        return replace(
            snap, live=await read_live(name, reads, self.upgrades.emptying, self.workloads)
        )

    def _cached(self, name: str) -> NodeSnapshot:
        node = self.nodes.get(name)
        if node is None:
            return NodeSnapshot(name, None)
        raw, model, problems = self.active_policy()
        if raw is not None and (model is None or problems):
            return NodeSnapshot(name, node, policy_invalid=True)
        spec = model.spec if model is not None else None
        dra = self.gpuclusters()
        gpucluster = None
        if spec is None and dra is not None:
            known = dra.knows_whether_one_exists()
            gpucluster = (known, dra.active() if known else False)
        owners = self.owners
        app = owners.driver_app(name)
        said_invalid, said_step = self.workloads.said(name)
        driver, resting, refused = self.upgrades.node_facts(name, app)
        return NodeSnapshot(
            name,
            node,
            now=self.clock(),
            spec=spec,
            spec_policy=policy_view(spec) if spec is not None else None,
            gpucluster=gpucluster,
            owner_policies=owners.upgrade_policies(),
            owners_listed=owners.has_listed(),
            base_spec=owners.base_spec() if spec is None else None,
            namespace=self.upgrades.namespace,
            claimant_pods=self.workloads.claimants_on(name),
            claim_settle_s=self.workloads.claim_settle_s(name),
            driver=driver,
            said_invalid=said_invalid,
            said_step=said_step,
            refused=refused,
            resting=resting,
            ready_timeout=self.upgrades.driver_ready_timeout_seconds,
        )


async def read_live(
    name: str, reads: Reads, emptying: Emptying, workloads: WorkloadHandovers | None
) -> LiveReads:
    """The API reads ``reads`` asks for: the node's pods, our unbound pods bound for it
    (the claimants the API server has there), and the pods the policy's selectors name."""
    node_pods = await emptying.node_pods(name) if reads.node_pods else None
    claimants: frozenset[str] = frozenset()
    if reads.unbound and workloads is not None:
        claimants = await workloads.claimants_now(name, node_pods or [])
    drain = None
    if reads.drain_selector is not None:
        drain = await emptying.node_pods(name, reads.drain_selector)
    wait = await emptying.node_pods(name, reads.wait_selector) if reads.wait_selector else None
    return LiveReads(
        node_pods=None if node_pods is None else tuple(node_pods),
        claimants=claimants,
        drain_pods=None if drain is None else tuple(drain),
        wait_pods=None if wait is None else tuple(wait),
    )
