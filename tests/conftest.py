"""Shared fixtures: the real local control plane, started once per test session."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from kubernetes_asyncio import client

from gpuop.devcluster import ClusterInfo, LocalCluster
from gpuop.kube.client import api_client as make_api_client
from tests.integration.harness import cluster_dir

#: Simulated fleet for integration tests: enough GPU nodes to see ordering and
#: parallelism, a couple of CPU nodes that must stay untouched.
TEST_NODES = 6
TEST_GPU_NODES = 4


#: The API server records every request made with a ServiceAccount token (the
#: operator running as the chart's account in test_helm_install), so the chart's
#: RBAC can be checked against what a recorded run really used.
AUDIT_SERVICE_ACCOUNTS = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "Metadata", "userGroups": ["system:serviceaccounts"]},
        {"level": "None"},
    ],
}


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[ClusterInfo]:
    cluster = LocalCluster(cluster_dir(), audit_policy=AUDIT_SERVICE_ACCOUNTS)
    cluster.down()  # stale processes of a crashed earlier run, if any
    info = cluster.up(nodes=TEST_NODES, gpu_nodes=TEST_GPU_NODES, tie_to_parent=True)
    try:
        yield info
    finally:
        cluster.down()


@pytest.fixture(scope="session")
async def api_client(local_cluster: ClusterInfo) -> AsyncIterator[client.ApiClient]:
    async with make_api_client(local_cluster.kubeconfig, user_agent="gpuop-tests") as api:
        yield api
