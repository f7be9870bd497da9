"""Writing operand objects: apply only what changed, report what the API server refuses,
prune what nothing wants any more.

Shared by the ClusterPolicy's cluster pass and the NVIDIADriver controller, so both keep
the same promises: a pass that changes nothing writes nothing (hashes, and what we
applied before its watch event arrived), a refused object (4xx) is reported rather than
retried on every event, and objects belong to their policy by an owner reference, so
deleting it garbage-collects them even with no operator running.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable

from kubernetes_asyncio.client.exceptions import ApiException

from components._k8s import COMPONENT_LABEL
from components.hashing import applied_hash, needs_apply
from gpuop.kube.informer import Informer, Obj, key_of
from gpuop.kube.kinds import kind_of
from gpuop.kube.rest import Rest
from gpuop.log import get_logger
from gpuop.operator.controller.base.optional_watches import OWNED_BY_NAME
from gpuop.operator.controller.views.gpucluster_objects import gpucluster_owned
from gpuop.operator.controller.views.objects import RUNS_PODS, nvd_owner
from gpuop.operator.controller.views.refusals import (
    REFUSAL_RETRY_BASE,
    Refusal,
    is_refusal,
    refusal_delay,
    server_message,
)
from gpuop.operator.controller.writers.replace import (
    event_subject,
    replace_orphaning,
    selector_refused,
)
from gpuop.operator.events import EventRecorder

log = get_logger(__name__)

APPLY_CONCURRENCY = 8
"""Applies in flight at once in one pass (the work queue's default worker count)."""
BINDINGS = frozenset({"RoleBinding", "ClusterRoleBinding"})


def apply_tier(kind: str) -> int:
    """Which tier of a pass an object is applied in: 0 everything else, 1 role
    bindings (after their roles), 2 objects that run pods (after all they use)."""
    if kind in RUNS_PODS:
        return 2
    return 1 if kind in BINDINGS else 0


ObjectKey = tuple[str, str]
"""(kind, namespace/name): how applied hashes and refusals are keyed."""


def object_key(obj: Obj, kind: str | None = None) -> ObjectKey:
    """The key of ``obj``; ``kind`` for a cached object, which a LIST leaves without one."""
    return (str(kind if kind is not None else obj.get("kind")), key_of(obj))


def owner_reference(api_version: str, kind: str, meta: Obj) -> Obj:
    """A controller reference to the policy (or NVIDIADriver) with ``meta``; it does not
    block the owner's deletion."""
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": False,
    }


def owned_by(obj: Obj, owner: Obj) -> Obj:
    """``obj`` (not changed) with ``owner`` as its only owner reference."""
    meta = {**obj["metadata"], "ownerReferences": [owner]}
    return {**obj, "metadata": meta}


