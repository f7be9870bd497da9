"""One condition of a driver owner's resource: the ClusterPolicy's, or an NVIDIADriver's.

The fleet pass's units (the rollout gate, the maintenance windows) each own one
condition type on the resource whose nodes they gate; this is their one way to read
and write it, merged onto the freshest object so no other writer's condition is lost.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from crd import NVD_API_VERSION, NVD_KIND, NVIDIADriverStatus
from gpuop.kube.informer import Informer, Obj
from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Kind, Rest
from gpuop.log import get_logger
from gpuop.operator.controller.views.objects import parse_status
from gpuop.operator.controller.writers.status_write import (
    StatusWrite,
    condition_change,
    write_policy_conditions,
    write_status,
)

log = get_logger(__name__)

POLICY = by_kind("nvidia.com/v1", "ClusterPolicy")
NVD = by_kind(NVD_API_VERSION, NVD_KIND)


def owner_kind(owner: str | None) -> Kind:
    """The kind carrying ``owner``'s conditions (None: the ClusterPolicy)."""
    return POLICY if owner is None else NVD


def owner_ref(raw: Obj, owner: str | None) -> Obj:
    """``raw`` as an Event's involved object."""
    kind = owner_kind(owner)
    return {"apiVersion": kind.api_version, "kind": kind.kind, "metadata": raw["metadata"]}


def condition_of(raw: Obj, condition_type: str) -> dict[str, Any] | None:
    for cond in (raw.get("status") or {}).get("conditions") or []:
        if cond.get("type") == condition_type:
            return dict(cond)
    return None


def nvd_status(raw: Obj) -> NVIDIADriverStatus | None:
    data = raw.get("status")
    if not data:
        return None
    try:
        return NVIDIADriverStatus.model_validate(data)
    except ValueError:
        return None


async def write_owner_condition(
    rest: Rest,
    cache: Informer | Any,
    raw: Obj,
    owner: str | None,
    condition_type: str,
    condition: tuple[str, str, str] | None,
) -> None:
    """Set ``condition_type`` to (status, reason, message), or with None remove it, on
    ``raw`` (the ClusterPolicy when ``owner`` is None, else that NVIDIADriver; ``cache``
    is its kind's cache). Nothing is written when it already reads so."""
    if condition is None and condition_of(raw, condition_type) is None:
        return
    if condition is not None:
        condition = (condition[0], condition[1], condition[2][:32768])
    parse = parse_status if owner is None else nvd_status
    change = condition_change(raw, condition_type, condition, datetime.now(UTC), parse=parse)
    if change is None:
        log.warning(
            "status unreadable; condition not written",
            kind=owner_kind(owner).kind,
            name=raw["metadata"]["name"],
            condition=condition_type,
        )
        return
    if change.wanted == change.stored:
        return
    if owner is None:
        await write_policy_conditions(rest, cache, raw, change.wanted, owned=condition_type)
        return
    mine = [
        c.model_dump(by_alias=True, exclude_none=True, mode="json")
        for c in change.wanted
        if c.type == condition_type
    ]
    await write_status(rest, NVD, cache, raw, StatusWrite(frozenset({condition_type}), mine))
