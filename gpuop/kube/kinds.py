"""Every kind the operator reads or writes, in one table: the Kubernetes kinds it uses
for itself and every kind some operand renders (from the operand registry, so a new
operand's kinds need no entry here). The REST layer is handed this table; it knows no
kinds of its own. One kind type serves both: the registry's `ObjectKind`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from components import OWNED_KINDS, ObjectKind
from components.dra import KINDS as DRA_KINDS
from components.dra import RESOURCE_KINDS as DRA_RESOURCE_KINDS

_OWN_KINDS = (
    ObjectKind("v1", "Node", "nodes", False),
    ObjectKind("v1", "Pod", "pods"),
    ObjectKind("v1", "PodTemplate", "podtemplates"),
    ObjectKind("v1", "Namespace", "namespaces", False),
    ObjectKind("v1", "Event", "events"),
    ObjectKind("apps/v1", "Deployment", "deployments"),
    ObjectKind("apps/v1", "ControllerRevision", "controllerrevisions"),
    ObjectKind("nvidia.com/v1", "ClusterPolicy", "clusterpolicies", False),
    ObjectKind("nvidia.com/v1alpha1", "NVIDIADriver", "nvidiadrivers", False),
    ObjectKind("nvidia.com/v1alpha1", "GPUCluster", "gpuclusters", False),
    ObjectKind("coordination.k8s.io/v1", "Lease", "leases"),
    ObjectKind("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets"),
    ObjectKind(
        "apiextensions.k8s.io/v1", "CustomResourceDefinition", "customresourcedefinitions", False
    ),
)
"""Kinds the operator uses itself (nodes, pods, its own CRDs, leases, events)."""

KINDS: dict[tuple[str, str], ObjectKind] = {
    (k.api_version, k.kind): k for k in (*_OWN_KINDS, *OWNED_KINDS, *DRA_KINDS, *DRA_RESOURCE_KINDS)
}


def kind_of(obj: Mapping[str, Any]) -> ObjectKind:
    """The kind of a whole object; a clear error for one the operator does not handle."""
    try:
        return KINDS[(str(obj["apiVersion"]), str(obj["kind"]))]
    except KeyError as err:
        raise ValueError(f"unsupported kind {obj.get('apiVersion')}/{obj.get('kind')}") from err


def by_kind(api_version: str, kind: str) -> ObjectKind:
    return KINDS[(api_version, kind)]
