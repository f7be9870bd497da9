"""What the controller reads of stored objects: which driver an object belongs to, a
resource's generation, its stored status and conditions. Pure, so every floor may use it."""

from __future__ import annotations

from components.driver import DAEMONSET_NAME as POLICY_DRIVER_DS
from crd import (
    NVD_KIND,
    ClusterPolicyStatus,
)
from gpuop.kube.informer import Obj
from gpuop.kube.kinds import by_kind

POLICY = by_kind("nvidia.com/v1", "ClusterPolicy")
RUNS_PODS = frozenset({"DaemonSet", "Deployment", "StatefulSet", "Job", "Pod"})
"""The kinds whose objects run pods."""


def is_policy_driver(name: str) -> bool:
    """Whether a DaemonSet (or the `app` of a pod) is the ClusterPolicy's driver."""
    return name == POLICY_DRIVER_DS or name.startswith(POLICY_DRIVER_DS + "-")


def is_driver_object(obj: Obj) -> bool:
    """Whether an object (a DaemonSet, say) is part of a driver: the ClusterPolicy's
    (by name) or an NVIDIADriver's (by owner)."""
    return nvd_owner(obj) is not None or is_policy_driver(obj["metadata"]["name"])


def nvd_owner(obj: Obj) -> str | None:
    """Name of the NVIDIADriver that controls ``obj``, if one does."""
    for ref in obj["metadata"].get("ownerReferences") or ():
        if ref.get("kind") == NVD_KIND and ref.get("controller"):
            return str(ref["name"])
    return None


def generation(obj: Obj) -> int | None:
    value = obj.get("metadata", {}).get("generation")
    return int(value) if value is not None else None


def policy_ref(raw: Obj) -> Obj:
    """The ClusterPolicy as the object an Event is about."""
    return {"apiVersion": POLICY.api_version, "kind": POLICY.kind, "metadata": raw["metadata"]}


def stored_condition(raw: Obj, kind: str) -> Obj:
    """The condition of type ``kind`` in the policy's stored status ({} when none)."""
    conditions = (raw.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == kind), {})


def parse_status(raw: Obj) -> ClusterPolicyStatus | None:
    """The policy's stored status, or None when it has none or one we cannot read (it
    is then rewritten whole)."""
    data = raw.get("status")
    if not data:
        return None
    try:
        return ClusterPolicyStatus.model_validate(data)
    except ValueError:
        return None
