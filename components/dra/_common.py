"""Builders shared by the GPUCluster's operand states: object metadata with upstream's
state label, pod-wide settings from `spec.daemonsets`, and the resource API version."""

from __future__ import annotations

from typing import Any

from components._k8s import dump_model
from components.context import Manifest
from crd import GPUClusterSpec

STATE_LABEL = "nvidia.com/gpu-operator.state"
"""Upstream's label naming the operand state of every object a GPUCluster renders; it is
also how our controller selects (watches and prunes) these objects."""
DRA_DRIVER = "state-dra-driver"
DRA_VALIDATION = "state-dra-validation"
DCGM = "state-dcgm"
DCGM_EXPORTER = "state-dcgm-exporter"
STATES = (DRA_DRIVER, DCGM, DCGM_EXPORTER, DRA_VALIDATION)
"""Upstream's GPUCluster states, in its sync order."""

RESOURCE_API = "resource.k8s.io/v1"
"""DeviceClasses and ResourceClaimTemplates: the GA DRA API (Kubernetes 1.34)."""
RBAC_API = "rbac.authorization.k8s.io/v1"
PRIORITY_CLASS = "system-node-critical"
DAEMONSET_FIXED_POD_LABELS = ("app", "app.kubernetes.io/part-of")
"""Labels `daemonsets.labels` may not set on pods: `app` is the selector."""


def meta(
    name: str,
    state: str,
    namespace: str | None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Object metadata; cluster-scoped objects (namespace None) get no namespace."""
    result: dict[str, Any] = {"name": name, "labels": {**(labels or {}), STATE_LABEL: state}}
    if namespace is not None:
        result["namespace"] = namespace
    if annotations:
        result["annotations"] = dict(annotations)
    return result


def workload_meta(
    name: str, state: str, namespace: str, own: dict[str, str], spec: GPUClusterSpec
) -> dict[str, Any]:
    """Metadata of a DaemonSet or Deployment: its own labels, then `daemonsets.labels`
    and `daemonsets.annotations`, as upstream's manifests."""
    ds = spec.daemonsets
    return meta(name, state, namespace, {**own, **(ds.labels or {})}, ds.annotations)


def template_meta(
    own: dict[str, str], spec: GPUClusterSpec, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    """Pod template metadata: its own labels plus `daemonsets.labels` (never `app` or
    part-of), `daemonsets.annotations` plus `annotations`."""
    ds = spec.daemonsets
    extra = {k: v for k, v in (ds.labels or {}).items() if k not in DAEMONSET_FIXED_POD_LABELS}
    result: dict[str, Any] = {"labels": {**own, **extra}}
    merged = {**(ds.annotations or {}), **(annotations or {})}
    if merged:
        result["annotations"] = merged
    return result


def tolerations(spec: GPUClusterSpec) -> list[dict[str, Any]]:
    return [dump_model(t) for t in spec.daemonsets.tolerations or ()]


def pull_secrets(names: list[str] | None) -> dict[str, Any]:
    """The pod-spec field for `imagePullSecrets`, or nothing."""
    return {"imagePullSecrets": [{"name": n} for n in names]} if names else {}


def pull_policy(policy: str | None) -> dict[str, Any]:
    """`imagePullPolicy` only where the spec sets one (else the API server's default)."""
    return {"imagePullPolicy": policy} if policy else {}


def service_account(name: str, state: str, ns: str, labels: dict[str, str]) -> Manifest:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(name, state, ns, labels)}


def role(
    kind: str, name: str, state: str, ns: str | None, rules: list[dict[str, Any]], **labels: str
) -> Manifest:
    """A Role (`ns` set) or ClusterRole (`ns` None)."""
    return {
        "apiVersion": RBAC_API,
        "kind": kind,
        "metadata": meta(name, state, ns, labels),
        "rules": rules,
    }


def binding(
    kind: str,
    name: str,
    state: str,
    ns: str | None,
    role_name: str,
    account: str,
    account_ns: str,
    **labels: str,
) -> Manifest:
    """A RoleBinding (`ns` set) or ClusterRoleBinding (`ns` None) to one ServiceAccount."""
    role_kind = "Role" if kind == "RoleBinding" else "ClusterRole"
    return {
        "apiVersion": RBAC_API,
        "kind": kind,
        "metadata": meta(name, state, ns, labels),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role_name},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": account_ns}],
    }


def rule(groups: list[str], resources: list[str], verbs: list[str]) -> dict[str, Any]:
    return {"apiGroups": groups, "resources": resources, "verbs": verbs}


def admin_claim_template(
    name: str, state: str, ns: str, request: str, count: int | None
) -> Manifest:
    """A ResourceClaimTemplate asking for `count` GPUs (all when None) with admin access:
    monitoring and validation see the devices without consuming them."""
    exactly: dict[str, Any] = {"deviceClassName": "gpu.nvidia.com", "adminAccess": True}
    if count is None:
        exactly["allocationMode"] = "All"
    else:
        exactly.update(allocationMode="ExactCount", count=count)
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaimTemplate",
        "metadata": meta(name, state, ns),
        "spec": {"spec": {"devices": {"requests": [{"name": request, "exactly": exactly}]}}},
    }
