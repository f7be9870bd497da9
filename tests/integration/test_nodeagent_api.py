"""The node agent's cluster-facing calls against the real API server: the CUDA
workload pod runs to completion on a simulated GPU node, the plugin check reads the
node's allocatable GPUs, and with the chart's RBAC and admission policy the agent's
token writes its own node's GPUHealthy and no other node's status."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

import crd
from components import COMPONENTS, RenderContext, node_status_exporter
from gpuop.devcluster import ClusterInfo
from gpuop.devcluster._health import mark_gpu_health
from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Rest
from gpuop.nodeagent.cuda import CudaCheck
from gpuop.nodeagent.health import CONDITION_TYPE, REASON_HEALTHY, Verdict
from gpuop.nodeagent.kube import KubernetesApi
from gpuop.nodeagent.plugin import PluginCheck
from gpuop.nodeagent.status import StatusFiles
from gpuop.nodeagent.validate import Validator
from gpuop.nodeagent.workload import WorkloadSpec
from tests.integration.harness import eventually
from tests.integration.helm_chart import documents, template

pytestmark = pytest.mark.integration


async def test_cuda_and_plugin_checks_pass_on_a_gpu_node(
    rest: Rest, api_client: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    await rest.apply(
        {
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": "nvidia"},
            "handler": "nvidia",
        }
    )
    kube = KubernetesApi(api_client)
    node = "gpu-node-0001"
    status = StatusFiles(tmp_path)
    validator = Validator(
        [
            CudaCheck(kube, WorkloadSpec(node_name=node, namespace=namespace), poll_s=0.2),
            PluginCheck(kube, node, poll_s=0.2),
        ],
        status,
    )
    assert await validator.run_once(), {k: v.reason for k, v in validator.last.items()}
    assert status.read("cuda") == {}  # empty, as upstream's
    assert status.read("plugin") == {}
    assert "nvidia.com/gpu" in validator.last["plugin"].facts["RESOURCES"]
    # The one-shot pod is cleaned up after it succeeded.
    pods = await rest.list(by_kind("v1", "Pod"), namespace)
    assert pods == []


async def test_plugin_check_fails_on_a_node_without_gpus(
    api_client: client.ApiClient, tmp_path: Path
) -> None:
    status = StatusFiles(tmp_path)
    validator = Validator([PluginCheck(KubernetesApi(api_client), "cpu-node-0000")], status)
    assert not await validator.run_once()
    assert "nvidia.com/gpu" in validator.last["plugin"].reason
    assert status.read("plugin") is None


# ------------------------------------------------------- the agent's own node only
AGENT_OBJECTS = "gpuop-node-agent"  # the chart's ClusterRole, binding, policy, binding
NODE_A, NODE_B, CPU_NODE = "gpu-node-0001", "gpu-node-0002", "cpu-node-0000"
NODE_NAME_CLAIM = "authentication.kubernetes.io/node-name"


def _agent_account(namespace: str) -> dict[str, Any]:
    """The node agent's ServiceAccount as the operator renders it."""
    spec = crd.default_policy().spec.model_copy(
        update={"node_status_exporter": crd.NodeStatusExporterSpec(enabled=True)}
    )
    ctx = RenderContext(namespace=namespace, operator_image="x")
    exporter = next(c for c in COMPONENTS if c.name == node_status_exporter.NAME)
    return next(o for o in exporter.objects(spec, ctx) if o["kind"] == "ServiceAccount")


async def _delete_cluster_objects(api_client: client.ApiClient) -> None:
    rbac = client.RbacAuthorizationV1Api(api_client)
    admission = client.AdmissionregistrationV1Api(api_client)
    for delete in (
        admission.delete_validating_admission_policy_binding,
        admission.delete_validating_admission_policy,
        rbac.delete_cluster_role_binding,
        rbac.delete_cluster_role,
    ):
        with contextlib.suppress(ApiException):
            await delete(AGENT_OBJECTS)


@pytest.fixture
async def agent_rbac(api_client: client.ApiClient, namespace: str) -> AsyncIterator[None]:
    """The chart's node-agent objects (rendered for ``namespace``) and the operator's
    ServiceAccount for the agent, created as they are rendered."""
    rendered = [
        d
        for d in documents(template(namespace=namespace))
        if d["metadata"]["name"] == AGENT_OBJECTS
    ]
    rbac = client.RbacAuthorizationV1Api(api_client)
    admission = client.AdmissionregistrationV1Api(api_client)
    create = {
        "ClusterRole": rbac.create_cluster_role,
        "ClusterRoleBinding": rbac.create_cluster_role_binding,
        "ValidatingAdmissionPolicy": admission.create_validating_admission_policy,
        "ValidatingAdmissionPolicyBinding": admission.create_validating_admission_policy_binding,
    }
    await _delete_cluster_objects(api_client)  # a crashed earlier run's, if any
    await client.CoreV1Api(api_client).create_namespaced_service_account(
        namespace, _agent_account(namespace)
    )
    try:
        for doc in rendered:
            await create[doc["kind"]](doc)
        yield
    finally:
        await _delete_cluster_objects(api_client)
        for node in (NODE_A, NODE_B, CPU_NODE):
            await client.CoreV1Api(api_client).patch_node_status(
                node,
                {"status": {"conditions": [{"type": CONDITION_TYPE, "$patch": "delete"}]}},
            )


