"""The DCGM exporter's ServiceMonitor is an owned kind like the others, watched only where
the Prometheus operator's CRD is served: never listed while it is absent, re-created
after a deletion, pruned once the policy switches it off."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from kubernetes_asyncio import client

import crd
from components import dcgm_exporter
from gpuop.rest import Rest, by_kind
from tests.integration.harness import NAMESPACE, POLICY, Running, eventually, policy_state_is

pytestmark = pytest.mark.integration

CRD = by_kind("apiextensions.k8s.io/v1", "CustomResourceDefinition")
MONITOR = by_kind("monitoring.coreos.com/v1", "ServiceMonitor")
CRD_NAME = "servicemonitors.monitoring.coreos.com"

#: Enough of the Prometheus operator's CRD for the API server to serve the kind.
SERVICE_MONITOR_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": CRD_NAME},
    "spec": {
        "group": "monitoring.coreos.com",
        "scope": "Namespaced",
        "names": {
            "plural": "servicemonitors",
            "singular": "servicemonitor",
            "kind": "ServiceMonitor",
            "listKind": "ServiceMonitorList",
        },
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
            }
        ],
    },
}


def _policy(interval: str, enabled: bool = True) -> dict[str, Any]:
    policy = copy.deepcopy(crd.sample_policy())
    policy["spec"]["dcgmExporter"]["serviceMonitor"] = {"enabled": enabled, "interval": interval}
    return policy


async def _monitor(rest: Rest) -> dict[str, Any] | None:
    return await rest.get(MONITOR, dcgm_exporter.SERVICE_NAME, NAMESPACE)


def _monitor_requests(rest: Rest) -> dict[tuple[str, str], int]:
    return {k: v for k, v in rest.counts.items() if k[1] == "servicemonitors"}


async def test_service_monitor_is_watched_once_served_recreated_and_pruned(
    rest: Rest, api_client: client.ApiClient
) -> None:
    assert not await rest.api_group_exists("monitoring.coreos.com/v1")
    await rest.apply(_policy("15s"))
    try:
        async with Running(api_client) as run:
            assert await eventually(
                lambda: policy_state_is(rest, "ready"), timeout=120, what="policy ready"
            )
            await run.settle()
            # Asked for, but the API is not served: nothing rendered, nothing listed.
            assert "ServiceMonitor" not in run.operator.owned
            assert _monitor_requests(run.rest) == {}

            await rest.apply(SERVICE_MONITOR_CRD)

            async def served() -> bool:
                return await rest.api_group_exists("monitoring.coreos.com/v1")

            await eventually(served, timeout=60, what="ServiceMonitor API served")
            # Discovery is asked once per policy generation: an edit brings it in.
            await rest.apply(_policy("30s"))
            first = await eventually(lambda: _monitor(rest), what="ServiceMonitor created")
            assert first["spec"]["endpoints"][0]["interval"] == "30s"

            async def watched() -> bool:
                return "ServiceMonitor" in run.operator.owned

            await eventually(watched, what="ServiceMonitor watched")

            # Deleted behind the operator's back: its watch brings it back.
            await rest.delete(MONITOR, dcgm_exporter.SERVICE_NAME, NAMESPACE)

            async def recreated() -> bool:
                got = await _monitor(rest)
                return got is not None and got["metadata"]["uid"] != first["metadata"]["uid"]

            await eventually(recreated, what="ServiceMonitor re-created")

            # Switched off in the policy: pruned, like any other operand object.
            await rest.apply(_policy("30s", enabled=False))

            async def pruned() -> bool:
                return await _monitor(rest) is None

            await eventually(pruned, what="ServiceMonitor pruned")
            await run.settle()
            writes = run.rest.writes
            run.operator.queue.add("cluster")
            await run.settle()
            assert run.rest.writes == writes, run.rest.write_counts()
    finally:
        await rest.delete(CRD, CRD_NAME)
        for existing in await rest.list(POLICY):
            await rest.delete(POLICY, existing["metadata"]["name"])
