"""The operator process core: caches, queue, and the two reconcilers."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from components import COMPONENTS, RenderContext, node_facts
from components._k8s import COMPONENT_LABEL, MANAGED_BY, MANAGED_BY_LABEL
from components.driver import DAEMONSET_NAME as DRIVER_DS
from components.driver import NAME as DRIVER_COMPONENT
from components.hashing import applied_hash, needs_apply, with_hash
from components.keys import MIG_CAPABLE_LABEL, NFD_GPU_LABELS
from components.kinds import SERVICE_MONITOR
from components.labels import any_mig_capable, is_gpu_node, node_label_changes
from components.readiness import component_ready
from crd import (
    CONDITION_UNSUPPORTED_FIELDS,
    OWNER_LABEL,
    REASON_FIELDS_NOT_ACTED_ON,
    REASON_INVALID_SPEC,
    REASON_NFD_LABELS_MISSING,
    REASON_OPERAND_NOT_READY,
    REASON_RECONCILE_FAILED,
    ClusterPolicy,
    ClusterPolicySpec,
    ClusterPolicyStatus,
    find_condition,
    ignored_status,
    not_ready_status,
    parse_policy,
    ready_status,
    unsupported_fields,
    with_unsupported_fields,
)
from gpuop.controller._config import OperatorConfig
from gpuop.controller._nodes import is_ready, labels, node_fingerprint, trim_node
from gpuop.controller._nvidiadriver import NVD_KEY, NVIDIADrivers
from gpuop.controller._nvidiadriver_status import is_policy_driver, nvd_owner
from gpuop.controller._owned import (
    ALWAYS_WATCHED,
    OWNED_BY_NAME,
    OWNED_CLUSTER,
    OWNED_NAMESPACED,
    OptionalWatches,
    rest_kind,
)
from gpuop.controller._pods import WATCHED_APPS, pod_index, trim_pod, trim_revision
from gpuop.controller._remediation import (
    REMEDIATION_KEY,
    Remediation,
    upgrade_drain,
)
from gpuop.controller._remediation_views import policy_facts
from gpuop.controller._rollout_gate import RolloutGate, gate_facts
from gpuop.controller._rollout_status import (
    STUCK_KEY,
    NodeRollouts,
    component_states,
    pod_facts,
    rollout_message,
)
from gpuop.controller._status import (
    REFUSAL_RETRY_BASE,
    Refusal,
    is_refusal,
    parse_status,
    refusal_delay,
    refusals_message,
    server_message,
    status_dict,
    status_patch,
)
from gpuop.controller._upgrade import Upgrades, policy_view, requeue_after
from gpuop.informer import Informer, Obj, ResourceSpec, key_of
from gpuop.log import get_logger
from gpuop.metrics import (
    STATUS_ERROR,
    STATUS_NO_POLICY,
    STATUS_NOT_READY,
    STATUS_READY,
    OperatorMetrics,
)
from gpuop.rest import Kind, Rest, by_kind, kind_of
from statemachine import Action, UpgradePolicyView
from statemachine.rollout import ComponentStatus, plan_rollout
from statemachine.upgrade_keys import SKIP_LABEL, STATE_LABEL

log = get_logger(__name__)

CLUSTER_KEY = "cluster"
UPGRADES_KEY = "upgrades"
#: Status writes that change only progress messages are spaced by at least this.
STATUS_COALESCE_SECONDS = 2.0
NODE_PREFIX = "node/"
MANAGED_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY}"

NODE = by_kind("v1", "Node")
POLICY = by_kind("nvidia.com/v1", "ClusterPolicy")

#: What operands are made of, derived from the operand registry (components/registry.py).
_OWNED_NAMESPACED = OWNED_NAMESPACED
_OWNED_CLUSTER = OWNED_CLUSTER
_OWNED_KINDS: dict[str, Kind] = OWNED_BY_NAME
_SERVICE_MONITOR = rest_kind(SERVICE_MONITOR)


def _now() -> datetime:
    return datetime.now(UTC)


def _gen(obj: Obj) -> int | None:
    value = obj.get("metadata", {}).get("generation")
    return int(value) if value is not None else None


class Operator:
    """Wires watch caches to a work queue; owns no state that is not in the cluster."""

    def __init__(self, rest: Rest, config: OperatorConfig, metrics: OperatorMetrics) -> None:
        from gpuop.workqueue import WorkQueue

        self.rest = rest
        self.config = config
        self.metrics = metrics
        self.queue = WorkQueue(self._reconcile, workers=config.workers)
        ns = config.namespace
        self.nodes = Informer(
            ResourceSpec("nodes", rest.lister(NODE), transform=trim_node, page_size=250),
            self._on_node,
        )
        self.policies = Informer(
            ResourceSpec("clusterpolicies", rest.lister(POLICY)), self._on_policy
        )

        def owned_informer(kind: Kind) -> Informer:
            lister = rest.lister(kind, ns if kind.namespaced else None)
            spec = ResourceSpec(kind.plural, lister, label_selector=MANAGED_SELECTOR)
            return Informer(spec, self._on_owned)

        self.owned: dict[str, Informer] = {k.kind: owned_informer(k) for k in ALWAYS_WATCHED}
        #: Kinds a CRD may serve (ServiceMonitor): watched once discovery finds them.
        self.watches = OptionalWatches(
            self.owned, owned_informer, lambda: self.queue.add(CLUSTER_KEY)
        )
        self.pods = Informer(
            ResourceSpec(
                "pods",
                rest.lister(by_kind("v1", "Pod"), ns),
                # Every operand pod: the per-node rollout reads each component's pod.
                label_selector=MANAGED_SELECTOR,
                transform=trim_pod,
                index=pod_index,
                page_size=100,
            ),
            self._on_pod,
        )
        self.revisions = Informer(
            ResourceSpec(
                "controllerrevisions",
                rest.lister(by_kind("apps/v1", "ControllerRevision"), ns),
                label_selector=MANAGED_SELECTOR,
                transform=trim_revision,
            ),
            self._on_revision,
        )
        self.upgrades = Upgrades(
            rest,
            metrics,
            ns,
            pods=self.pods,
            revisions=self.revisions,
            daemonsets=self.owned["DaemonSet"],
            nodes=self.nodes,
        )
        self.gate = RolloutGate(
            rest,
            metrics,
            self.upgrades.events,
            self.policies,
            lambda delay: self.queue.add_after(UPGRADES_KEY, delay),
        )
        self.remediation = Remediation(
            rest,
            metrics,
            self.upgrades.events,
            self.nodes,
            self.policies,
            self.active_policy,
            self.queue.add_after,
            upgrade_drain(self.upgrades),
        )
        #: Hashes we applied but whose watch event may not have arrived yet, so a
        #: pass right after a write does not write again. Keyed like the caches.
        self._applied: dict[tuple[str, str], str] = {}
        #: Objects the API server refused (4xx), keyed like ``_applied``: reported in
        #: the status and sent again only on their backoff timer or when they change.
        self._refused: dict[tuple[str, str], Refusal] = {}
        self.refusal_retry_base = REFUSAL_RETRY_BASE
        self._policy_cache: tuple[str, ClusterPolicy | None, list[str]] | None = None
        self._service_monitor_probe: tuple[str, bool] | None = None
        self._status_written: dict[str, float] = {}
        self.synced = False
        self._started = time.monotonic()
        self.nvd = NVIDIADrivers(self)
        self.rollouts = NodeRollouts(
            self.pods,
            self.revisions,
            self.owned["DaemonSet"],
            ns,
            self.upgrades.events,
            metrics,
            stuck_seconds=config.node_stuck_seconds,
        )
        self.upgrades.driver_app = self.nvd.driver_app
        self.upgrades.driver_pods = self.nvd.driver_pods

    # ------------------------------------------------------------- informers
    @property
    def informers(self) -> list[Informer]:
        return [
            self.nodes,
            self.policies,
            self.pods,
            self.revisions,
            self.nvd.driver_pods,
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
            group.create_task(self.watches.run(), name="optional-watches")
            self.queue.add(CLUSTER_KEY)
            self.queue.add(UPGRADES_KEY)
            self.queue.add(REMEDIATION_KEY)
            for name in self.nodes.store:
                self.queue.add(NODE_PREFIX + name)

    # -------------------------------------------------------- event routing
    def _on_node(self, event: str, old: Obj | None, new: Obj | None) -> None:
        node = new or old
        assert node is not None
        name = node["metadata"]["name"]
        if node_fingerprint(old) == node_fingerprint(new):
            return
        self.queue.add(NODE_PREFIX + name)
        if self.remediation.wants_node(old, new):
            self.queue.add(REMEDIATION_KEY)
        self.queue.add(NVD_KEY)
        if event != "MODIFIED" or _budget_facts(old) != _budget_facts(new):
            self.queue.add(UPGRADES_KEY)  # only what the fleet budget reads
        if event != "MODIFIED" or _gpu_facts(old) != _gpu_facts(new):
            self.queue.add(CLUSTER_KEY)

    def _on_policy(self, event: str, old: Obj | None, new: Obj | None) -> None:
        if policy_facts(old) != policy_facts(new):
            self.queue.add(REMEDIATION_KEY)
        if gate_facts(old) != gate_facts(new):
            self.queue.add(UPGRADES_KEY)  # the resume annotation, or the gate's record
        if (
            event == "MODIFIED"
            and old is not None
            and new is not None
            and _gen(old) == _gen(new)
            and old["metadata"].get("labels") == new["metadata"].get("labels")
        ):
            return  # only status changed (most likely our own write)
        self.queue.add(CLUSTER_KEY)
        self.queue.add(UPGRADES_KEY)
        self.queue.add(NVD_KEY)
        # Enabled components decide each node's deploy labels.
        for name, node in self.nodes.store.items():
            if is_gpu_node(labels(node)):
                self.queue.add(NODE_PREFIX + name)

    def _on_owned(self, event: str, old: Obj | None, new: Obj | None) -> None:
        obj = new or old
        assert obj is not None
        if event == "DELETED":
            self._applied.pop(_cache_key(obj), None)
        self.queue.add(CLUSTER_KEY)
        if nvd_owner(obj) is not None or is_policy_driver(obj["metadata"]["name"]):
            self.queue.add(NVD_KEY)  # NVIDIADriver status, and the driver hand-over

    def _on_pod(self, event: str, old: Obj | None, new: Obj | None) -> None:
        pod = new or old
        assert pod is not None
        if pod_facts(old) != pod_facts(new):
            self.queue.add(CLUSTER_KEY)  # where that node stands in the rollout
        node = (pod.get("spec") or {}).get("nodeName")
        app = (pod["metadata"].get("labels") or {}).get("app")
        if node and app in WATCHED_APPS:
            self.queue.add(NODE_PREFIX + node)
            # The fleet budget only asks whether a node has a driver pod at all.
            is_driver = (pod["metadata"].get("labels") or {}).get("app") == DRIVER_DS
            if is_driver and event != "MODIFIED":
                self.queue.add(UPGRADES_KEY)

    def _on_revision(self, event: str, old: Obj | None, new: Obj | None) -> None:
        # A new driver revision may start upgrades on every GPU node.
        self.queue.add(UPGRADES_KEY)
        for name, node in self.nodes.store.items():
            if is_gpu_node(labels(node)):
                self.queue.add(NODE_PREFIX + name)

    # ------------------------------------------------------------ reconcile
    async def _reconcile(self, key: str) -> None:
        if key == CLUSTER_KEY:
            await self.reconcile_cluster()
        elif key == UPGRADES_KEY:
            await self.reconcile_upgrades()
        elif key.startswith(NODE_PREFIX):
            await self.reconcile_node(key[len(NODE_PREFIX) :])
        elif key == REMEDIATION_KEY:
            await self.remediation.reconcile()
        elif key == NVD_KEY:
            await self.nvd.reconcile()
        elif key == STUCK_KEY:
            self.queue.add(CLUSTER_KEY)  # a node is due to count as stuck

    def active_policy(self) -> tuple[Obj | None, ClusterPolicy | None, list[str]]:
        """The oldest ClusterPolicy is the active one; parsed once per resourceVersion."""
        policies = sorted(
            self.policies.values(),
            key=lambda p: (p["metadata"].get("creationTimestamp", ""), p["metadata"]["name"]),
        )
        if not policies:
            return None, None, []
        raw = policies[0]
        rv = str(raw["metadata"].get("resourceVersion"))
        if self._policy_cache is None or self._policy_cache[0] != rv:
            model, problems = parse_policy(raw)
            self._policy_cache = (rv, model, [f"{p.path}: {p.message}" for p in problems])
        return raw, self._policy_cache[1], self._policy_cache[2]

    def active_spec(self) -> ClusterPolicySpec | None:
        _, model, problems = self.active_policy()
        return model.spec if model is not None and not problems else None

    async def reconcile_cluster(self) -> None:
        self.metrics.reconciliation_total.inc()
        try:
            await self._reconcile_cluster()
        except Exception:
            self.metrics.reconciliation_failed_total.inc()
            self.metrics.reconciliation_status.set(STATUS_ERROR)
            raise

    async def _reconcile_cluster(self) -> None:
        nodes = self.nodes.values()
        gpu_nodes = [n for n in nodes if is_gpu_node(labels(n))]
        has_nfd = any(any(k in labels(n) for k in NFD_GPU_LABELS) for n in nodes)
        self.metrics.gpu_nodes_total.set(len(gpu_nodes))
        self.metrics.reconciliation_has_nfd_labels.set(1 if has_nfd else 0)

        raw, model, problems = self.active_policy()
        if raw is None:
            self.metrics.reconciliation_status.set(STATUS_NO_POLICY)
            await self._cleanup(set())
            return
        await self._mark_ignored(raw["metadata"]["name"])
        previous = parse_status(raw)
        generation = _gen(raw)

        if model is None or problems:
            message = "invalid ClusterPolicy: " + "; ".join(problems)
            status = not_ready_status(
                self.config.namespace,
                reason=REASON_INVALID_SPEC,
                message=message[:32000],
                error=True,
                generation=generation,
                now=_now(),
                previous=previous,
            )
            await self._write_status(raw, _flag_unsupported(status, model, generation))
            self.metrics.reconciliation_status.set(STATUS_ERROR)
            log.warning(
                "ClusterPolicy is invalid", policy=raw["metadata"]["name"], problems=problems
            )
            return

        spec = model.spec
        self.metrics.driver_auto_upgrade_enabled.set(
            1 if spec.driver.enabled and spec.driver.upgrade_policy.auto_upgrade else 0
        )
        ctx = RenderContext(
            namespace=self.config.namespace,
            operator_image=self.config.operator_image,
            mig_capable=any_mig_capable(labels(n) for n in gpu_nodes),
            service_monitor_crd=await self._has_service_monitors(raw),
            gpu_nodes=tuple(
                node_facts(n) for n in sorted(gpu_nodes, key=lambda n: n["metadata"]["name"])
            ),
        )
        owner = _owner_reference(raw)
        desired = {
            c.name: [with_hash(_owned_by(o, owner)) for o in c.objects(spec, ctx)]
            for c in COMPONENTS
        }
        held = self.nvd.holds_policy_driver()
        if held:
            # NVIDIADriver pods still run: the ClusterPolicy's driver waits until they left.
            desired[DRIVER_COMPONENT] = [
                o for o in desired[DRIVER_COMPONENT] if o["kind"] != "DaemonSet"
            ]
        view = self.rollouts.view(desired, gpu_nodes)
        snapshot: dict[str, ComponentStatus] = {}
        actual: dict[str, tuple[bool, str]] = {}
        daemonsets = {d["metadata"]["name"]: d for d in self.owned["DaemonSet"].values()}
        for comp in COMPONENTS:
            objs = desired[comp.name]
            if not objs:
                snapshot[comp.name] = ComponentStatus(enabled=False)
                continue
            applied = all(not self._needs_apply(o) for o in objs)
            ready, message = component_ready(objs, daemonsets)
            if not applied:
                ready, message = False, "applying"
            if comp.name == DRIVER_COMPONENT:
                ready, message = self._driver_handover(spec, held, ready, message)
            ready, message = view.component(comp.name, ready, message)
            actual[comp.name] = (ready, message)
            snapshot[comp.name] = ComponentStatus(enabled=True, ready=ready, message=message)

        # Every enabled component at once, as upstream: each node orders itself (init
        # containers wait for its validation files), so a stuck node holds back only
        # itself. The fleet machine below only summarises where the fleet stands.
        plan = plan_rollout(snapshot, previous.rollout_state if previous else None)
        refused: list[Refusal] = []
        for objs in desired.values():
            for obj in objs:
                refusal = await self._apply_or_refusal(obj)
                if refusal is not None:
                    refused.append(refusal)
        wanted = {_cache_key(o) for objs in desired.values() for o in objs}
        for key in [k for k in self._refused if k not in wanted]:
            del self._refused[key]
        await self._cleanup(wanted)
        await self.rollouts.release_abandoned(self.rest, gpu_nodes, desired)
        self.rollouts.schedule(view, self.queue)

        not_ready = [n for n, (ok, _) in actual.items() if not ok]
        overall = plan.ready and not not_ready
        components = component_states(snapshot, actual, view)
        if refused:
            # The server's answer, not ours: an admin must see which object and why,
            # and the state must not keep saying ready (issue 14, item 7).
            status = not_ready_status(
                self.config.namespace,
                reason=REASON_RECONCILE_FAILED,
                message=refusals_message(refused),
                error=True,
                generation=generation,
                now=_now(),
                previous=previous,
            )
            self.metrics.reconciliation_failed_total.inc()
            self.metrics.reconciliation_status.set(STATUS_ERROR)
        elif not has_nfd:
            status = not_ready_status(
                self.config.namespace,
                reason=REASON_NFD_LABELS_MISSING,
                message=(
                    "no node has NFD's PCI labels (feature.node.kubernetes.io/pci-10de.present);"
                    " deploy Node Feature Discovery or enable it in the chart"
                ),
                error=False,
                generation=generation,
                now=_now(),
                previous=previous,
            )
            self.metrics.reconciliation_status.set(STATUS_NOT_READY)
        elif overall:
            status = ready_status(
                self.config.namespace, generation=generation, now=_now(), previous=previous
            )
            self.metrics.reconciliation_status.set(STATUS_READY)
            self.metrics.reconciliation_last_success.set(time.time())
        else:
            blocking = plan.current or not_ready[0]
            status = not_ready_status(
                self.config.namespace,
                reason=REASON_OPERAND_NOT_READY,
                message=rollout_message(view, blocking, actual.get(blocking, (False, ""))[1]),
                error=False,
                generation=generation,
                now=_now(),
                previous=previous,
            )
            self.metrics.reconciliation_status.set(STATUS_NOT_READY)
        status = status.model_copy(update={"rollout_state": plan.state, "components": components})
        await self.rollouts.announce(raw, view)
        await self._write_status(raw, _flag_unsupported(status, model, generation))

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

    async def _has_service_monitors(self, raw: Obj) -> bool:
        """Whether the Prometheus operator's ServiceMonitor API is served (discovery,
        which every authenticated client may read). Asked once per policy version,
        never on a timer."""
        rv = str(raw["metadata"].get("generation"))  # not resourceVersion: status writes bump it
        if self._service_monitor_probe is None or self._service_monitor_probe[0] != rv:
            found = await self.rest.api_group_exists(_SERVICE_MONITOR.api_version)
            self._service_monitor_probe = (rv, found)
            self.watches.served(_SERVICE_MONITOR, found)
        return self._service_monitor_probe[1]

    def _needs_apply(self, obj: Obj) -> bool:
        key = _cache_key(obj)
        if self._applied.get(key) == applied_hash(obj):
            return False
        return needs_apply(obj, self._observed(obj))

    def _observed(self, obj: Obj) -> Obj | None:
        informer = self.owned.get(obj["kind"])
        if informer is None:
            return None
        return informer.get(key_of(obj))

    async def _apply_or_refusal(self, obj: Obj) -> Refusal | None:
        """Apply ``obj`` if it needs it; a refusal (4xx that would repeat) is returned,
        not raised, so the remaining objects are still applied and the status says why.

        A refused object is sent again when its backoff timer fires or when it
        changes (the policy was edited), never on every event-driven pass.
        """
        key = _cache_key(obj)
        if not self._needs_apply(obj):
            self._refused.pop(key, None)
            return None
        wanted_hash = applied_hash(obj) or ""
        known = self._refused.get(key)
        if known is not None and known.applied_hash != wanted_hash:
            known = None  # a different object now: send it at once
        if known is not None and time.monotonic() < known.retry_at:
            return known
        try:
            await self._apply(obj)
        except ApiException as err:
            if not is_refusal(err.status):
                raise  # conflicts, throttling, 5xx: the work queue retries with backoff
            attempts = known.attempts + 1 if known is not None else 1
            delay = refusal_delay(attempts, self.refusal_retry_base)
            meta = obj["metadata"]
            refusal = Refusal(
                kind=obj["kind"],
                namespace=meta.get("namespace"),
                name=meta["name"],
                code=int(err.status),
                message=server_message(err.reason),
                applied_hash=wanted_hash,
                attempts=attempts,
                retry_at=time.monotonic() + delay,
            )
            self._refused[key] = refusal
            self.queue.add_after(CLUSTER_KEY, delay)
            log.warning(
                "object refused by the API server",
                kind=refusal.kind,
                name=refusal.name,
                code=refusal.code,
                message=refusal.message,
                retry_in=delay,
            )
            return refusal
        self._refused.pop(key, None)
        return None

    async def _apply(self, obj: Obj) -> None:
        if obj["kind"] not in self.owned:
            # Kinds we do not watch (ServiceMonitor): read once before writing, so
            # a restarted operator does not re-apply what is already there.
            meta = obj["metadata"]
            current = await self.rest.get(kind_of(obj), meta["name"], meta.get("namespace"))
            if applied_hash(current) == applied_hash(obj):
                self._applied[_cache_key(obj)] = applied_hash(obj) or ""
                return
        await self.rest.apply(obj)
        self._applied[_cache_key(obj)] = applied_hash(obj) or ""
        log.info("applied", kind=obj["kind"], name=obj["metadata"]["name"])

    async def _cleanup(self, wanted: set[tuple[str, str]]) -> None:
        """Delete our objects that no enabled component wants any more."""
        for kind_name, informer in self.owned.items():
            for obj in informer.values():
                obj.setdefault("kind", kind_name)
                if _cache_key(obj) in wanted or nvd_owner(obj) is not None:
                    continue  # NVIDIADriver objects are pruned by their own controller
                kind = _OWNED_KINDS[kind_name]
                meta = obj["metadata"]
                if meta.get("deletionTimestamp"):
                    continue
                await self.rest.delete(kind, meta["name"], meta.get("namespace"))
                self._applied.pop(_cache_key(obj), None)
                log.info(
                    "deleted",
                    kind=kind_name,
                    name=meta["name"],
                    component=(meta.get("labels") or {}).get(COMPONENT_LABEL),
                )

    async def _mark_ignored(self, active: str) -> None:
        for raw in self.policies.values():
            if raw["metadata"]["name"] == active:
                continue
            status = ignored_status(
                active, generation=_gen(raw), now=_now(), previous=parse_status(raw)
            )
            await self._write_status(raw, _flag_unsupported(status, None, _gen(raw)))

    async def _write_status(self, raw: Obj, status: ClusterPolicyStatus) -> None:
        desired = status_dict(status)
        patch = status_patch(raw.get("status"), desired)
        if patch is None:
            return
        name = raw["metadata"]["name"]
        since = time.monotonic() - self._status_written.get(name, float("-inf"))
        if _only_messages_differ(raw.get("status"), desired) and since < STATUS_COALESCE_SECONDS:
            # Progress counts ("981/1000 pods available") change with every pod during
            # a rollout; write them at most every couple of seconds, not per pod.
            self.queue.add_after(CLUSTER_KEY, STATUS_COALESCE_SECONDS - since)
            return
        old = raw.get("status") or {}
        if status.state != old.get("state") or _new_error(old, desired):
            await self._record_state_change(raw, status)
        await self._record_unsupported_fields(raw, status)
        try:
            patched = await self.rest.merge_patch(
                POLICY, raw["metadata"]["name"], patch, subresource="status"
            )
        except ApiException as err:
            if err.status == 404:
                return  # deleted meanwhile; its DELETED event brings the next pass
            raise
        self.policies.observe(patched)
        self._status_written[name] = time.monotonic()

    async def _record_unsupported_fields(self, raw: Obj, status: ClusterPolicyStatus) -> None:
        """A Warning Event naming the fields set but not acted on, once per change of the
        UnsupportedFields condition (so once per policy generation that sets them)."""
        new = find_condition(status.conditions, CONDITION_UNSUPPORTED_FIELDS)
        if new is None:
            return
        old: Obj = next(
            (
                c
                for c in (raw.get("status") or {}).get("conditions") or []
                if c.get("type") == CONDITION_UNSUPPORTED_FIELDS
            ),
            {},
        )
        if (old.get("message"), old.get("observedGeneration")) == (
            new.message,
            new.observed_generation,
        ):
            return
        involved = {
            "apiVersion": POLICY.api_version,
            "kind": POLICY.kind,
            "metadata": raw["metadata"],
        }
        await self.upgrades.events.record(
            involved, REASON_FIELDS_NOT_ACTED_ON, new.message, warning=True
        )
        log.warning(
            "ClusterPolicy sets fields gpuop does not act on",
            policy=raw["metadata"]["name"],
            message=new.message,
        )

    async def _record_state_change(self, raw: Obj, status: ClusterPolicyStatus) -> None:
        """An Event on the policy when its state changes (ready, notReady, ignored)."""
        ready = find_condition(status.conditions, "Ready")
        error = find_condition(status.conditions, "Error")
        involved = {
            "apiVersion": POLICY.api_version,
            "kind": POLICY.kind,
            "metadata": raw["metadata"],
        }
        await self.upgrades.events.record(
            involved,
            ready.reason if ready else "StateChanged",
            f"ClusterPolicy is {status.state}: {ready.message if ready else ''}",
            warning=error is not None and error.status == "True",
        )

    # --------------------------------------------------------------- nodes
    async def reconcile_node(self, name: str) -> None:
        node = self.nodes.get(name)
        if node is None:
            self.queue.forget(NODE_PREFIX + name)
            return
        raw, model, problems = self.active_policy()
        if raw is not None and (model is None or problems):
            return  # an invalid policy changes nothing on nodes; its status says why
        spec = model.spec if model is not None else None
        changes = node_label_changes(labels(node), spec)
        if changes:
            patched = await self.rest.merge_patch(
                NODE, name, {"metadata": {"labels": dict(changes)}}
            )
            self.nodes.observe(patched)
            log.info("node labels", node=name, changes=dict(changes))
            self.queue.add(NODE_PREFIX + name)  # again, on the fresh labels
            return
        policy = policy_view(spec) if spec is not None else UpgradePolicyView()
        app = self.nvd.driver_app(name)
        owner = labels(node).get(OWNER_LABEL)
        if owner:
            # An NVIDIADriver drives this node: its own upgradePolicy applies.
            policy = (self.nvd.upgrade_policies() or {}).get(owner) or UpgradePolicyView(
                auto_upgrade=False
            )
        if not (policy.auto_upgrade and is_gpu_node(labels(node))):
            if STATE_LABEL not in labels(node):
                return
            # Upgrades off, no policy (uninstall) or no longer a GPU node: the rulebook
            # uncordons what we cordoned and removes our label and annotations.
            policy = UpgradePolicyView(auto_upgrade=False)
        newest = self.upgrades.newest_driver_revision(app) if app else None
        decision = await self.upgrades.step(node, policy, newest)
        delay = requeue_after(decision)
        if delay is not None:
            self.queue.add_after(NODE_PREFIX + name, delay)
        else:
            # No clock runs for the node now: drop a timer left from an earlier state
            # (pod-restart's 600 s, say), or it fires for nothing and the queue never idles.
            self.queue.forget(NODE_PREFIX + name)
        if decision.has_patch or decision.action in (Action.CORDON, Action.UNCORDON):
            self.queue.add(NODE_PREFIX + name)  # the next step may already be due
        if decision.changed_state:
            self.queue.add(UPGRADES_KEY)

    async def reconcile_upgrades(self) -> None:
        """Start upgrades over the whole fleet: the one writer of slots (persisted states)."""
        raw, model, problems = self.active_policy()
        if raw is None or model is None or problems:
            return
        spec = model.spec
        # One budget per driver owner: the ClusterPolicy's nodes, and each
        # NVIDIADriver's nodes under that resource's own upgradePolicy.
        groups: dict[str | None, list[Obj]] = {}
        for node in self.nodes.values():
            groups.setdefault(labels(node).get(OWNER_LABEL), []).append(node)
        policies: dict[str | None, UpgradePolicyView] = {None: policy_view(spec)}
        policies.update(self.nvd.upgrade_policies() or {})
        newest = self.upgrades.newest_driver_revision()
        for owner, nodes in groups.items():
            policy = policies.get(owner, UpgradePolicyView(auto_upgrade=False))
            if not policy.auto_upgrade:
                continue
            held = None
            if owner is None:  # canary and halt: the ClusterPolicy's own rollout
                gate = await self.gate.reconcile(raw, spec, nodes, newest, self._revision_of)
                held = gate.held
            started, conflict = await self.upgrades.grant(nodes, policy, held)
            for name in started:
                self.queue.add(NODE_PREFIX + name)
            if conflict:  # the cache was behind a node: count again once it caught up
                self.queue.add_after(UPGRADES_KEY, 1.0)

    def _revision_of(self, node: str) -> str | None:
        pod = self.upgrades.driver_pod(node)
        return pod.revision_hash if pod is not None else None


def _flag_unsupported(
    status: ClusterPolicyStatus, model: ClusterPolicy | None, generation: int | None
) -> ClusterPolicyStatus:
    """Add the UnsupportedFields condition for what the policy sets but we ignore."""
    fields = [str(f) for f in unsupported_fields(model.spec)] if model is not None else []
    return with_unsupported_fields(status, fields, generation=generation, now=_now())


#: Status keys that change with every pod during a rollout: written at most every
#: STATUS_COALESCE_SECONDS, not per pod.
_PROGRESS_KEYS = frozenset(("message", "nodesReady", "nodesNotReady", "nodesAt"))


def _without_messages(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_messages(v) for k, v in value.items() if k not in _PROGRESS_KEYS}
    if isinstance(value, list):
        return [_without_messages(v) for v in value]
    return value


def _only_messages_differ(observed: Obj | None, desired: Obj) -> bool:
    return bool(_without_messages(observed or {}) == _without_messages(desired))


def _error_condition(status: Obj) -> tuple[str, str] | None:
    for cond in status.get("conditions") or []:
        if cond.get("type") == "Error" and cond.get("status") == "True":
            return (str(cond.get("reason")), str(cond.get("message")))
    return None


def _new_error(observed: Obj, desired: Obj) -> bool:
    """A different error than the one already reported (an Event is due even when
    the state stays notReady, e.g. rolling out, then an object is refused)."""
    error = _error_condition(desired)
    return error is not None and error != _error_condition(observed)


def _owner_reference(policy: Obj) -> Obj:
    """Operands belong to the policy: deleting it garbage-collects them, even with
    no operator running (an uninstall in the wrong order leaves nothing behind)."""
    meta = policy["metadata"]
    return {
        "apiVersion": POLICY.api_version,
        "kind": POLICY.kind,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": False,
    }


def _owned_by(obj: Obj, owner: Obj) -> Obj:
    meta = {**obj["metadata"], "ownerReferences": [owner]}
    return {**obj, "metadata": meta}


def _budget_facts(node: Obj | None) -> Any:
    """What ``Upgrades.grant`` reads of a node."""
    if node is None:
        return None
    node_labels = labels(node)
    return (
        node_labels.get(STATE_LABEL),
        node_labels.get(OWNER_LABEL),  # which budget the node counts in
        node_labels.get(SKIP_LABEL),
        is_gpu_node(node_labels),
        node["spec"].get("unschedulable", False),
        is_ready(node),
    )


def _gpu_facts(node: Obj | None) -> Any:
    if node is None:
        return None
    node_labels = labels(node)
    owner = node_labels.get(OWNER_LABEL)
    return (
        is_gpu_node(node_labels),
        node_labels.get(MIG_CAPABLE_LABEL),
        owner,  # holds the ClusterPolicy's driver back
        node_labels.get(STATE_LABEL) if owner else None,  # NVIDIADriver upgrades: not ready
    )


def _cache_key(obj: Obj) -> tuple[str, str]:
    return (str(obj.get("kind")), key_of(obj))
