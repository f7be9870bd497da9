"""The rollback's imperative side (:mod:`statemachine.rollback`): the pass that writes a
driver owner's DaemonSets (the cluster pass for the ClusterPolicy's, the NVIDIADriver
pass for a resource's) writes each with the template of the revision it goes back to,
read once from its ControllerRevision, while the owner's rollback record stands; a
record the owner moved past (a new driver) is removed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from components import with_hash
from components.driver import rollout_key
from gpuop.kube.informer import Informer, Obj
from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Rest
from gpuop.log import get_logger
from gpuop.operator.controller.writers.owner_condition import owner_kind
from statemachine.rollback import ROLLBACK_ANNOTATION, RollbackRecord, rollback_stands
from statemachine.upgrade_keys import DRIVER_REVISION_LABEL

log = get_logger(__name__)

REVISION = by_kind("apps/v1", "ControllerRevision")


def driver_rollout_key(daemonsets: Sequence[Obj]) -> str:
    """The rollout key of driver DaemonSets (rendered or live), as the gate keys it."""
    templates = []
    for ds in daemonsets:
        pod = ds["spec"]["template"]["spec"]
        templates.append((pod.get("nodeSelector") or {}, pod))
    return rollout_key(templates)


def record_of(raw: Obj | None) -> RollbackRecord | None:
    annotations = ((raw or {}).get("metadata") or {}).get("annotations") or {}
    return RollbackRecord.loads(annotations.get(ROLLBACK_ANNOTATION))


class RollbackTemplates:
    """Turns the rendered driver DaemonSets into the rollback's, while it stands."""

    def __init__(
        self, rest: Rest, namespace: str, revisions: Informer, policies: Any, drivers: Any
    ) -> None:
        self.rest = rest
        self.namespace = namespace
        self._revisions = revisions
        self._policies = policies
        self._drivers = drivers
        #: (DaemonSet, revision hash) -> its pod template: a revision never changes.
        self._templates: dict[tuple[str, str], Obj] = {}

    async def apply(
        self, raw: Obj, driver_objects: list[Obj], owner: str | None = None
    ) -> list[Obj]:
        """``driver_objects`` of ``owner`` (None: the ClusterPolicy ``raw``, else that
        NVIDIADriver) as the rollback writes them (unchanged without one)."""
        record = record_of(raw)
        if record is None:
            return driver_objects
        pools = [o for o in driver_objects if o["kind"] == "DaemonSet"]
        if record.key != driver_rollout_key(pools):
            await self._clear(raw, record, owner)
            return driver_objects
        if not rollback_stands(record, record.key):
            return driver_objects  # halted with nothing to go back to
        result = []
        for obj in driver_objects:
            name = obj["metadata"]["name"]
            revision = record.revisions.get(name) if obj["kind"] == "DaemonSet" else None
            template = await self._template(name, revision) if revision else None
            if template is not None:
                obj = with_hash({**obj, "spec": {**obj["spec"], "template": template}})
            result.append(obj)
        return result

    async def _template(self, ds: str, revision: str) -> Obj | None:
        cached = self._templates.get((ds, revision))
        if cached is not None:
            return cached
        name = self._revision_name(ds, revision)
        if name is None:
            log.warning("rollback revision not found", daemonset=ds, revision=revision)
            return None
        full = await self.rest.get(REVISION, name, self.namespace)
        data: Mapping[str, Any] = (full or {}).get("data") or {}
        template = dict(((data.get("spec") or {}).get("template")) or {})
        template.pop("$patch", None)
        if not template:
            return None
        self._templates[(ds, revision)] = template
        return template

    def _revision_name(self, ds: str, revision: str) -> str | None:
        for rev in self._revisions.values():
            meta = rev["metadata"]
            if (meta.get("labels") or {}).get(DRIVER_REVISION_LABEL) != revision:
                continue
            if any(o.get("name") == ds for o in meta.get("ownerReferences") or ()):
                return str(meta["name"])
        return None

    async def _clear(self, raw: Obj, record: RollbackRecord, owner: str | None) -> None:
        """The owner renders another driver now: the rollback is over."""
        patch = {"metadata": {"annotations": {ROLLBACK_ANNOTATION: None}}}
        cache = self._policies if owner is None else self._drivers
        patched = await self.rest.merge_patch(owner_kind(owner), raw["metadata"]["name"], patch)
        cache.observe(patched)
        log.info("driver rollback ended: the driver changed", reverted=record.describe())
