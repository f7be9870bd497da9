"""Replacing a workload object whose selector must change, without disturbing its pods.

A DaemonSet's or Deployment's `spec.selector` is immutable: an apply that changes it is
refused with 422. That happens when gpuop takes over an older gpuop's objects (or
another operator's) whose selectors differ from what it renders now. The object is
deleted with `propagationPolicy: Orphan` (its pods keep running, unowned), then created
again; the new object adopts the running pods its selector matches. Pods of the old
object that the new selector does not match would otherwise run beside the new
object's for ever, so they are deleted once the new object exists (operand pods only:
an operand's selector names its own `app`, never a workload's).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from gpuop.kube.informer import Obj
from gpuop.kube.kinds import by_kind, kind_of
from gpuop.kube.rest import Rest
from gpuop.log import get_logger

log = get_logger(__name__)

POD = by_kind("v1", "Pod")
SELECTOR_KINDS = frozenset({"DaemonSet", "Deployment"})
GONE_TIMEOUT = 30.0
"""How long the orphaning delete may take (the garbage collector removes the
`orphan` finalizer once it has released the pods)."""


def selector_refused(obj: Obj, err: ApiException) -> bool:
    """The API server refused ``obj`` because its selector may not change."""
    if obj.get("kind") not in SELECTOR_KINDS or err.status != 422:
        return False
    body = err.body.decode(errors="replace") if isinstance(err.body, bytes) else err.body
    text = f"{body or ''} {err.reason or ''}"
    return "spec.selector" in text and "immutable" in text


def _match_labels(obj: Obj | None) -> dict[str, str]:
    return dict((((obj or {}).get("spec") or {}).get("selector") or {}).get("matchLabels") or {})


def _matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


async def _gone(rest: Rest, obj: Obj, uid: str | None) -> None:
    meta = obj["metadata"]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + GONE_TIMEOUT
    while True:
        current = await rest.get(kind_of(obj), meta["name"], meta.get("namespace"))
        if current is None or current["metadata"].get("uid") != uid:
            return
        if loop.time() > deadline:
            raise TimeoutError(f"{obj['kind']} {meta['name']} not deleted yet")
        await asyncio.sleep(0.2)


async def replace_orphaning(rest: Rest, obj: Obj) -> tuple[Obj, str]:
    """Delete the live object with its pods orphaned, create ``obj``, and delete the old
    pods the new selector does not adopt. Returns the created object and what was done,
    in words for an Event."""
    meta = obj["metadata"]
    namespace = meta.get("namespace")
    current = await rest.get(kind_of(obj), meta["name"], namespace)
    old_selector = _match_labels(current)
    new_selector = _match_labels(obj)
    if current is not None:
        uid = current["metadata"]["uid"]
        await rest.delete(
            kind_of(obj),
            meta["name"],
            namespace,
            body={"propagationPolicy": "Orphan", "preconditions": {"uid": uid}},
        )
        await _gone(rest, obj, uid)
    created = await rest.apply(obj)
    stale = [
        p
        for p in await rest.list(POD, namespace)
        if _matches(old_selector, p["metadata"].get("labels") or {})
        and not _matches(new_selector, p["metadata"].get("labels") or {})
        and not p["metadata"].get("deletionTimestamp")
    ]
    for pod in stale:
        await rest.delete(POD, pod["metadata"]["name"], namespace)
    words = (
        f"replaced {obj['kind']} {namespace}/{meta['name']}: its selector "
        f"{json.dumps(old_selector, sort_keys=True)} is immutable and differs from "
        f"{json.dumps(new_selector, sort_keys=True)}; deleted with its pods orphaned "
        f"(they kept running), created again; the new selector adopts the running pods "
        f"it matches, {len(stale)} pod(s) it does not were deleted"
    )
    log.warning(
        "object replaced for its selector",
        kind=obj["kind"],
        name=meta["name"],
        old_selector=old_selector,
        new_selector=new_selector,
        deleted_pods=len(stale),
    )
    return created, words


_SUBJECT_KEYS = ("name", "namespace", "uid")


def event_subject(created: Obj) -> dict[str, Any]:
    """The involved object of the replacement's Event."""
    return {
        "apiVersion": created.get("apiVersion", "apps/v1"),
        "kind": created.get("kind"),
        "metadata": {k: v for k, v in created["metadata"].items() if k in _SUBJECT_KEYS},
    }