@contextlib.asynccontextmanager
async def _client_for(
    api_client: client.ApiClient, info: ClusterInfo, namespace: str, bound_to: str | None
) -> AsyncIterator[client.ApiClient]:
    """An ApiClient with a TokenRequest token of the agent's account; ``bound_to`` names
    a pod scheduled to a node (the token then carries that node's name, as the token the
    kubelet gives the agent's pod does), None gives an unbound token."""
    core = client.CoreV1Api(api_client)
    spec: dict[str, Any] = {"audiences": []}
    if bound_to is not None:
        pod = await core.read_namespaced_pod(bound_to, namespace)
        spec["boundObjectRef"] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": bound_to,
            "uid": pod.metadata.uid,
        }
    token = await core.create_namespaced_service_account_token(
        node_status_exporter.SERVICE_ACCOUNT,
        namespace,
        client.AuthenticationV1TokenRequest(spec=spec),
    )
    config = client.Configuration()
    config.host = info.server
    config.ssl_ca_cert = str(info.directory / "pki" / "ca.crt")
    config.api_key = {"BearerToken": token.status.token}
    config.api_key_prefix = {"BearerToken": "Bearer"}
    async with client.ApiClient(config) as agent_api:
        yield agent_api


async def _agent_pod(api_client: client.ApiClient, namespace: str, node: str) -> str:
    """A pod of the agent's account bound to ``node`` (kwok runs it)."""
    name = f"agent-{node}"
    await client.CoreV1Api(api_client).create_namespaced_pod(
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "nodeName": node,
                "serviceAccountName": node_status_exporter.SERVICE_ACCOUNT,
                "containers": [{"name": "agent", "image": "gpuop:test"}],
            },
        },
    )
    return name


def _refusal(err: ApiException) -> str:
    assert err.status == 403, err
    return str(json.loads(err.body)["message"])


@pytest.mark.usefixtures("agent_rbac")
async def test_the_node_agent_patches_only_its_own_nodes_status(
    api_client: client.ApiClient,
    local_cluster: ClusterInfo,
    namespace: str,
) -> None:
    """Root on one GPU node holds its agent's token: with it, the agent's own node's
    GPUHealthy is writable, nothing else is: not another GPU node's, not a CPU node's,
    not its own node's other conditions or labels."""
    pod = await _agent_pod(api_client, namespace, NODE_A)
    core = client.CoreV1Api(api_client)
    async with _client_for(api_client, local_cluster, namespace, pod) as agent:
        review = await client.AuthenticationV1Api(agent).create_self_subject_review(
            client.V1SelfSubjectReview()
        )
        assert review.status.user_info.extra[NODE_NAME_CLAIM] == [NODE_A]
        agent_core = client.CoreV1Api(agent)

        async def refused_for_node_b() -> str | None:
            # An empty patch changes nothing, so probing while the API server loads
            # the policy is harmless to node B.
            try:
                await agent_core.patch_node_status(NODE_B, {"status": {}})
            except ApiException as err:
                return _refusal(err)
            return None

        message = await eventually(
            refused_for_node_b,
            timeout=30,
            what=f"the agent of {NODE_A} refused a patch of {NODE_B}'s status",
        )
        assert message.endswith(
            f"may patch the status of its own node only ({NODE_A}), not of node {NODE_B}"
        ), message

        healthy = Verdict("True", REASON_HEALTHY, "no GPU faults")
        written = await mark_gpu_health(agent, NODE_A, healthy)
        node_a = await core.read_node(NODE_A)
        assert [c.status for c in node_a.status.conditions if c.type == CONDITION_TYPE] == [
            written["status"]
        ]

        forged = Verdict("False", "XidCritical", "GPU 0: XID 79 [forged]")
        for other in (NODE_B, CPU_NODE):
            with pytest.raises(ApiException) as denied:
                await mark_gpu_health(agent, other, forged)
            assert f"its own node only ({NODE_A}), not of node {other}" in _refusal(denied.value)
            node = await core.read_node(other)
            assert all(c.type != CONDITION_TYPE for c in node.status.conditions)

        with pytest.raises(ApiException) as denied:
            await agent_core.patch_node_status(
                NODE_A,
                {"status": {"conditions": [{"type": "Ready", "status": "False"}]}},
            )
        assert f"only its own node conditions ({CONDITION_TYPE})" in _refusal(denied.value)
        with pytest.raises(ApiException) as denied:
            await agent_core.patch_node_status(NODE_A, {"metadata": {"labels": {"forged": "true"}}})
        assert "may not change node labels or annotations" in _refusal(denied.value)
        assert "forged" not in (await core.read_node(NODE_A)).metadata.labels


@pytest.mark.usefixtures("agent_rbac")
async def test_a_token_without_a_node_claim_patches_no_node(
    api_client: client.ApiClient,
    local_cluster: ClusterInfo,
    namespace: str,
) -> None:
    """A token of the agent's account not bound to a pod on a node names no node, so
    it may write no node's status at all."""
    async with _client_for(api_client, local_cluster, namespace, None) as unbound:
        agent_core = client.CoreV1Api(unbound)

        async def refused() -> str | None:
            try:
                await agent_core.patch_node_status(NODE_A, {"status": {}})
            except ApiException as err:
                return _refusal(err)
            return None

        message = await eventually(refused, timeout=30, what="an unbound token refused")
        assert "credential names no node" in message, message
        with pytest.raises(ApiException) as denied:
            await mark_gpu_health(unbound, NODE_A, Verdict("True", REASON_HEALTHY, "ok"))
        assert "credential names no node" in _refusal(denied.value)
