"""The GPUCluster controller: upstream's DRA stack from one `nvidia.com/v1alpha1` object.

One serial key (``gpuclusters``) does the whole pass: the GPUCluster is a singleton (its
CRD allows only `gpu-cluster`). What a pass wants comes from pure code
(:mod:`components.dra`); this module reads caches and writes. Its objects carry
upstream's `nvidia.com/gpu-operator.state` label, which its own caches select on, so
the ClusterPolicy's caches (selected on our managed-by label) never see, re-apply or
prune them, and NVIDIA's operator's objects of the same states are adopted.

As upstream:

* A ClusterPolicy beside it is a conflict: the GPUCluster is notReady with an Error
  condition (`PrerequisiteNotMet`) and nothing is applied; the ClusterPolicy side does
  the same (`gpuop.operator.controller.passes.cluster`).
* The operator namespace is labelled `resource.kubernetes.io/admin-access=true` before
  the admin-access claim templates are written (the API server refuses them without
  it); the label stays, other consumers may rely on it.
* A finalizer holds a deleted GPUCluster until the DaemonSets whose pods hold
  ResourceClaims are gone (deleted with foreground propagation, so each waits for its
  pods): garbage collection alone would remove the kubelet plugin too, and pods whose
  claims nobody can unprepare hang in Terminating.

Everything is decided from stored state (the object, its finalizer, the caches), so a
restarted operator resumes where the last one stopped; a pass that changes nothing
writes nothing, and an invalid spec is a status condition, never a crash loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from components import RenderContext, daemonset_ready, with_hash
from components.dra import KINDS, STATE_LABEL, claim_consumers, render
from components.kinds import SERVICE_MONITOR
from crd import (
    GC_API_VERSION,
    GC_KIND,
    REASON_INVALID_SPEC,
    REASON_OPERAND_NOT_READY,
    REASON_PREREQUISITE_NOT_MET,
    REASON_RECONCILE_FAILED,
    REASON_RECONCILED,
    GPUClusterSpec,
    ImageRefError,
    gpucluster_unsupported_fields,
    parse_gpucluster,
)
from gpuop.kube.informer import Handler, Informer, Obj, ResourceSpec
from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Kind, Rest
from gpuop.log import get_logger
from gpuop.operator.controller.base.optional_watches import OptionalWatches
from gpuop.operator.controller.base.result import Again, Result
from gpuop.operator.controller.views.gpucluster_objects import gpucluster_owner
from gpuop.operator.controller.writers.apply import Applier, object_key, owned_by
from gpuop.operator.controller.writers.gpucluster_status import GPUClusterStatus
from gpuop.operator.events import EventRecorder

log = get_logger(__name__)

GPUCLUSTER = by_kind(GC_API_VERSION, GC_KIND)
NAMESPACE = by_kind("v1", "Namespace")
DAEMONSET = by_kind("apps/v1", "DaemonSet")
FINALIZER = "gpucluster.nvidia.com/dra-resourceclaim"
"""Upstream's: holds a deleted GPUCluster until its claim-holding DaemonSets are gone."""
ADMIN_ACCESS_LABEL = "resource.kubernetes.io/admin-access"
"""The namespace label the API server requires before adminAccess claims are admitted."""
FOREGROUND = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Foreground"}
DRAIN_RETRY_S = 5.0
"""Backstop while claim consumers drain (their deletion events also wake the pass)."""
STATE_READY, STATE_NOT_READY = "ready", "notReady"


def controlled_by(obj: Obj, uid: str) -> bool:
    return any(
        ref.get("kind") == GC_KIND and ref.get("controller") and ref.get("uid") == uid
        for ref in obj["metadata"].get("ownerReferences") or ()
    )


def conflict_message(policy: str) -> str:
    return (
        f'A ClusterPolicy CR "{policy}" exists; a ClusterPolicy CR and GPUCluster CR'
        " may not exist at the same time"
    )


