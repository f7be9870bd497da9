"""Kubernetes Events: what an administrator must see with ``kubectl describe``.

Only transitions are recorded (a policy turning ready, a node's upgrade starting,
finishing or failing), never steady state, so a quiet cluster stays quiet. A
failure to record is logged and swallowed: Events are a courtesy, not a duty.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Rest
from gpuop.log import get_logger

log = get_logger(__name__)
EVENT = by_kind("v1", "Event")
COMPONENT = "gpu-operator"


class EventRecorder:
    def __init__(self, rest: Rest, namespace_for_cluster_objects: str = "default") -> None:
        self.rest = rest
        self.namespace = namespace_for_cluster_objects

    async def record(
        self, involved: dict[str, Any], reason: str, message: str, warning: bool = False
    ) -> None:
        meta = involved.get("metadata") or {}
        namespace = meta.get("namespace") or self.namespace
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{meta.get('name')}.{time.time_ns():x}", "namespace": namespace},
            "involvedObject": {
                "apiVersion": involved.get("apiVersion", "v1"),
                "kind": involved.get("kind", "Node"),
                "name": meta.get("name"),
                "uid": meta.get("uid"),
                **({"namespace": meta["namespace"]} if meta.get("namespace") else {}),
            },
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": COMPONENT},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self.rest.create(EVENT, body, namespace)
        except Exception as err:  # never let an Event break a reconcile
            log.warning("event not recorded", reason=reason, error=str(err))
