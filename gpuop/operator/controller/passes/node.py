"""The node passes: each node's deploy labels and driver-upgrade step (key
``node/<name>``), and the fleet pass that grants upgrade slots (key ``upgrades``).

Kept apart from the cluster pass because they scale with the fleet: a node pass reads
one node and its pods, and only the serial fleet pass looks at every node, once per
budget (the ClusterPolicy's, and each NVIDIADriver's under its own upgradePolicy).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from components.dra import gpucluster_label_changes
from components.driver import DAEMONSET_NAME as DRIVER_DS
from components.keys import CONTAINER_WORKLOAD, DEPLOY_DRIVER_LABEL, TRUE
from components.labels import (
    LabelChanges,
    apply_label_changes,
    is_gpu_node,
    node_label_changes,
    node_workload,
)
from components.nvidiadriver import policy_for
from crd import OWNER_LABEL, ClusterPolicySpec
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
from gpuop.operator.controller.views.node_views import labels, node_annotations
from gpuop.operator.controller.views.routes import gpu_facts
from gpuop.operator.controller.writers.rollout_gate import RolloutGate
from gpuop.operator.controller.writers.upgrade import (
    Upgrades,
    UpgradeTally,
    policy_view,
    requeue_after,
)
from gpuop.operator.controller.writers.workload_handover import (
    GPU_PODS_RECHECK_S,
    WorkloadHandovers,
)
from statemachine import Action, Decision, UpgradePolicyView
from statemachine.driver_handoff import handoff_patch, handoff_wanted
from statemachine.driver_owner import NEXT_OWNER_LABEL
from statemachine.upgrade import next_step
from statemachine.upgrade_keys import STATE_LABEL, UpgradeState, parse_state
from statemachine.workload_handover import GPU_PODS_LEAVING

if TYPE_CHECKING:
    from gpuop.kube.workqueue import WorkQueue
    from gpuop.operator.controller.views.driver_owners import DriverOwners
    from gpuop.operator.controller.views.gpucluster_objects import GPUClusterPresence
    from gpuop.operator.controller.writers.preflight import Preflight
    from gpuop.operator.controller.writers.upgrade_window import UpgradeWindows

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

    def _label_changes(
        self, node_labels: Mapping[str, str], spec: ClusterPolicySpec | None
    ) -> LabelChanges:
        """The ClusterPolicy's labels; with none, a GPUCluster's (DRA deploy labels) or,
        with neither, none of ours. Nothing changes before the GPUCluster cache has
        listed: whether one exists is not known yet."""
        dra = self.gpuclusters
        if spec is not None or dra is None:
            return node_label_changes(node_labels, spec)
        if not dra.knows_whether_one_exists():
            return {}
        return gpucluster_label_changes(node_labels, active=dra.active())

    async def reconcile_node(self, name: str) -> None:
        facts = gpu_facts(self.nodes.get(name))
        recheck = await self._reconcile_node(name)
        if gpu_facts(self.nodes.get(name)) != facts:
            # Our own writes wake no watch event (``Informer.observe``): when one moved
            # what the cluster pass reads of the node (an NVIDIADriver upgrade state, which
            # holds the policy's readiness), it is told here, or it may last have looked
            # before the node's final state.
            self.progress()
        if recheck:
            # Held for container GPU pods, which are not watched: look again.
            self.queue.add_after(node_key(name), GPU_PODS_RECHECK_S)

    async def _reconcile_node(self, name: str) -> bool:
        """One node pass; True when its hand-over waits for container GPU pods."""
        node = self.nodes.get(name)
        if node is None:
            self.queue.forget(node_key(name))
            self.upgrades.forget_node(name)
            self.workloads.forget(name)
            return False
        raw, model, problems = self.active_policy()
        if raw is not None and (model is None or problems):
            return False  # an invalid policy changes nothing on nodes; its status says why
        spec = model.spec if model is not None else None
        await self.workloads.report_workload(node, spec)
        target = node_workload(labels(node), spec).name
        changes, handover = await self.workloads.hold(
            node, self._label_changes(labels(node), spec), target
        )
        recheck = handover is not None and handover.state == GPU_PODS_LEAVING
        handoff = self._handoff(node, changes, spec)
        if changes or handoff:
            meta: dict[str, Any] = {}
            if changes:
                meta["labels"] = dict(changes)
            if handoff:
                meta["annotations"] = dict(handoff)
            first = await self._enrolment(node, changes, spec) if changes else None
            if first is not None:
                meta["labels"].update(first.labels)
                if first.annotations:
                    meta.setdefault("annotations", {}).update(first.annotations)
            patched = await self.rest.merge_patch(NODE, name, {"metadata": meta})
            self.nodes.observe(patched)
            log.info(
                "node labels", node=name, changes=meta.get("labels"), annotations=handoff or None
            )
            if first is not None:
                self.fleet_soon()
            self.queue.add(node_key(name))  # again, on the fresh labels
            return recheck
        owner = target_owner(labels(node))
        if self._nvd_unknown(spec, bool(owner)):
            return recheck  # which policy applies is not known yet: woken once listed
        policy = policy_view(spec) if spec is not None else UpgradePolicyView()
        app = self.owners.driver_app(name)  # asked once: the upgrade step is handed it
        if owner:
            # An NVIDIADriver drives this node (or is to): its own upgradePolicy applies.
            policy = (self.owners.upgrade_policies() or {}).get(owner) or UpgradePolicyView(
                auto_upgrade=False
            )
        if not (policy.auto_upgrade and is_gpu_node(labels(node)) and target == CONTAINER_WORKLOAD):
            if STATE_LABEL not in labels(node):
                return recheck
            # Upgrades off, no policy (uninstall), no longer a GPU node, or a VM host now
            # (its driver left with its deploy label: nothing to upgrade): the rulebook
            # uncordons what we cordoned and removes our label and annotations.
            policy = UpgradePolicyView(auto_upgrade=False)
        newest = self.upgrades.newest_driver_revision(app) if app else None
        decision = await self.upgrades.step(node, policy, newest, app)
        delay = requeue_after(decision)
        if delay is not None:
            self.queue.add_after(node_key(name), delay)
        else:
            # No clock runs for the node now: drop a timer left from an earlier state
            # (pod-restart's 600 s, say), or it fires for nothing and the queue never idles.
            self.queue.forget(node_key(name))
        if decision.has_patch or decision.action in (Action.CORDON, Action.UNCORDON):
            self.queue.add(node_key(name))  # the next step may already be due
        if decision.changed_state:
            self.fleet_soon()
        return recheck

    def _handoff(
        self, node: Obj, changes: Mapping[str, str | None], spec: ClusterPolicySpec | None
    ) -> dict[str, str | None]:
        """The driver manager's hand-off annotation (:mod:`statemachine.driver_handoff`),
        to go in the same patch as the node's labels: a driver pod can only start once its
        deploy label is written, so it always reads the value meant for it."""
        after = apply_label_changes(labels(node), changes)
        policies = self.owners.upgrade_policies()
        auto = {k: v.auto_upgrade for k, v in policies.items()} if policies is not None else None
        # Beside a GPUCluster the NVIDIADrivers' policy applies (upstream's labelling
        # controller counts a GPUCluster as using NVIDIADrivers).
        base = spec if spec is not None else self.owners.base_spec()
        return handoff_patch(node_annotations(node), handoff_wanted(after, base, auto))

    def _nvd_unknown(self, spec: ClusterPolicySpec | None, owned: bool) -> bool:
        """Whether upgrade decisions would read NVIDIADrivers before their cache listed:
        a node's (or, ``owned``, this node's) driver and upgradePolicy may be a
        resource's, and reading "no resource" as "auto-upgrade off" uncordons nodes in
        the middle of their upgrade and forgets it."""
        if self.owners.has_listed():
            return False
        return owned or (spec is not None and spec.driver.use_nvidia_driver_crd)

    async def _enrolment(
        self, node: Obj, changes: Mapping[str, str | None], spec: ClusterPolicySpec | None
    ) -> Decision | None:
        """The upgrade state a new GPU node starts in, written with its deploy labels.

        Upstream writes ``upgrade-done`` once the driver pod runs, a second patch per
        node during a rollout; a node with no driver pod that is about to get the
        ClusterPolicy's driver has nothing to upgrade, so the rulebook's ``enrolled``
        step says so in the same write. Anything else waits for the node pass.
        """
        if spec is None or not spec.driver.enabled or spec.driver.use_nvidia_driver_crd:
            return None
        after = apply_label_changes(labels(node), changes)
        if after.get(DEPLOY_DRIVER_LABEL) != TRUE or target_owner(after):
            return None
        policy = policy_view(spec)
        if not (policy.auto_upgrade and is_gpu_node(after)) or STATE_LABEL in after:
            return None
        app = self.owners.driver_app(node["metadata"]["name"])
        newest = self.upgrades.newest_driver_revision(app) if app else None
        fresh = {**node, "metadata": {**node["metadata"], "labels": after}}
        view = replace(await self.upgrades.view(fresh, policy, newest, app), enrolling=True)
        decision = next_step(view, policy)
        if decision.target is not UpgradeState.UPGRADE_DONE or decision.action is not Action.NONE:
            return None
        return decision

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
            held = None
            # Canary and halt: one gate per driver owner, each over its own nodes and
            # recorded on its own resource (the ClusterPolicy, or the NVIDIADriver).
            gated = self._gated(raw, spec, owner)
            if gated is not None:
                gate_raw, gate_spec, pools = gated
                # One rollout over all the owner's driver DaemonSets (one per kernel or
                # pool); each node is compared with its own DaemonSet's revision.
                newest, digest = self.upgrades.rollout(pools)
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
            started, conflict = await self.upgrades.grant(nodes, policy, held, tally)
            for name in started:
                self.queue.add(node_key(name))
            if conflict:  # the cache was behind a node: count again once it caught up
                again.after(CONFLICT_RETRY_S)
        tally.publish(self.upgrades.metrics)

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


def target_owner(node_labels: Mapping[str, str]) -> str | None:
    """The NVIDIADriver whose upgradePolicy and budget a node is under: the one it moves
    to while a move is recorded, else its owner (None: the ClusterPolicy's)."""
    return node_labels.get(NEXT_OWNER_LABEL) or node_labels.get(OWNER_LABEL)
