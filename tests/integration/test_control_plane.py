"""The local control plane is a real Kubernetes: RBAC, controllers, scheduling,
eviction with PodDisruptionBudgets and watch expiry all behave as in a cluster."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from gpuop.devcluster import NFD_GPU_LABEL, ClusterInfo
from tests.conftest import TEST_GPU_NODES, TEST_NODES
from tests.integration.harness import eventually

pytestmark = pytest.mark.integration


async def test_version_reports_the_built_release(api_client: client.ApiClient) -> None:
    info = await client.VersionApi(api_client).get_code()
    assert info.git_version.startswith("v1.34."), info.git_version
    assert info.minor == "34"


async def test_simulated_nodes_are_ready_with_gpu_capacity(api_client: client.ApiClient) -> None:
    nodes = (await client.CoreV1Api(api_client).list_node()).items
    assert len(nodes) == TEST_NODES
    ready = [
        n
        for n in nodes
        if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions)
    ]
    assert len(ready) == TEST_NODES
    gpu = [n for n in nodes if n.metadata.labels.get(NFD_GPU_LABEL) == "true"]
    assert len(gpu) == TEST_GPU_NODES
    for node in gpu:
        assert int(node.status.allocatable["nvidia.com/gpu"]) > 0
        assert not node.spec.taints or all(t.effect != "NoSchedule" for t in node.spec.taints)


async def test_rbac_denies_an_unprivileged_service_account(
    api_client: client.ApiClient, local_cluster: ClusterInfo, namespace: str
) -> None:
    core = client.CoreV1Api(api_client)
    await core.create_namespaced_service_account(
        namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="nobody"))
    )
    token = await core.create_namespaced_service_account_token(
        "nobody", namespace, client.AuthenticationV1TokenRequest(spec={"audiences": []})
    )
    config = client.Configuration()
    config.host = local_cluster.server
    config.ssl_ca_cert = str(local_cluster.directory / "pki" / "ca.crt")
    config.api_key = {"BearerToken": token.status.token}
    config.api_key_prefix = {"BearerToken": "Bearer"}
    async with client.ApiClient(config) as sa_api:
        with pytest.raises(ApiException) as denied:
            await client.CoreV1Api(sa_api).list_namespaced_pod("kube-system")
        assert denied.value.status == 403
        assert f"system:serviceaccount:{namespace}:nobody" in denied.value.body
        # Authenticated, not anonymous: self-review works for every account.
        review = await client.AuthenticationV1Api(sa_api).create_self_subject_review(
            client.V1SelfSubjectReview()
        )
        assert review.status.user_info.username == f"system:serviceaccount:{namespace}:nobody"


async def test_daemonset_runs_pods_on_exactly_the_matching_nodes(
    api_client: client.ApiClient, namespace: str
) -> None:
    apps = client.AppsV1Api(api_client)
    core = client.CoreV1Api(api_client)
    labels = {"app": "probe"}
    await apps.create_namespaced_daemon_set(
        namespace,
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "probe"},
            "spec": {
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "nodeSelector": {NFD_GPU_LABEL: "true"},
                        "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
                    },
                },
            },
        },
    )
    gpu_nodes = {
        n.metadata.name
        for n in (await core.list_node(label_selector=f"{NFD_GPU_LABEL}=true")).items
    }

    async def running_pods() -> set[str] | None:
        pods = (await core.list_namespaced_pod(namespace, label_selector="app=probe")).items
        running = {
            p.spec.node_name
            for p in pods
            if p.status.phase == "Running"
            and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
        }
        return running if running == gpu_nodes and len(pods) == len(gpu_nodes) else None

    assert await eventually(running_pods) == gpu_nodes

    async def ds_ready() -> bool:
        ds = await apps.read_namespaced_daemon_set_status("probe", namespace)
        return (
            ds.status.desired_number_scheduled == TEST_GPU_NODES
            and ds.status.number_ready == TEST_GPU_NODES
        )

    assert await eventually(ds_ready)


async def test_pod_disruption_budget_blocks_eviction_with_429(
    api_client: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(api_client)
    policy = client.PolicyV1Api(api_client)
    labels = {"app": "guarded"}
    await core.create_namespaced_pod(
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "guarded", "labels": labels},
            "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
        },
    )
    await policy.create_namespaced_pod_disruption_budget(
        namespace,
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "guard"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": labels}},
        },
    )

    async def pdb_observed() -> bool:
        pdb = await policy.read_namespaced_pod_disruption_budget_status("guard", namespace)
        return bool(pdb.status and pdb.status.current_healthy == 1)

    await eventually(pdb_observed)
    eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name="guarded", namespace=namespace))
    with pytest.raises(ApiException) as blocked:
        await core.create_namespaced_pod_eviction("guarded", namespace, eviction)
    assert blocked.value.status == 429
    assert "disruption budget" in blocked.value.body.lower()

    # Without the budget the same eviction goes through.
    await policy.delete_namespaced_pod_disruption_budget("guard", namespace)
    await core.create_namespaced_pod_eviction("guarded", namespace, eviction)

    async def gone() -> bool:
        try:
            pod = await core.read_namespaced_pod("guarded", namespace)
        except ApiException as err:
            return err.status == 404
        return pod.metadata.deletion_timestamp is not None

    assert await eventually(gone)


async def _compact_etcd(etcd_port: int) -> int:
    """Compact etcd's history up to now, as the API server does every few minutes."""
    base = f"http://127.0.0.1:{etcd_port}/v3/kv"
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{base}/range", json={"key": "AA=="}) as resp:
            revision = int((await resp.json())["header"]["revision"])
        async with http.post(
            f"{base}/compaction", json={"revision": revision, "physical": True}
        ) as resp:
            assert resp.status == 200, await resp.text()
    return revision


async def test_watch_from_an_expired_resource_version_gets_410(
    api_client: client.ApiClient, local_cluster: ClusterInfo, namespace: str
) -> None:
    core = client.CoreV1Api(api_client)

    def template(name: str) -> dict[str, Any]:
        return {
            "metadata": {"name": name},
            "template": {"spec": {"containers": [{"name": "c", "image": "pause"}]}},
        }

    first = await core.create_namespaced_pod_template(namespace, template("before"))
    old_rv = first.metadata.resource_version
    for i in range(3):
        await core.create_namespaced_pod_template(namespace, template(f"after-{i}"))

    async def watch_from(resource_version: str) -> list[str]:
        seen: list[str] = []
        async with watch.Watch() as w:
            stream = w.stream(
                core.list_namespaced_pod_template,
                namespace,
                resource_version=resource_version,
                timeout_seconds=3,
            )
            async for event in stream:
                seen.append(event["object"].metadata.name)
        return seen

    # Before compaction, watching from that version replays what followed it.
    assert await watch_from(old_rv) == ["after-0", "after-1", "after-2"]

    compacted = await _compact_etcd(local_cluster.ports["etcd"])
    assert compacted > int(old_rv)

    # After it, that history is gone: the API server answers 410 and the
    # client must relist.
    with pytest.raises(ApiException) as expired:
        await watch_from(old_rv)
    assert expired.value.status == 410

    # Relisting gives a current version from which watching works again.
    fresh = await core.list_namespaced_pod_template(namespace)
    assert await watch_from(fresh.metadata.resource_version) == []
