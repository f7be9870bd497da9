"""The cluster pass (key ``cluster``): one ClusterPolicy in, every operand object out.

It takes the active policy, renders every enabled component, holds the ClusterPolicy's
driver back while NVIDIADrivers hand nodes over, applies what changed, prunes what no
component wants, and writes a status assembled by a pure function
(:func:`gpuop.operator.controller.views.cluster_status.cluster_status`) from what it observed:
per-component
readiness, per-node rollout counts, refusals and whether NFD has labelled any node.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from components import COMPONENTS
from components.driver import NAME as DRIVER_COMPONENT
from components.readiness import component_ready
from crd import (
    REASON_RECONCILE_FAILED,
    ClusterPolicy,
    ClusterPolicySpec,
    ClusterPolicyStatus,
    not_ready_status,
)
from gpuop.kube.informer import Informer, Obj
from gpuop.kube.rest import Rest
from gpuop.log import get_logger
from gpuop.operator.controller.base.config import OperatorConfig
from gpuop.operator.controller.base.optional_watches import OptionalWatches
from gpuop.operator.controller.base.pace import LEAST_WAIT_S
from gpuop.operator.controller.base.result import Again, Result
from gpuop.operator.controller.base.site_config import SiteConfigMaps
from gpuop.operator.controller.views.active_policy import ActivePolicy
from gpuop.operator.controller.views.cluster_status import (
    ClusterObservation,
    cluster_status,
    invalid_status,
)
from gpuop.operator.controller.views.label_gate import LabelGate
from gpuop.operator.controller.views.node_views import GpuFleet, GpuNodes
from gpuop.operator.controller.views.objects import generation, parse_status
from gpuop.operator.controller.views.rollout_view import NodeRollouts, RolloutView
from gpuop.operator.controller.writers.apply import Applier
from gpuop.operator.controller.writers.pod_security import PodSecurityLabels
from gpuop.operator.controller.writers.policy_render import Desired, PolicyRender
from gpuop.operator.controller.writers.policy_status import PolicyStatusWriter, now
from gpuop.operator.controller.writers.rollback import RollbackTemplates
from gpuop.operator.controller.writers.rollout_reports import RolloutReports, Timers
from gpuop.operator.metrics import STATUS_ERROR, STATUS_NO_POLICY, STATUS_READY, OperatorMetrics
from statemachine.rollout import ComponentStatus, plan_rollout

log = get_logger(__name__)

COALESCE_MIN_S = LEAST_WAIT_S
COALESCE_MAX_S = 5.0
COALESCE_FACTOR = 200.0
"""A rollout's pass waits this many times its last CPU time for more news. At 1,000
GPU nodes a pass costs about 13 ms and ran about twice a second at 50 times (243 passes,
3.1 CPU seconds over a 122 s rollout, ``gpu_operator_reconciliation_cpu_seconds``):
on two cores shared with the control plane every one of those seconds delays the
pods. At 200 times the status is still at most seconds behind, and the end of a rollout
is never held back (``gpuop.operator.controller.base.pace``)."""
STALE_RETRY_S = 1.0
"""When a pass left stale pods for later (the per-pass cap), the next pass runs this
soon even if their deletions wake nothing."""


class DriverHandover(Protocol):
    """What the cluster pass asks of the NVIDIADriver pass (another pass: named here,
    never imported, so the passes stay independent)."""

    def holds_policy_driver(self) -> bool: ...
    def upgrade_incomplete(self) -> list[str]: ...


@dataclass(kw_only=True)
class ClusterReconciler:
    """The cluster pass over the operator's caches. Besides them it keeps only what is
    derived from them (memos of the render, node facts and the Prometheus Operator API
    probes, the label gate) and its last CPU time, which paces the next pass."""

    config: OperatorConfig
    rest: Rest
    metrics: OperatorMetrics
    nodes: Informer
    daemonsets: Informer
    active_policy: ActivePolicy
    applier: Applier
    status: PolicyStatusWriter
    rollouts: NodeRollouts
    reports: RolloutReports
    nvd: DriverHandover
    """The NVIDIADriver pass, as far as the ClusterPolicy's driver waits for it."""
    watches: OptionalWatches
    timers: Timers
    """The stuck-node timer's (``rollout-stuck``, not this pass's own key)."""
    again: Again
    """When this pass wants to run again; its applier and status writer are handed it."""
    site_config: SiteConfigMaps
    _pass_cpu_s: float = field(default=0.0, init=False)
    _render: PolicyRender = field(init=False)
    _gpu_nodes: GpuNodes = field(init=False)
    label_gate: LabelGate = field(default_factory=LabelGate)
    gpucluster_conflict: Callable[[], str | None] = field(default=lambda: None)
    """Set by the operator: the name of a GPUCluster that exists, if one does."""
    rollback: RollbackTemplates | None = None
    """Set by the operator: the driver's templates while a rollback stands."""
    gpucluster_known: Callable[[], bool] = field(default=lambda: True)
    """Set by the operator: whether the GPUCluster cache has listed, so that
    ``gpucluster_conflict``'s None means "none exists" (its listing wakes this pass)."""
    _psa: PodSecurityLabels = field(init=False)

    def __post_init__(self) -> None:
        self._psa = PodSecurityLabels(self.rest, self.config.namespace)
        self._gpu_nodes = GpuNodes(self.nodes)
        self._render = PolicyRender(
            config=self.config, rest=self.rest, watches=self.watches, site_config=self.site_config
        )

    def coalesce_seconds(self) -> float:
        """How long a pass waits after a progress event (a pod or an operand object
        moved): events that arrive meanwhile are counted by the same pass. Scaled by
        what the last pass cost, so the pass takes at most about 1/``COALESCE_FACTOR``
        of a CPU during a rollout's event storm (CPU the control plane scheduling the
        pods needs too) and status stays seconds behind at most. The operator asks
        for the pass at once when every DaemonSet turns ready, so the wait never
        lengthens the end of a rollout (``EventRouter.progress``)."""
        return min(COALESCE_MAX_S, max(COALESCE_MIN_S, COALESCE_FACTOR * self._pass_cpu_s))

    async def reconcile(self) -> Result:
        """One pass; when it wants to run again (a pass that raised keeps its wish for
        the work queue's retry)."""
        await self._measured()
        return self.again.take()

    async def _measured(self) -> None:
        self.metrics.reconciliation_total.inc()
        cpu = time.thread_time()
        try:
            await self._reconcile()
        except Exception:
            self.metrics.reconciliation_failed_total.inc()
            self.metrics.reconciliation_status.set(STATUS_ERROR)
            raise
        finally:
            # Thread CPU, so awaiting the API server costs nothing; what other tasks
            # ran during those awaits is counted too, which only lengthens the wait.
            self._pass_cpu_s = time.thread_time() - cpu
            self.metrics.reconciliation_cpu_seconds_total.inc(self._pass_cpu_s)

    async def _reconcile(self) -> None:
        fleet = self._gpu_nodes()
        gpu_nodes = list(fleet.nodes)
        self.metrics.gpu_nodes_total.set(len(gpu_nodes))
        self.metrics.reconciliation_has_nfd_labels.set(1 if fleet.has_nfd else 0)
        raw, model, problems = self.active_policy()
        if raw is None:
            self.metrics.reconciliation_status.set(STATUS_NO_POLICY)
            await self.applier.prune([])
            return
        await self.status.mark_ignored(raw["metadata"]["name"])
        previous = parse_status(raw)
        if model is None or problems:
            await self._invalid(raw, model, problems, previous)
        elif not self.gpucluster_known():
            # Whether a GPUCluster exists is not known yet (after a restart its cache
            # lists after ours): applying now could start a second stack beside a
            # GPUCluster's, and standing aside never prunes it. Nothing is written
            # either way; the cache's listing queues this pass (`gpucluster_known`).
            log.debug("ClusterPolicy waits for the GPUCluster cache to list")
        elif (gpucluster := self.gpucluster_conflict()) is not None:
            await self._stand_aside(raw, gpucluster, previous)
        else:
            await self._roll_out(raw, model, previous, fleet, gpu_nodes)

    async def _invalid(
        self,
        raw: Obj,
        model: ClusterPolicy | None,
        problems: list[str],
        previous: ClusterPolicyStatus | None,
    ) -> None:
        """An invalid policy changes nothing; its status says why."""
        gen = generation(raw)
        status = invalid_status(self.config.namespace, model, problems, gen, previous, now())
        await self.status.write(raw, status)
        self.metrics.reconciliation_status.set(STATUS_ERROR)
        log.warning("ClusterPolicy is invalid", policy=raw["metadata"]["name"], problems=problems)

    async def _stand_aside(
        self, raw: Obj, gpucluster: str, previous: ClusterPolicyStatus | None
    ) -> None:
        """As upstream: a ClusterPolicy and a GPUCluster cannot coexist, and the
        ClusterPolicy stands aside (its operands stay as they are) until it is gone."""
        message = (
            f'conflicting GPUCluster resource "{gpucluster}" detected;'
            " ClusterPolicy and GPUCluster cannot co-exist"
        )
        status = not_ready_status(
            self.config.namespace,
            reason=REASON_RECONCILE_FAILED,
            message=message,
            error=True,
            generation=generation(raw),
            now=now(),
            previous=previous,
        )
        await self.status.write(raw, status)
        self.metrics.reconciliation_status.set(STATUS_ERROR)

    async def _roll_out(
        self,
        raw: Obj,
        model: ClusterPolicy,
        previous: ClusterPolicyStatus | None,
        fleet: GpuFleet,
        gpu_nodes: list[Obj],
    ) -> None:
        """Apply every enabled component at once, as upstream (each node orders itself:
        init containers wait for its validation files, so a stuck node holds back only
        itself), and write the status the fleet machine summarises."""
        spec = model.spec
        gen = generation(raw)
        await self._psa.ensure(spec.psa.enabled, (raw["metadata"].get("uid"), gen))
        self.metrics.driver_auto_upgrade_enabled.set(
            1 if spec.driver.enabled and spec.driver.upgrade_policy.auto_upgrade else 0
        )
        desired, held = await self._desired(raw, spec, gpu_nodes, fleet)
        objects = [o for objs in desired.values() for o in objs]
        waiting = self._held_back(raw, desired, objects, spec, gpu_nodes, fleet)
        view = self.rollouts.view(desired, gpu_nodes)
        snapshot, actual = self._components(desired, spec, held, view, waiting, fleet.nfd_away)
        plan = plan_rollout(snapshot, previous.rollout_state if previous else None)
        refused = await self.applier.apply_all([o for o in objects if id(o) not in waiting])
        await self.applier.prune(objects)
        if await self.reports.release_stale(fleet.out_of_service, desired):
            self.again.after(STALE_RETRY_S)  # the cap left some
        self.reports.schedule(view, self.timers)
        seen = ClusterObservation(
            namespace=self.config.namespace,
            model=model,
            generation=gen,
            previous=previous,
            plan=plan,
            snapshot=snapshot,
            actual=actual,
            view=view,
            refused=refused,
            has_nfd=fleet.has_nfd,
            config_problems=self.config_problems,
        )
        status, outcome = cluster_status(seen, now())
        if refused:
            self.metrics.reconciliation_failed_total.inc()
        self.metrics.reconciliation_status.set(outcome)
        if outcome == STATUS_READY:
            self.metrics.reconciliation_last_success.set(time.time())
        await self.reports.announce(raw, view)
        await self.status.write(raw, status)

    async def _desired(
        self, raw: Obj, spec: ClusterPolicySpec, gpu_nodes: list[Obj], fleet: GpuFleet
    ) -> tuple[Desired, bool]:
        """The rendered objects, with the driver's rollback templates in, and without
        its DaemonSets while NVIDIADriver pods still run (True: held for them)."""
        desired = await self._render.render(raw, spec, gpu_nodes, fleet)
        if self.rollback is not None and desired.get(DRIVER_COMPONENT):
            desired[DRIVER_COMPONENT] = await self.rollback.apply(raw, desired[DRIVER_COMPONENT])
        held = self.nvd.holds_policy_driver()
        if held:
            # NVIDIADriver pods still run: the ClusterPolicy's driver waits until they left.
            desired[DRIVER_COMPONENT] = [
                o for o in desired[DRIVER_COMPONENT] if o["kind"] != "DaemonSet"
            ]
        return desired, held

    def _held_back(
        self,
        raw: Obj,
        desired: Desired,
        objects: list[Obj],
        spec: ClusterPolicySpec,
        gpu_nodes: list[Obj],
        fleet: GpuFleet,
    ) -> set[int]:
        """The ``id`` of each object neither written nor pruned this pass."""
        waiting = self._wait_for_labels(raw, objects, spec, gpu_nodes, fleet.version)
        driver_sets = {id(o) for o in desired[DRIVER_COMPONENT] if o["kind"] == "DaemonSet"}
        if self.config_problems:
            # The driver's site configuration is incomplete: rolling drivers out without
            # the repositories or certificates they need would break nodes that work
            # now, so the driver DaemonSets are neither written nor pruned.
            waiting |= driver_sets
        if fleet.nfd_away:
            # NFD's labels are away from some GPU nodes (NFD's uninstall pruned them, a
            # new NFD has not labelled yet): the driver image's OS tag and a precompiled
            # driver's kernel come from them, so a driver rendered now could differ only
            # for want of them and restart every driver. The driver DaemonSets stay as
            # they are, neither written nor pruned, until NFD labels the nodes again.
            waiting |= driver_sets
        return waiting

    @property
    def config_problems(self) -> tuple[str, ...]:
        """Why the last render lacks the driver's site configuration (a named ConfigMap
        missing, an OS with no known directory): empty when it has it all."""
        return self._render.config_problems

    def _wait_for_labels(
        self,
        raw: Obj,
        objects: list[Obj],
        spec: ClusterPolicySpec,
        gpu_nodes: list[Obj],
        nodes_version: int,
    ) -> set[int]:
        """The ``id`` of each new workload held back until the deploy labels are written
        (see :mod:`gpuop.operator.controller.views.label_gate`); the pass counts again soon, until
        the labels are written or the deadline passes. ``nodes_version``: the node
        cache's version ``gpu_nodes`` were read at."""
        held, look_again = self.label_gate.hold(
            objects,
            lambda o: self.applier.observed(o) is not None,
            gpu_nodes,
            spec,
            (str(raw["metadata"].get("uid")), generation(raw)),
            nodes_version,
        )
        if look_again is not None:
            self.again.after(look_again)
        return {id(o) for o in held}

    def _components(
        self,
        desired: Desired,
        spec: ClusterPolicySpec,
        held: bool,
        view: RolloutView,
        waiting: set[int],
        nfd_away: int = 0,
    ) -> tuple[dict[str, ComponentStatus], dict[str, tuple[bool, str]]]:
        """Each component as the rollout machine sees it, and each enabled one's
        (ready, message): applied, its objects ready, on every node it should run on."""
        snapshot: dict[str, ComponentStatus] = {}
        actual: dict[str, tuple[bool, str]] = {}
        daemonsets = {d["metadata"]["name"]: d for d in self.daemonsets.values()}
        for comp in COMPONENTS:
            objs = desired[comp.name]
            if not objs:
                snapshot[comp.name] = ComponentStatus(enabled=False)
                continue
            applied = all(not self.applier.needs_apply(o) for o in objs)
            ready, message = component_ready(objs, daemonsets)
            if comp.name == DRIVER_COMPONENT and nfd_away:
                ready = False
                message = f"held while NFD's labels are away from {nfd_away} GPU nodes"
            elif any(id(o) in waiting for o in objs):
                waits = self.label_gate.waiting_nodes
                ready, message = False, f"waiting for deploy labels on {waits} GPU nodes"
            elif not applied:
                ready, message = False, "applying"
            if comp.name == DRIVER_COMPONENT:
                ready, message = self._driver_handover(spec, held, ready, message)
            ready, message = view.component(comp.name, ready, message)
            actual[comp.name] = (ready, message)
            snapshot[comp.name] = ComponentStatus(enabled=True, ready=ready, message=message)
        return snapshot, actual

    def _driver_handover(
        self, spec: ClusterPolicySpec, held: bool, ready: bool, message: str
    ) -> tuple[bool, str]:
        """The driver state while NVIDIADrivers are involved: not ready while their pods
        are being replaced by the ClusterPolicy's, or while one of their upgrades is
        pending, running or failed (as upstream)."""
        if held and not spec.driver.use_nvidia_driver_crd:
            return False, "waiting for NVIDIADriver driver pods to leave"
        upgrading = self.nvd.upgrade_incomplete() if spec.driver.use_nvidia_driver_crd else []
        if upgrading:
            more = f" and {len(upgrading) - 3} more" if len(upgrading) > 3 else ""
            return (
                False,
                f"NVIDIADriver upgrade in progress or failed on {', '.join(upgrading[:3])}{more}",
            )
        return ready, message
