"""The operator's rights on the real control plane, as its ServiceAccount has them.

With the chart's defaults `kubectl auth can-i` answers no to the pass-through rights a
GPUCluster's DRA stack needs (patch any pod, write Leases anywhere) and to creating any
ClusterRoleBinding but the operands' own; with a GPUCluster enabled the DRA roles grant
them. The chart's admission policy holds the account to the bindings and admission
policies the operator renders: a binding of an allowed name that hands its role to
another subject, or names another role, and an admission policy that matches more than
ResourceSlices are refused; the rendered ones are admitted.
"""

from __future__ import annotations

import contextlib
import subprocess
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException as ApiError

import crd
from components import COMPONENTS, RenderContext
from components.dra import render as render_dra
from gpuop.devcluster import ClusterInfo
from gpuop.devcluster._versions import BinaryPaths, Versions, cache_dir
from gpuop.kube.kinds import KINDS, by_kind
from gpuop.kube.rest import Rest
from tests.integration.harness import eventually
from tests.integration.helm_chart import documents, template
from tests.integration.test_helm_install import service_account_client

pytestmark = pytest.mark.integration

RELEASE = "gpuop-rights"
ACCOUNT = "gpu-operator"
"""The chart's operator account, whatever the release is called."""
CRB = by_kind("rbac.authorization.k8s.io/v1", "ClusterRoleBinding")
CLUSTER_ROLE = by_kind("rbac.authorization.k8s.io/v1", "ClusterRole")
VAP = by_kind("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy")
VAPB = by_kind("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding")
CHART_KINDS = {
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}
DRA_POLICY = "resourceslices-policy-nvidia-dra-driver"


def _operator_docs(namespace: str, *values: str) -> list[dict[str, Any]]:
    """The chart's operator account, its roles and bindings and its guard policy."""
    sets = [a for v in values for a in ("--set", v)]
    docs = documents(template(*sets, release=RELEASE, namespace=namespace))
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == ACCOUNT
    return [
        d for d in docs if d["kind"] in CHART_KINDS and d["metadata"]["name"].startswith(ACCOUNT)
    ]


@contextlib.asynccontextmanager
async def _installed(
    admin: Rest, api_client: client.ApiClient, *values: str
) -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    namespace = f"gpuop-rights-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(api_client)
    await core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    docs = _operator_docs(namespace, *values)
    try:
        for doc in docs:
            await admin.apply(doc)
        yield namespace, docs
    finally:
        for doc in docs:
            with contextlib.suppress(ApiError):
                await admin.delete(
                    admin.kind_of(doc), doc["metadata"]["name"], doc["metadata"].get("namespace")
                )
        with contextlib.suppress(client.ApiException):
            await core.delete_namespace(namespace)