class GPUClusters:
    """The GPUCluster side of the operator: its own caches, whose events it hands to
    the operator's router (``on_cluster``, ``on_object``) after keeping its books."""

    def __init__(
        self,
        rest: Rest,
        namespace: str,
        policies: Informer,
        events: EventRecorder,
        operator_image: str,
        *,
        on_cluster: Handler,
        on_object: Handler,
        on_known: Callable[[], None],
        on_listed: Callable[[], None],
        operator_image_pull_policy: str | None = None,
        operator_image_pull_secrets: tuple[str, ...] = (),
    ) -> None:
        self.rest = rest
        self.namespace = namespace
        #: When the pass wants to run again (a refusal's retry, a drain's backstop).
        self._again = Again()
        self.policies = policies
        self.events = events
        self._on_object = on_object
        #: Told once whether a GPUCluster exists is known (node labels follow it), and
        #: once every cache has listed (the pass may act).
        self._on_known = on_known
        self._on_listed = on_listed
        self.operator_image = operator_image
        self.operator_image_pull_policy = operator_image_pull_policy
        self.operator_image_pull_secrets = operator_image_pull_secrets
        # A cluster that does not serve the CRD has no GPUCluster: that is an answer the
        # ClusterPolicy's pass waits for (`knows_whether_one_exists`), never a failure.
        self.clusters = Informer(
            ResourceSpec("gpuclusters", rest.lister(GPUCLUSTER), absent_is_empty=True),
            on_cluster,
        )
        self._status = GPUClusterStatus(rest, self.clusters, events, namespace)
        self.owned: dict[str, Informer] = {
            k.kind: self._owned_informer(k) for k in KINDS if not k.optional
        }
        # An optional kind (the Prometheus Operator's ServiceMonitor) is watched only
        # once discovery finds its API, as on the ClusterPolicy side: a list retried
        # against an API that is not served would make an idle operator send requests.
        self.watches = OptionalWatches(
            self.owned, self._owned_informer, lambda: on_object("LISTED", None, None)
        )
        #: (generation, served) of the last ServiceMonitor discovery.
        self._monitor_served: tuple[Any, bool] | None = None
        self.applier = Applier(rest, self.owned, self._again.after, events)

    def _owned_informer(self, kind: Any) -> Informer:
        rest_kind = by_kind(kind.api_version, kind.kind)
        lister = self.rest.lister(rest_kind, self.namespace if kind.namespaced else None)
        spec = ResourceSpec(f"gpucluster-{kind.plural}", lister, label_selector=STATE_LABEL)
        return Informer(spec, lambda event, old, new: self._on_owned(rest_kind, event, old, new))

    # ------------------------------------------------------------ watching
    @property
    def informers(self) -> list[Informer]:
        return [self.clusters, *self.owned.values()]

    async def run(self) -> None:
        """Watch GPUClusters and their objects. Without the CRD the GPUCluster cache
        counts as listed and empty (so the ClusterPolicy's pass, which waits to know,
        is not held for ever) and keeps retrying, picking up a CRD installed later;
        the GPUCluster pass does nothing until every cache has listed."""
        async with asyncio.TaskGroup() as group:
            for informer in self.informers:
                group.create_task(informer.run(), name=f"watch-{informer.spec.name}")
            group.create_task(self.watches.run(), name="gpucluster-optional-watches")
            await self.clusters.synced.wait()
            self._on_known()  # node labels may follow whether a GPUCluster exists
            await asyncio.gather(*(i.synced.wait() for i in self.informers))
            self._on_listed()

    def has_listed(self) -> bool:
        """Every cache has listed: only then may a pass apply, prune or drain."""
        return all(i.synced.is_set() for i in self.informers)

    def knows_whether_one_exists(self) -> bool:
        """The GPUCluster cache has listed (enough for node labels and for whether the
        ClusterPolicy must stand aside): before, :meth:`conflict` reads an empty cache
        as "none", and a restarted operator applied the ClusterPolicy's whole stack
        beside a GPUCluster's (issue 43). Its own: a cluster that does not serve the
        DRA APIs (before Kubernetes 1.34) never lists the DeviceClass cache, and must
        not hold the ClusterPolicy's uninstall back; one that does not serve the
        GPUCluster CRD counts as listed (``ResourceSpec.absent_is_empty``)."""
        return self.clusters.synced.is_set()

    def current(self) -> Obj | None:
        """The GPUCluster, if one exists (deleting or not)."""
        return next(iter(self.clusters.values()), None)

    def active(self) -> bool:
        """Whether a GPUCluster's node labels hold: while one exists and is not being
        deleted, and while a deleted one still carries our finalizer. The DRA kubelet
        plugin follows `nvidia.com/gpu.deploy.dra-driver`; dropping it at the
        deletionTimestamp took the plugin away while the finalizer still waited for
        the claim holders, whose claims nobody could then unprepare (issue 43)."""
        raw = self.current()
        if raw is None:
            return False
        meta = raw["metadata"]
        return not meta.get("deletionTimestamp") or FINALIZER in (meta.get("finalizers") or [])

    def conflict(self) -> str | None:
        """The GPUCluster's name while one exists (the ClusterPolicy must stand aside).
        Only an answer once :meth:`knows_whether_one_exists`; None before that means
        "not known yet", not "none"."""
        raw = self.current()
        return str(raw["metadata"]["name"]) if raw is not None else None

    def _on_owned(self, kind: Kind, event: str, old: Obj | None, new: Obj | None) -> None:
        obj = new or old
        assert obj is not None
        if event == "DELETED":
            self.applier.deleted(object_key(obj, kind.kind))
        self._on_object(event, old, new)

    # ------------------------------------------------------------ the pass
    async def reconcile(self) -> Result:
        """One pass; when it wants to run again (a pass that raised keeps its wish for
        the work queue's retry)."""
        await self._reconcile()
        return self._again.take()

    async def _reconcile(self) -> None:
        if not self.has_listed():
            return
        raw = self.current()
        if raw is None:
            return  # owner references: garbage collection removed what we applied
        if raw["metadata"].get("deletionTimestamp"):
            await self._drain(raw)
            return
        if FINALIZER not in (raw["metadata"].get("finalizers") or []):
            raw = await self._add_finalizer(raw)
        policy = next(iter(self.policies.values()), None)
        if policy is not None:
            message = conflict_message(policy["metadata"]["name"])
            await self._status.write(
                raw, STATE_NOT_READY, (False, REASON_PREREQUISITE_NOT_MET, message)
            )
            log.warning(
                "GPUCluster waits: a ClusterPolicy exists", policy=policy["metadata"]["name"]
            )
            return
        try:
            spec = parse_gpucluster(raw).spec
            ctx = RenderContext(
                namespace=self.namespace,
                operator_image=self.operator_image,
                operator_image_pull_policy=self.operator_image_pull_policy,
                operator_image_pull_secrets=self.operator_image_pull_secrets,
                service_monitor_crd=await self._service_monitor_served(raw, spec),
            )
            desired = render(spec, ctx)
            unsupported = [str(f) for f in gpucluster_unsupported_fields(spec)]
        except (ValidationError, ImageRefError) as err:
            message = f"invalid GPUCluster: {_problems(err)}"
            await self._status.write(raw, STATE_NOT_READY, (False, REASON_INVALID_SPEC, message))
            log.warning("GPUCluster is invalid", problems=message)
            return
        await self._ensure_admin_access_label()
        owner = gpucluster_owner(raw["metadata"])
        objects = [with_hash(owned_by(o, owner)) for objs in desired.values() for o in objs]
        refused = await self.applier.apply_all(objects)
        await self._prune(objects, str(raw["metadata"]["uid"]))
        if refused:
            first = refused[0]
            message = f"{first.kind} {first.name} refused ({first.code}): {first.message}"
            await self._status.write(
                raw, STATE_NOT_READY, (False, REASON_RECONCILE_FAILED, message), unsupported
            )
            return
        waiting = self._not_ready(objects)
        if waiting:
            message = "Waiting for operand pods to be ready: " + ", ".join(waiting)
            await self._status.write(
                raw, STATE_NOT_READY, (False, REASON_OPERAND_NOT_READY, message), unsupported
            )
            return
        done = "All resources have been successfully reconciled"
        await self._status.write(raw, STATE_READY, (True, REASON_RECONCILED, done), unsupported)

    async def _add_finalizer(self, raw: Obj) -> Obj:
        meta = raw["metadata"]
        finalizers = [*(meta.get("finalizers") or []), FINALIZER]
        patch = {"metadata": {"finalizers": finalizers, "resourceVersion": meta["resourceVersion"]}}
        patched = await self.rest.merge_patch(GPUCLUSTER, meta["name"], patch)
        self.clusters.observe(patched)
        return patched

    async def _drain(self, raw: Obj) -> None:
        """Delete the claim-holding DaemonSets (foreground) and release the GPUCluster
        only once they are gone; the rest goes by garbage collection after it."""
        meta = raw["metadata"]
        if FINALIZER not in (meta.get("finalizers") or []):
            return
        uid = str(meta["uid"])
        daemonsets = [d for d in self.owned["DaemonSet"].values() if controlled_by(d, uid)]
        draining = claim_consumers(daemonsets)
        if draining:
            started = [
                d["metadata"]["name"]
                for d in daemonsets
                if d["metadata"]["name"] in draining and not d["metadata"].get("deletionTimestamp")
            ]
            for name in started:
                await self.rest.delete(DAEMONSET, name, self.namespace, body=FOREGROUND)
                log.info("draining claim consumer", daemonset=name)
            if started:  # one Event per deletion started, not one per pass while waiting
                await self.events.record(
                    raw,
                    "DrainingClaimConsumers",
                    "Waiting for ResourceClaim-consuming DaemonSet(s) to terminate: "
                    + ", ".join(draining),
                )
            self._again.after(DRAIN_RETRY_S)
            return
        finalizers = [f for f in meta.get("finalizers") or [] if f != FINALIZER]
        patch = {"metadata": {"finalizers": finalizers, "resourceVersion": meta["resourceVersion"]}}
        self.clusters.observe(await self.rest.merge_patch(GPUCLUSTER, meta["name"], patch))
        log.info("GPUCluster released", name=meta["name"])

    async def _ensure_admin_access_label(self) -> None:
        ns = await self.rest.get(NAMESPACE, self.namespace)
        if ns is None or (ns["metadata"].get("labels") or {}).get(ADMIN_ACCESS_LABEL) == "true":
            return
        patch = {"metadata": {"labels": {ADMIN_ACCESS_LABEL: "true"}}}
        await self.rest.merge_patch(NAMESPACE, self.namespace, patch)
        log.info("namespace labelled for admin-access claims", namespace=self.namespace)

    async def _prune(self, wanted: list[Obj], uid: str) -> None:
        """Delete what this GPUCluster controls and no state wants any more (a state
        switched off: DCGM, compute domains)."""
        keep = {object_key(o) for o in wanted}
        for kind_name, informer in self.owned.items():
            kind = next(by_kind(k.api_version, k.kind) for k in KINDS if k.kind == kind_name)
            for obj in informer.values():
                meta = obj["metadata"]
                if object_key(obj, kind_name) in keep or not controlled_by(obj, uid):
                    continue
                if meta.get("deletionTimestamp"):
                    continue
                await self.rest.delete(kind, meta["name"], meta.get("namespace"))
                self.applier.deleted(object_key(obj, kind_name))
                log.info("deleted", kind=kind_name, name=meta["name"])

    def _not_ready(self, objects: list[Obj]) -> list[str]:
        """The DaemonSets and Deployments not rolled out yet, by name."""
        waiting = []
        for obj in objects:
            if obj["kind"] not in ("DaemonSet", "Deployment"):
                continue
            observed = self.owned[obj["kind"]].get(object_key(obj)[1])
            if observed is None or not _rolled_out(observed):
                waiting.append(str(obj["metadata"]["name"]))
        return waiting

    async def _service_monitor_served(self, raw: Obj, spec: GPUClusterSpec) -> bool:
        """Whether the exporter's ServiceMonitor may be rendered: the Prometheus
        Operator's kind is served (discovery), asked only where the spec wants one and
        once per generation, as the ClusterPolicy side asks (upstream's DRA exporter
        state skips the ServiceMonitor where the kind is not served)."""
        generation = raw["metadata"].get("generation")
        if self._monitor_served is None or self._monitor_served[0] != generation:
            # Asked whatever the spec wants: where the kind is served it is watched, so
            # a ServiceMonitor switched off is pruned, after a restart too.
            found = await self.rest.api_resource_exists(
                SERVICE_MONITOR.api_version, SERVICE_MONITOR.plural
            )
            self._monitor_served = (generation, found)
            self.watches.served(SERVICE_MONITOR, found)
        monitor = spec.dcgm_exporter.service_monitor if spec.dcgm_exporter else None
        if not spec.exporter_enabled or monitor is None or not monitor.enabled:
            return False
        return self._monitor_served[1]


def _rolled_out(obj: Obj) -> bool:
    if obj.get("kind", "DaemonSet") == "Deployment" or "replicas" in (obj.get("spec") or {}):
        status = obj.get("status") or {}
        wanted = (obj.get("spec") or {}).get("replicas", 1)
        return bool(status.get("readyReplicas", 0) >= wanted)
    return daemonset_ready(obj)[0]


def _problems(err: ValidationError | ImageRefError) -> str:
    if isinstance(err, ImageRefError):
        return str(err)
    return "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors())[
        :32000
    ]
