"""An operand's identity: its ServiceAccount and the Roles and ClusterRoles bound to it,
and the rules several operands share."""

from __future__ import annotations

from typing import Any

from components._k8s import metadata, with_app_label
from components.component import rule
from components.context import Manifest, RenderContext
from crd import ClusterPolicySpec

SCC_RULE = {
    "apiGroups": ["security.openshift.io"],
    "resources": ["securitycontextconstraints"],
    "resourceNames": ["privileged"],
    "verbs": ["use"],
}
"""Lets an operand's pods use OpenShift's privileged SCC; a no-op elsewhere."""
CLUSTER_VERSION_RULE = rule("config.openshift.io", "clusterversions", "get list")
"""Lets an operand read OpenShift's version (no such objects elsewhere)."""


def service_account(
    name: str, component: str, spec: ClusterPolicySpec, ctx: RenderContext
) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": metadata(name, component, spec, ctx),
    }


def cluster_role_and_binding(
    name: str,
    component: str,
    spec: ClusterPolicySpec,
    ctx: RenderContext,
    rules: list[dict[str, Any]],
    *,
    account: str | None = None,
) -> list[Manifest]:
    """Cluster-wide permissions (e.g. reading Nodes) for the ServiceAccount `account`
    (by default, the one called `name`)."""
    meta = metadata(name, component, spec, ctx, namespaced=False)
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": meta,
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": dict(meta),
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": name,
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": account or name, "namespace": ctx.namespace}
            ],
        },
    ]


def role_and_binding(
    name: str,
    component: str,
    spec: ClusterPolicySpec,
    ctx: RenderContext,
    rules: list[dict[str, Any]],
) -> list[Manifest]:
    """Namespaced permissions for the ServiceAccount `name`."""
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": metadata(name, component, spec, ctx),
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": metadata(name, component, spec, ctx),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ctx.namespace}],
        },
    ]


READ_NODES = rule("", "nodes", "get list watch")


def operand_account(
    name: str,
    component: str,
    spec: ClusterPolicySpec,
    ctx: RenderContext,
    role: list[dict[str, Any]],
    cluster: list[dict[str, Any]] | None = None,
    *,
    app: str | None = None,
) -> list[Manifest]:
    """An operand's ServiceAccount `name` with its Role (`role`) and, where it reads
    cluster-scoped objects, its ClusterRole (`cluster`), each bound to it. With `app`,
    the account and its namespaced RBAC are labelled `app=<app>`, as upstream labels the
    exporters'."""
    namespaced = [
        service_account(name, component, spec, ctx),
        *role_and_binding(name, component, spec, ctx, role),
    ]
    if app is not None:
        namespaced = [with_app_label(o, app) for o in namespaced]
    return [
        *namespaced,
        *(cluster_role_and_binding(name, component, spec, ctx, cluster) if cluster else ()),
    ]
