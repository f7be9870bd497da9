"""What a GPUCluster renders: upstream's DRA states, pure. No I/O.

`render` gives every state's objects in upstream's sync order (an empty list for a
disabled state, whose leftovers the controller deletes). `KINDS` lists every kind it
may return, so the controller can watch, write and prune them; `claim_consumers` names
the DaemonSets whose pods hold ResourceClaims, which must be gone before the kubelet
plugin that unprepares those claims.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from components.component import ObjectKind
from components.context import Manifest, RenderContext
from components.dra._common import (
    DCGM,
    DCGM_EXPORTER,
    DRA_DRIVER,
    DRA_VALIDATION,
    RESOURCE_API,
    STATE_LABEL,
    STATES,
)
from components.dra.driver import PLUGIN as PLUGIN_DAEMONSET
from components.dra.driver import render as render_driver
from components.dra.labels import DRA_DEPLOY_LABELS, gpucluster_label_changes
from components.dra.monitoring import dcgm, exporter, validator
from components.kinds import SERVICE_MONITOR
from crd import GPUClusterSpec

KINDS: tuple[ObjectKind, ...] = (
    ObjectKind("v1", "ServiceAccount", "serviceaccounts"),
    ObjectKind("v1", "Service", "services"),
    ObjectKind("rbac.authorization.k8s.io/v1", "Role", "roles"),
    ObjectKind("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings"),
    ObjectKind("rbac.authorization.k8s.io/v1", "ClusterRole", "clusterroles", namespaced=False),
    ObjectKind("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", "clusterrolebindings", False),
    ObjectKind(RESOURCE_API, "DeviceClass", "deviceclasses", namespaced=False),
    ObjectKind(RESOURCE_API, "ResourceClaimTemplate", "resourceclaimtemplates"),
    ObjectKind(
        "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicy",
        "validatingadmissionpolicies",
        namespaced=False,
    ),
    ObjectKind(
        "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicyBinding",
        "validatingadmissionpolicybindings",
        namespaced=False,
    ),
    ObjectKind("apps/v1", "DaemonSet", "daemonsets"),
    ObjectKind("apps/v1", "Deployment", "deployments"),
    SERVICE_MONITOR,
)
"""Every kind `render` returns (a unit test holds it to that)."""

RESOURCE_KINDS: tuple[ObjectKind, ...] = (
    ObjectKind("v1", "Namespace", "namespaces", namespaced=False),
    ObjectKind(RESOURCE_API, "ResourceSlice", "resourceslices", namespaced=False),
    ObjectKind(RESOURCE_API, "ResourceClaim", "resourceclaims"),
)
"""DRA kinds read but not rendered (the API client needs their paths)."""


def render(spec: GPUClusterSpec, ctx: RenderContext) -> dict[str, list[Manifest]]:
    """Every state's desired objects, keyed by state in upstream's order."""
    return {
        DRA_DRIVER: render_driver(spec, ctx),
        DCGM: dcgm(spec, ctx) if spec.dcgm_enabled else [],
        DCGM_EXPORTER: exporter(spec, ctx) if spec.exporter_enabled else [],
        DRA_VALIDATION: validator(spec, ctx),
    }


def claim_consumers(daemonsets: Iterable[Mapping[str, Any]]) -> list[str]:
    """Names of the DaemonSets whose pods hold ResourceClaims (sorted)."""
    return sorted(
        str(ds["metadata"]["name"])
        for ds in daemonsets
        if ((ds.get("spec") or {}).get("template") or {}).get("spec", {}).get("resourceClaims")
    )


__all__ = [
    "DRA_DEPLOY_LABELS",
    "KINDS",
    "PLUGIN_DAEMONSET",
    "RESOURCE_KINDS",
    "STATES",
    "STATE_LABEL",
    "claim_consumers",
    "gpucluster_label_changes",
    "render",
]
