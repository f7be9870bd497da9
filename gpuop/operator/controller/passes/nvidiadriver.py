"""NVIDIADriver resources: owner labels on GPU nodes, per-pool driver DaemonSets, status.

One serial key (``nvidiadrivers``) does the whole fleet in one pass, because owner
assignment is a property of all resources together (a new resource can take nodes from
the default one). What a pass decides comes from pure code: owners from
:func:`statemachine.driver_owner.assign_owners`, DaemonSets from
:mod:`components.nvidiadriver`; this module only reads caches and writes.

Hand-over between the ClusterPolicy's driver and the resources is exclusive by
construction: a node gets an owner label (which the resources' DaemonSets select) only
once no ClusterPolicy driver DaemonSet exists and its pod has left the node, and the
ClusterPolicy's driver DaemonSet is held back (:meth:`NVIDIADrivers.holds_policy_driver`)
while any node carries an owner label or any resource's driver pod remains. Between two
resources likewise: a node loses its owner label before it gets the next one, and gets
it only once no driver pod is left on it; a move to a resource that upgrades
automatically is recorded (next-owner label) and carried out by the upgrade machine, a
move to one that does not waits for room in that resource's maxUnavailable (its nodes
without an owner or a Ready driver pod count).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from kubernetes_asyncio.client.exceptions import ApiException
from pydantic import ValidationError

from components import RenderContext, daemonset_ready, is_gpu_node, with_hash
from components import driver as driver_component
from components.driver_config import referenced_config_maps
from components.keys import TRUE
from components.nvidiadriver import (
    NVIDIADriverRenderError,
    deploy_label,
    gpucluster_base,
    policy_for,
    render,
)
from crd import (
    NVD_API_VERSION,
    NVD_KIND,
    OWNER_LABEL,
    REASON_DRIVER_NOT_READY,
    REASON_RECONCILE_FAILED,
    REASON_RECONCILED,
    ImageRefError,
    NVIDIADriver,
    parse_nvidiadriver,
)
from gpuop.kube.informer import Obj
from gpuop.kube.kinds import by_kind
from gpuop.log import get_logger
from gpuop.operator.controller.base.keys import CLUSTER_KEY, node_key
from gpuop.operator.controller.base.memo import VersionMemo
from gpuop.operator.controller.views.gpucluster_objects import gpucluster_owner
from gpuop.operator.controller.views.node_views import labels
from gpuop.operator.controller.views.objects import is_policy_driver, nvd_owner
from gpuop.operator.controller.views.pod_records import PodRecord, PodSubset, is_driver_pod, pod_app
from gpuop.operator.controller.views.routes import Wake
from gpuop.operator.controller.writers.apply import owned_by, owner_reference
from gpuop.operator.controller.writers.nvidiadriver_status import StatusWriter
from statemachine.driver_owner import NEXT_OWNER_LABEL, DriverResource, assign_owners
from statemachine.upgrade_keys import (
    SLOT_STATES,
    STATE_LABEL,
    parse_state,
    skipped,
)
from statemachine.upgrade_views import UpgradePolicyView

if TYPE_CHECKING:
    from gpuop.operator.controller.passes.nvidiadriver_host import DriverHost
    from gpuop.operator.controller.views.driver_owners import DriverOwners
    from gpuop.operator.events import EventRecorder

log = get_logger(__name__)

NVD = by_kind(NVD_API_VERSION, NVD_KIND)
NODE = by_kind("v1", "Node")
DAEMONSET = by_kind("apps/v1", "DaemonSet")
_DISABLED_MESSAGE = "useNvidiaDriverCRD is not enabled in ClusterPolicy"


class NVIDIADrivers:
    """The NVIDIADriver side of the operator; shares the operator's caches and writers."""

    def __init__(
        self,
        operator: DriverHost,
        events: EventRecorder,
        owners: DriverOwners,
        *,
        on_listed: Callable[[], None],
        wake: Callable[[Wake], None],
    ) -> None:
        self.op = operator
        rest = operator.rest
        #: The read side (which driver owns and runs on a node), shared with the node
        #: passes; its NVIDIADriver cache is watched here (``run``).
        self.owners = owners
        self.drivers = owners.drivers
        self._on_listed = on_listed
        #: What its own label writes wake (the node, cluster and fleet passes), queued
        #: by the operator as a watch event's wakes are.
        self._wake = wake
        #: Every driver pod (the ClusterPolicy's and each NVIDIADriver's), followed
        #: through the operator's cache of operand pods (``follow_pod``).
        self.driver_pods = PodSubset(is_driver_pod)
        #: Read by every cluster pass, worked out again only after the driver pods
        #: changed (a rollout's passes would otherwise scan every driver pod each time).
        self._foreign_pods: VersionMemo[str, bool] = VersionMemo()
        self.status = StatusWriter(rest, operator.config.namespace, events, self.drivers)

    # ------------------------------------------------------------ watching
    async def run(self) -> None:
        """Watch NVIDIADrivers; without the CRD the informer backs off and retries, and
        this controller changes nothing until it has listed them once."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self.drivers.run(), name="watch-nvidiadrivers")
            await self.drivers.synced.wait()
            self._on_listed()  # the passes that waited for it

    def follow_pod(self, old: PodRecord | None, new: PodRecord | None) -> bool:
        """Follow one event of the operand pods cache; True when it was a driver pod's.
        What that wakes is the operator's router's to say (`views.routes.route_pod`)."""
        return self.driver_pods.update(old, new)

    # ----------------------------------------------------------- questions
    def holds_policy_driver(self) -> bool:
        """Whether the ClusterPolicy's driver DaemonSet must wait: a resource still owns a
        node or still has a driver pod running."""
        return bool(self.owners.owned_nodes()) or self._has_foreign_driver_pods()

    def _has_foreign_driver_pods(self) -> bool:
        """Whether any driver pod belongs to an NVIDIADriver's DaemonSet."""
        return self._foreign_pods.get(
            "pods",
            str(self.driver_pods.version),
            lambda: any(not is_policy_driver(pod_app(p)) for p in self.driver_pods.values()),
        )

    def upgrade_incomplete(self) -> list[str]:
        """Nodes owned by a resource whose driver upgrade is pending, running or failed
        (the ClusterPolicy is not ready meanwhile, as upstream)."""
        return sorted(
            n["metadata"]["name"]
            for n in self.op.nodes.values()
            if (labels(n).get(OWNER_LABEL) or labels(n).get(NEXT_OWNER_LABEL))
            and not skipped(labels(n))
            and labels(n).get(STATE_LABEL) not in (None, "", "upgrade-done")
        )

    def _held_nodes(self) -> set[str]:
        """Nodes that may not gain an owner yet: they still run a driver pod (the
        ClusterPolicy's or a former owner's, terminating ones too), or (while the
        ClusterPolicy's DaemonSet exists) might get one again."""
        if any(
            is_policy_driver(d["metadata"]["name"]) for d in self.op.owned["DaemonSet"].values()
        ):
            return set(self.op.nodes.store)
        return self.driver_pods.nodes()

    def _unready_nodes(
        self, gpu: Mapping[str, Mapping[str, str]], models: Mapping[str, NVIDIADriver]
    ) -> set[str]:
        """GPU nodes whose owner's driver DaemonSets select them (its deploy label is
        ``true``) but that have no Ready driver pod: starting, failing, or not created
        yet. A hand-over to that owner waits while they take its budget
        (:func:`statemachine.driver_owner.assign_owners`); a pod turning Ready wakes
        this pass (``views.routes.route_pod``)."""
        ready = {p.node for p in self.driver_pods.values() if p.ready and not p.deleting}
        unready = set()
        for name, node_labels in gpu.items():
            model = models.get(node_labels.get(OWNER_LABEL, ""))
            if (
                model is not None
                and name not in ready
                and node_labels.get(deploy_label(model.spec)) == TRUE
            ):
                unready.add(name)
        return unready

    # ----------------------------------------------------------- reconcile
    async def reconcile(self) -> None:
        if not self.owners.has_listed():
            return
        raws = sorted(self.drivers.values(), key=lambda r: r["metadata"]["name"])
        if not self.owners.enabled():
            await self._disable(raws)
            return
        models: dict[str, NVIDIADriver] = {}
        for raw in raws:
            try:
                models[raw["metadata"]["name"]] = parse_nvidiadriver(raw)
            except ValidationError as err:
                await self._fail(raw, REASON_RECONCILE_FAILED, f"invalid NVIDIADriver: {err}")
        nodes = self.op.nodes.values()
        gpu = {n["metadata"]["name"]: labels(n) for n in nodes if is_gpu_node(labels(n))}
        policies = self.owners.upgrade_policies() or {}
        resources = driver_resources(models, policies)
        managed = {name for name, policy in policies.items() if policy.auto_upgrade}
        busy = {
            name
            for name, node_labels in gpu.items()
            if NEXT_OWNER_LABEL not in node_labels
            and parse_state(node_labels.get(STATE_LABEL)) in SLOT_STATES
        }
        unready = self._unready_nodes(gpu, models)
        assignment = assign_owners(gpu, resources, self._held_nodes(), managed, busy, unready)
        intended = assignment.targets  # once every hand-over is done
        changes: dict[str, dict[str, str | None]] = {}
        for name, owner in assignment.changes.items():
            changes.setdefault(name, {})[OWNER_LABEL] = owner
        for name, next_owner in assignment.moves.items():
            changes.setdefault(name, {})[NEXT_OWNER_LABEL] = next_owner
        for node in nodes:
            name = node["metadata"]["name"]
            if name not in gpu:
                gone: dict[str, str | None] = {
                    k: None for k in (OWNER_LABEL, NEXT_OWNER_LABEL) if k in labels(node)
                }
                if gone:
                    changes[name] = gone
        await self._label(changes)
        if self.owners.gpucluster_mode() and models:
            await self._apply_driver_accounts()

        for name, model in models.items():
            current = self.drivers.get(name)
            if current is None or model.deleting:
                continue
            problem = assignment.problems.get(name)
            if problem is not None:
                await self._fail(current, problem.reason, problem.message)
                continue
            waiting = sorted(
                n for n, o in intended.items() if o == name and assignment.owners.get(n) != name
            )
            await self._reconcile_one(current, model, waiting)

    async def _apply_driver_accounts(self) -> None:
        """Beside a GPUCluster no ClusterPolicy renders what the pools' pods run as (the
        driver's service account and RBAC) and mount (its startup-probe ConfigMap): they
        are applied here, as the ClusterPolicy's driver renders them, and owned by the
        GPUCluster, so garbage collection removes them with it (the ClusterPolicy's prune
        leaves them alone)."""
        cluster = self.op.gpucluster_object()
        if cluster is None:
            return
        ctx = RenderContext(
            namespace=self.op.config.namespace,
            operator_image=self.op.config.operator_image,
            operator_image_pull_policy=self.op.config.operator_image_pull_policy,
            operator_image_pull_secrets=self.op.config.operator_image_pull_secrets,
        )
        owner = gpucluster_owner(cluster["metadata"])
        for obj in driver_component.render(gpucluster_base(), ctx):
            owned = with_hash(owned_by(obj, owner))
            if self.op.applier.needs_apply(owned):
                await self.op.applier.apply(owned)

    async def _reconcile_one(self, raw: Obj, model: NVIDIADriver, waiting: list[str]) -> None:
        """Apply and prune one resource's DaemonSets; ``waiting`` are the nodes it will
        own once their current driver pod has left (it is not ready before)."""
        spec = self.owners.base_spec()
        assert spec is not None
        meta = raw["metadata"]
        names = referenced_config_maps(policy_for(model.spec, spec))
        ctx = RenderContext(
            namespace=self.op.config.namespace,
            operator_image=self.op.config.operator_image,
            operator_image_pull_policy=self.op.config.operator_image_pull_policy,
            operator_image_pull_secrets=self.op.config.operator_image_pull_secrets,
            config_map_keys=self.op.site_config.keys(names),
        )
        try:
            desired = render(
                meta["name"], meta["uid"], model.spec, self.op.nodes.values(), spec, ctx
            )
        except (NVIDIADriverRenderError, ImageRefError) as err:
            await self._fail(raw, REASON_RECONCILE_FAILED, str(err))
            return
        owner = owner_reference(NVD_API_VERSION, NVD_KIND, meta)
        objs = [with_hash(owned_by(o, owner)) for o in desired]
        # After a halt with rollbackOnHalt, its pools go back (statemachine.rollback).
        objs = await self.op.rollback.apply(raw, objs, owner=meta["name"])
        for obj in objs:
            if self.op.applier.needs_apply(obj):
                await self.op.applier.apply(obj)
        wanted = {o["metadata"]["name"] for o in objs}
        daemonsets = self.op.owned["DaemonSet"]
        for ds in daemonsets.values():
            ds_meta = ds["metadata"]
            if nvd_owner(ds) != meta["name"] or ds_meta["name"] in wanted:
                continue
            if ds_meta.get("deletionTimestamp"):
                continue
            await self.op.rest.delete(DAEMONSET, ds_meta["name"], ds_meta.get("namespace"))
            log.info("deleted", kind="DaemonSet", name=ds_meta["name"], nvidiadriver=meta["name"])
        problems = [f"{node}: waiting for the previous driver to leave" for node in waiting]
        for obj in objs:
            observed = daemonsets.get(f"{obj['metadata']['namespace']}/{obj['metadata']['name']}")
            ok, message = daemonset_ready(observed) if observed else (False, "not created yet")
            if not ok or self.op.applier.needs_apply(obj):
                problems.append(f"{obj['metadata']['name']}: {message}")
        if problems:
            await self.status.write(
                raw,
                "notReady",
                (False, "Error", ""),
                (True, REASON_DRIVER_NOT_READY, "Waiting for driver pod to be ready"),
            )
        else:
            await self.status.write(
                raw,
                "ready",
                (True, REASON_RECONCILED, "All resources have been successfully reconciled"),
                (False, "Ready", ""),
            )

    async def _disable(self, raws: list[Obj]) -> None:
        """ClusterPolicy does not use NVIDIADrivers: give every node back, then say so."""
        for ds in list(self.op.owned["DaemonSet"].values()):
            meta = ds["metadata"]
            if nvd_owner(ds) is not None and not meta.get("deletionTimestamp"):
                await self.op.rest.delete(DAEMONSET, meta["name"], meta.get("namespace"))
                log.info("deleted", kind="DaemonSet", name=meta["name"], reason="disabled")
        await self._label(
            {n: {OWNER_LABEL: None, NEXT_OWNER_LABEL: None} for n in self.owners.owned_nodes()}
        )
        for raw in raws:
            if raw["metadata"].get("deletionTimestamp"):
                continue
            await self.status.write(
                raw, "disabled", (False, "Error", ""), (True, REASON_RECONCILED, _DISABLED_MESSAGE)
            )

    async def _label(self, changes: dict[str, dict[str, str | None]]) -> None:
        """Owner and next-owner label changes, per node."""
        for name, patch in sorted(changes.items()):
            try:
                patched = await self.op.rest.merge_patch(
                    NODE, name, {"metadata": {"labels": patch}}
                )
            except ApiException as err:
                if err.status == 404:
                    continue
                raise
            self.op.nodes.observe(patched)
            # Cached before its watch event, which then changes nothing: the node's
            # upgrade (a move starts, or is handed over) is woken here.
            self._wake(Wake((node_key(name),)))
            log.info(
                "driver owner", node=name, **{k.rsplit(".", 1)[-1]: v for k, v in patch.items()}
            )
        if changes:
            # Our own write may have been cached before its watch event arrives, and the
            # ClusterPolicy's driver waits on owner labels: tell it now.
            self._wake(Wake((CLUSTER_KEY,), fleet=True))

    async def _fail(self, raw: Obj, reason: str, message: str) -> None:
        await self.status.write(
            raw, "notReady", (False, "Error", ""), (True, reason, message[:32000])
        )


def driver_resources(
    models: Mapping[str, NVIDIADriver], policies: Mapping[str, UpgradePolicyView] | None = None
) -> list[DriverResource]:
    """What owner assignment (:func:`statemachine.driver_owner.assign_owners`) reads of
    each parsed NVIDIADriver, by name (shared with the conformance test); ``policies``:
    each one's upgradePolicy (``DriverOwners.upgrade_policies``), whose maxUnavailable
    bounds its hand-overs (upstream's default where missing)."""
    return [
        DriverResource(
            name=name,
            default=m.spec.default,
            node_selector=dict(m.spec.node_selector or {}),
            deleting=m.deleting,
            max_unavailable=(policies or {}).get(name, UpgradePolicyView()).max_unavailable,
        )
        for name, m in models.items()
    ]
