"""The chart's operator RBAC holds everything the GPUCluster controller needs: what the
DRA stack's Roles and ClusterRoles grant (Kubernetes lets the operator grant only what it
holds), the verbs its caches, applies and prunes use on each kind, by name on the
cluster-scoped objects, and the GPUCluster's own finalizer, status and namespace label."""

from __future__ import annotations

import crd
from components import RenderContext, rbac
from components.dra import KINDS, render
from tests.unit.test_registry import _operator_rules

NAMESPACE = "gpu-operator"
"""The namespace deploy/manifests renders for."""

EVERYTHING = crd.parse_gpucluster(
    {
        "spec": {
            "draDriver": {"featureGates": {"MPSSupport": True, "PassthroughSupport": True}},
            "dcgm": {"enabled": True},
            "dcgmExporter": {"enabled": True},
        }
    }
).spec

OWN = [
    rbac.Need(True, "nvidia.com", "gpuclusters", v, why="watches and finalizes it")
    for v in ("get", "list", "watch", "patch")
] + [
    rbac.Need(True, "nvidia.com", "gpuclusters/status", "patch", why="its status"),
    rbac.Need(True, "nvidia.com", "gpuclusters/finalizers", "update", why="blockOwnerDeletion"),
    rbac.Need(True, "", "namespaces", "get", NAMESPACE, why="admin-access label"),
    rbac.Need(True, "", "namespaces", "patch", NAMESPACE, why="admin-access label"),
]


def _needs() -> list[rbac.Need]:
    ctx = RenderContext(namespace=NAMESPACE, operator_image="gpuop:test")
    objects = [o for objs in render(EVERYTHING, ctx).values() for o in objs]
    return [*rbac.rendered_needs(objects, KINDS, "GPUCluster owns it"), *OWN]


def test_chart_holds_every_permission_the_gpucluster_needs() -> None:
    cluster, role = _operator_rules(dra=True)
    needs = _needs()
    assert {n.resource for n in needs} >= {"computedomaincliques", "deviceclasses"}
    assert [str(n) for n in rbac.missing(cluster, role, needs)] == []


def test_the_check_fails_without_the_device_class_names() -> None:
    cluster, role = _operator_rules(dra=True)
    named = [r for r in cluster if "deviceclasses" in r["resources"] and r.get("resourceNames")]
    assert named
    lost = rbac.missing([r for r in cluster if r not in named], role, _needs())
    assert {(n.resource, n.verb) for n in lost} == {
        ("deviceclasses", "create"),
        ("deviceclasses", "patch"),
        ("deviceclasses", "delete"),
    }


def test_the_chart_defaults_grant_no_dra_pass_through() -> None:
    """Without a GPUCluster enabled the operator cannot patch pods or write Leases
    anywhere, nor create the DRA stack's cluster-scoped objects; its caches still list."""
    cluster, role = _operator_rules()
    missing = rbac.missing(cluster, role, _needs())
    lost = {(n.group, n.resource, n.verb) for n in missing}
    assert {
        ("", "pods", "patch"),
        ("coordination.k8s.io", "leases", "update"),
        ("coordination.k8s.io", "leases", "create"),
        ("resource.k8s.io", "deviceclasses", "create"),
        ("admissionregistration.k8s.io", "validatingadmissionpolicies", "create"),
        ("rbac.authorization.k8s.io", "clusterroles", "create"),
        ("nvidia.com", "gpuclusters/finalizers", "update"),
    } <= lost
    caches = [n for n in missing if n.why == "GPUCluster owns it" and n.verb in ("list", "watch")]
    assert not caches
    assert ("nvidia.com", "gpuclusters/status", "patch") not in lost