class Applier:
    """Applies desired objects through the owned caches; remembers only hashes it wrote
    and refusals it is waiting out."""

    def __init__(
        self,
        rest: Rest,
        owned: dict[str, Informer],
        retry_after: Callable[[float], None],
        events: EventRecorder | None = None,
    ) -> None:
        self.rest = rest
        #: Where a replaced object (immutable selector, `writers.replace`) is reported.
        self.events = events
        self.owned = owned
        self._retry_after = retry_after
        #: Hashes we applied but whose watch event may not have arrived yet, so a
        #: pass right after a write does not write again. Keyed like the caches.
        self._applied: dict[ObjectKey, str] = {}
        #: Objects the API server refused (4xx), keyed like ``_applied``: reported in
        #: the status and sent again only on their backoff timer or when they change.
        self._refused: dict[ObjectKey, Refusal] = {}
        self.refusal_retry_base = REFUSAL_RETRY_BASE

    def deleted(self, key: ObjectKey) -> None:
        """An owned object is gone: what we applied of it no longer stands."""
        self._applied.pop(key, None)

    def observed(self, obj: Obj) -> Obj | None:
        informer = self.owned.get(obj["kind"])
        if informer is None:
            return None
        return informer.get(key_of(obj))

    def needs_apply(self, obj: Obj) -> bool:
        if self._applied.get(object_key(obj)) == applied_hash(obj):
            return False
        return needs_apply(obj, self.observed(obj))

    async def apply(self, obj: Obj) -> None:
        if obj["kind"] not in self.owned:
            # Kinds we do not watch (ServiceMonitor): read once before writing, so
            # a restarted operator does not re-apply what is already there.
            meta = obj["metadata"]
            current = await self.rest.get(kind_of(obj), meta["name"], meta.get("namespace"))
            if applied_hash(current) == applied_hash(obj):
                self._applied[object_key(obj)] = applied_hash(obj) or ""
                return
        try:
            await self.rest.apply(obj)
        except ApiException as err:
            if not selector_refused(obj, err):
                raise
            created, words = await replace_orphaning(self.rest, obj)
            if self.events is not None:
                await self.events.record(event_subject(created), "SelectorReplaced", words)
        self._applied[object_key(obj)] = applied_hash(obj) or ""
        log.info("applied", kind=obj["kind"], name=obj["metadata"]["name"])

    async def apply_all(self, objs: Iterable[Obj]) -> list[Refusal]:
        """Apply each object that needs it; the refused ones are returned, in the order
        given (and refusals of objects no longer among ``objs`` forgotten).

        Applied in tiers (:func:`apply_tier`): role bindings after the roles they
        name (without ``bind`` rights, binding a role the server cannot find yet is
        refused as not found), objects that run pods last, so their service
        accounts, roles and config exist when the pods are created (a pod naming a
        missing service account is refused, and its controller backs off). Within a
        tier up to ``APPLY_CONCURRENCY`` requests are in flight: applied one by one,
        a fresh install waited some 15 s for its last DaemonSet on a busy API server."""
        listed = list(objs)
        wanted = {object_key(o) for o in listed}
        outcome: dict[int, Refusal | None] = {}
        gate = asyncio.Semaphore(APPLY_CONCURRENCY)

        async def one(i: int, obj: Obj) -> None:
            async with gate:
                outcome[i] = await self._apply_or_refusal(obj)

        tiers: dict[int, list[tuple[int, Obj]]] = {}
        for i, obj in enumerate(listed):
            tiers.setdefault(apply_tier(obj["kind"]), []).append((i, obj))
        for _, batch in sorted(tiers.items()):
            results = await asyncio.gather(*(one(i, o) for i, o in batch), return_exceptions=True)
            failed = [r for r in results if isinstance(r, BaseException)]
            if failed:
                raise failed[0]  # the others finished: their hashes are recorded
        for key in [k for k in self._refused if k not in wanted]:
            del self._refused[key]
        return [r for _, r in sorted(outcome.items()) if r is not None]

    async def _apply_or_refusal(self, obj: Obj) -> Refusal | None:
        """Apply ``obj`` if it needs it; a refusal (4xx that would repeat) is returned,
        not raised, so the remaining objects are still applied and the status says why.

        A refused object is sent again when its backoff timer fires or when it
        changes (the policy was edited), never on every event-driven pass.
        """
        key = object_key(obj)
        if not self.needs_apply(obj):
            self._refused.pop(key, None)
            return None
        wanted_hash = applied_hash(obj) or ""
        known = self._refused.get(key)
        if known is not None and known.applied_hash != wanted_hash:
            known = None  # a different object now: send it at once
        if known is not None and time.monotonic() < known.retry_at:
            return known
        try:
            await self.apply(obj)
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
            self._retry_after(delay)
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

    async def prune(self, wanted: Iterable[Obj]) -> None:
        """Delete our objects that no enabled component wants any more (NVIDIADriver
        objects are pruned by their own controller; the driver accounts applied beside a
        GPUCluster go with it)."""
        keep = {object_key(o) for o in wanted}
        for kind_name, informer in self.owned.items():
            for obj in informer.values():
                key = object_key(obj, kind_name)  # the cached object is never changed
                if key in keep or nvd_owner(obj) is not None or gpucluster_owned(obj):
                    continue
                meta = obj["metadata"]
                if meta.get("deletionTimestamp"):
                    continue
                await self.rest.delete(
                    OWNED_BY_NAME[kind_name], meta["name"], meta.get("namespace")
                )
                self._applied.pop(key, None)
                log.info(
                    "deleted",
                    kind=kind_name,
                    name=meta["name"],
                    component=(meta.get("labels") or {}).get(COMPONENT_LABEL),
                )
