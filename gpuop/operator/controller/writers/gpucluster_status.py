"""The GPUCluster's status as upstream writes it: state, namespace, and the Ready,
Error and UnsupportedFields conditions, written only when it differs from the stored."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from crd import (
    CONDITION_ERROR,
    CONDITION_READY,
    GC_API_VERSION,
    GC_KIND,
    REASON_FIELDS_NOT_ACTED_ON,
    Condition,
    with_unsupported_condition,
)
from crd._status import format_time, set_conditions, unsupported_fields_news
from gpuop.kube.informer import Informer, Obj
from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Rest
from gpuop.log import get_logger
from gpuop.operator.events import EventRecorder

log = get_logger(__name__)

GPUCLUSTER = by_kind(GC_API_VERSION, GC_KIND)


class GPUClusterStatus:
    """Writes the GPUCluster's status subresource through its cache."""

    def __init__(
        self, rest: Rest, clusters: Informer, events: EventRecorder, namespace: str
    ) -> None:
        self.rest = rest
        self._clusters = clusters
        self.events = events
        self.namespace = namespace

    async def write(
        self,
        raw: Obj,
        state: str,
        ready: tuple[bool, str, str],
        unsupported: Sequence[str] | None = None,
    ) -> None:
        """Write upstream's status (state, namespace, Ready and Error conditions) when
        it differs from what is stored; an unchanged condition keeps its time. With
        `unsupported` (a spec that parsed), the UnsupportedFields condition names what
        the spec sets but we ignore, as the other two kinds' do (a Warning Event once per
        change of it); None keeps the stored one."""
        holds, reason, message = ready
        now = datetime.now(UTC)
        stamp = format_time(now)
        error = (False, CONDITION_READY, "") if holds else (True, reason, message)
        previous = [Condition.model_validate(c) for c in _stored(raw).get("conditions") or []]
        conditions = set_conditions(
            previous,
            Condition(
                type=CONDITION_READY,
                status="True" if holds else "False",
                reason=reason if holds else CONDITION_ERROR,
                message=message if holds else "",
                last_transition_time=stamp,
            ),
            Condition(
                type=CONDITION_ERROR,
                status="True" if error[0] else "False",
                reason=error[1],
                message=error[2],
                last_transition_time=stamp,
            ),
        )
        if unsupported is not None:
            generation = raw["metadata"].get("generation")
            conditions = with_unsupported_condition(
                conditions, unsupported, generation=generation, now=now
            )
        dumped: list[Obj] = [
            c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in conditions
        ]
        status = {"state": state, "namespace": self.namespace, "conditions": dumped}
        if _stored(raw) == status:
            return
        patched = await self.rest.merge_patch(
            GPUCLUSTER, raw["metadata"]["name"], {"status": status}, subresource="status"
        )
        self._clusters.observe(patched)
        await self._record_unsupported(raw, dumped)

    async def _record_unsupported(self, raw: Obj, written: list[Obj]) -> None:
        """A Warning Event naming the fields set but not acted on, once per change of the
        UnsupportedFields condition (so once per generation that sets them)."""
        message = unsupported_fields_news(_stored(raw).get("conditions") or [], written)
        if message is None:
            return
        involved = {"apiVersion": GC_API_VERSION, "kind": GC_KIND, "metadata": raw["metadata"]}
        await self.events.record(involved, REASON_FIELDS_NOT_ACTED_ON, message, warning=True)
        log.warning("GPUCluster sets fields gpuop does not act on", message=message)


def _stored(raw: Obj) -> dict[str, Any]:
    return dict(raw.get("status") or {})