def _can_i(info: ClusterInfo, user: str, *args: str) -> str:
    """`kubectl auth can-i ... --as=<user>`, as an administrator would ask it."""
    kubectl = BinaryPaths.under(cache_dir(), Versions.from_env()).kubectl
    proc = subprocess.run(
        [str(kubectl), "--kubeconfig", str(info.kubeconfig), "auth", "can-i", *args,
         f"--as={user}"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    return proc.stdout.strip()


async def _refused(call: Any) -> ApiError:
    with pytest.raises(ApiError) as caught:
        await call
    return caught.value


def _operand_role(name: str) -> dict[str, Any]:
    ctx = RenderContext(namespace="unused", operator_image="x", mig_capable=True)
    objects = [o for c in COMPONENTS for o in c.objects(crd.default_policy().spec, ctx)]
    role = next(o for o in objects if o["kind"] == "ClusterRole" and o["metadata"]["name"] == name)
    return {
        "apiVersion": role["apiVersion"],
        "kind": "ClusterRole",
        "metadata": {"name": name},
        "rules": role["rules"],
    }


def _binding(name: str, subject: dict[str, str], role: str | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": role or name,
        },
        "subjects": [subject],
    }


@pytest.fixture
async def admin(api_client: client.ApiClient) -> Rest:
    return Rest(api_client, KINDS)


async def _policy_enforced(rest: Rest, bad: dict[str, Any]) -> bool:
    """Admission policies take effect asynchronously: the guard refuses once loaded."""
    try:
        await rest.apply(bad)
    except ApiError as err:
        return "GPU operator" in str(err)
    with contextlib.suppress(ApiError):
        await rest.delete(CRB, bad["metadata"]["name"])
    return False


async def test_default_rights_refuse_pass_through_and_foreign_bindings(
    admin: Rest, api_client: client.ApiClient, local_cluster: ClusterInfo
) -> None:
    async with _installed(admin, api_client) as (namespace, docs):
        assert not [d for d in docs if d["metadata"]["name"].endswith("-dra")]
        user = f"system:serviceaccount:{namespace}:{ACCOUNT}"
        # The pass-through rights are not held by default (issue 43).
        assert _can_i(local_cluster, user, "patch", "pods", "-n", "kube-system") == "no"
        assert _can_i(local_cluster, user, "update", "leases", "-n", "kube-node-lease") == "no"
        assert _can_i(local_cluster, user, "get", "leases", "-n", "kube-node-lease") == "no"
        # Cluster-scoped writes by name only: the operands' own bindings, no other.
        assert _can_i(local_cluster, user, "create", "clusterrolebindings/nvidia-driver") == "yes"
        assert _can_i(local_cluster, user, "create", "clusterrolebindings/mine") == "no"
        assert _can_i(local_cluster, user, "create", "clusterrolebindings") == "no"
        assert _can_i(local_cluster, user, "create", "validatingadmissionpolicies") == "no"
        # What the operator does stays allowed.
        assert (
            _can_i(local_cluster, user, "create", "pods", "--subresource=eviction", "-A") == "yes"
        )
        assert _can_i(local_cluster, user, "patch", "nodes") == "yes"
        # The upgrade pre-flight reads pull Secrets by name, in its namespace only.
        assert _can_i(local_cluster, user, "get", "secrets", "-n", namespace) == "yes"
        assert _can_i(local_cluster, user, "list", "secrets", "-n", namespace) == "no"
        assert _can_i(local_cluster, user, "get", "secrets", "-n", "kube-system") == "no"

        operand = f"{namespace}-operand"  # any ServiceAccount of the operator's namespace
        own = {"kind": "ServiceAccount", "name": operand, "namespace": namespace}
        async with service_account_client(api_client, local_cluster, namespace, ACCOUNT) as sa:
            rest = Rest(sa, KINDS)
            try:
                await rest.apply(_operand_role("nvidia-driver"))
                # Refused by RBAC: a binding of a name not the operands'.
                err = await _refused(rest.apply(_binding("mine", own, role="nvidia-driver")))
                assert err.status == 403, err
                # Refused by the guard: the role handed to a user, to another
                # namespace's account, or a role of another name.
                mallory = {
                    "kind": "User",
                    "name": "mallory",
                    "apiGroup": "rbac.authorization.k8s.io",
                }
                assert await eventually(
                    lambda: _policy_enforced(rest, _binding("nvidia-driver", mallory)),
                    timeout=30,
                    what="the operator guard enforced",
                )
                elsewhere = {"kind": "ServiceAccount", "name": "x", "namespace": "kube-system"}
                err = await _refused(rest.apply(_binding("nvidia-driver", elsewhere)))
                assert "ServiceAccounts of its namespace" in str(err), err
                await rest.apply(_operand_role("nvidia-mig-manager"))
                other = _binding("nvidia-driver", own, role="nvidia-mig-manager")
                err = await _refused(rest.apply(other))
                assert "role of the binding's own name" in str(err), err
                # The binding the operator renders is admitted.
                await rest.apply(_binding("nvidia-driver", own))
                assert await admin.get(CRB, "nvidia-driver") is not None
            finally:
                for kind, name in (
                    (CRB, "nvidia-driver"),
                    (CLUSTER_ROLE, "nvidia-driver"),
                    (CLUSTER_ROLE, "nvidia-mig-manager"),
                ):
                    with contextlib.suppress(ApiError):
                        await admin.delete(kind, name)


def _dra_policy(resources: list[str]) -> dict[str, Any]:
    spec = crd.parse_gpucluster({"spec": {"draDriver": {}, "dcgm": {}, "dcgmExporter": {}}}).spec
    ctx = RenderContext(namespace="unused", operator_image="x")
    rendered = next(
        o
        for objs in render_dra(spec, ctx).values()
        for o in objs
        if o["kind"] == "ValidatingAdmissionPolicy"
    )
    policy = {k: v for k, v in rendered.items() if k != "status"}
    policy["metadata"] = {"name": rendered["metadata"]["name"]}
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    policy["spec"]["matchConstraints"]["resourceRules"] = [
        {**rules[0], "apiGroups": ["resource.k8s.io" if r == "resourceslices" else ""],
         "resources": [r]}
        for r in resources
    ]  # fmt: skip
    return policy


async def test_gpucluster_rights_are_granted_only_with_it_and_guarded(
    admin: Rest, api_client: client.ApiClient, local_cluster: ClusterInfo
) -> None:
    async with _installed(admin, api_client, "gpuCluster.rbac=true") as (namespace, docs):
        assert [d for d in docs if d["metadata"]["name"].endswith("-dra")]
        user = f"system:serviceaccount:{namespace}:{ACCOUNT}"
        assert _can_i(local_cluster, user, "patch", "pods", "-n", "kube-system") == "yes"
        assert (
            _can_i(local_cluster, user, "create", f"validatingadmissionpolicies/{DRA_POLICY}")
            == "yes"
        )
        assert _can_i(local_cluster, user, "create", "validatingadmissionpolicies/other") == "no"
        async with service_account_client(api_client, local_cluster, namespace, ACCOUNT) as sa:
            rest = Rest(sa, KINDS)
            try:
                # The rendered policy, created by name (what a GPUCluster's pass does).
                # Its content no admission policy can hold: Kubernetes never runs
                # admission policies on admission policies, so the name is the limit.
                await rest.apply(_dra_policy(["resourceslices"]))
                binding = {
                    "apiVersion": "admissionregistration.k8s.io/v1",
                    "kind": "ValidatingAdmissionPolicyBinding",
                    "metadata": {"name": DRA_POLICY},
                    "spec": {"policyName": DRA_POLICY, "validationActions": ["Deny"]},
                }
                await rest.apply(binding)
                other = {**binding, "metadata": {"name": "other"}}
                err = await _refused(rest.apply(other))
                assert err.status == 403, err
            finally:
                for kind in (VAPB, VAP):
                    with contextlib.suppress(ApiError):
                        await admin.delete(kind, DRA_POLICY)
