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
from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Rest
from tests.integration.harness import NAMESPACE, POLICY, Running, eventually, policy_state_is

pytestmark = pytest.mark.integration

CRD = by_kind("apiextensions.k8s.io/v1", "CustomResourceDefinition")
MONITOR = by_kind("monitoring.coreos.com/v1", "ServiceMonitor")
SERVICE = by_kind("v1", "Service")
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


RULE = by_kind("monitoring.coreos.com/v1", "PrometheusRule")
RULE_CRD_NAME = "prometheusrules.monitoring.coreos.com"


def _crd(plural: str, kind: str) -> dict[str, Any]:
    crd_doc = copy.deepcopy(SERVICE_MONITOR_CRD)
    crd_doc["metadata"]["name"] = f"{plural}.monitoring.coreos.com"
    crd_doc["spec"]["names"] = {
        "plural": plural,
        "singular": kind.lower(),
        "kind": kind,
        "listKind": f"{kind}List",
    }
    return crd_doc


def _exporter_policy(enabled: bool, interval: str) -> dict[str, Any]:
    policy = copy.deepcopy(crd.sample_policy())
    policy["spec"]["nodeStatusExporter"] = {"enabled": enabled}
    policy["spec"]["operator"]["metrics"] = {"serviceMonitor": {"interval": interval}}
    return policy


async def test_operator_and_node_status_exporter_monitors_and_rules_as_upstream(
    rest: Rest, api_client: client.ApiClient
) -> None:
    """Upstream creates the operator's and the node status exporter's ServiceMonitors
    whenever the CRD is served; we add the alert rules where PrometheusRule is served.
    A ServiceMonitor CRD alone brings no PrometheusRule; each goes with its operand."""
    await rest.apply(_exporter_policy(True, "30s"))
    try:
        async with Running(api_client) as run:
            assert await eventually(
                lambda: policy_state_is(rest, "ready"), timeout=120, what="policy ready"
            )
            await rest.apply(SERVICE_MONITOR_CRD)
            await eventually(
                lambda: rest.api_resource_exists("monitoring.coreos.com/v1", "servicemonitors"),
                what="ServiceMonitor API served",
            )
            await rest.apply(_exporter_policy(True, "31s"))  # discovery asked per generation

            async def monitors() -> set[str] | None:
                names = {m["metadata"]["name"] for m in await rest.list(MONITOR, NAMESPACE)}
                want = {"gpu-operator", "nvidia-node-status-exporter"}
                return names if want <= names else None

            await eventually(monitors, what="ServiceMonitors created")
            operator = await rest.get(MONITOR, "gpu-operator", NAMESPACE)
            assert operator is not None
            assert operator["spec"]["selector"] == {"matchLabels": {"app": "gpu-operator"}}
            assert operator["spec"]["endpoints"][0]["interval"] == "31s"
            service = await rest.get(SERVICE, "gpu-operator", NAMESPACE)
            assert service is not None
            assert service["metadata"]["labels"]["app"] == "gpu-operator"  # it selects
            await run.settle()
            assert "PrometheusRule" not in run.operator.owned
            assert not await rest.api_resource_exists("monitoring.coreos.com/v1", "prometheusrules")

            await rest.apply(_crd("prometheusrules", "PrometheusRule"))
            await eventually(
                lambda: rest.api_resource_exists("monitoring.coreos.com/v1", "prometheusrules"),
                what="PrometheusRule API served",
            )
            await rest.apply(_exporter_policy(True, "32s"))

            async def rules() -> set[str] | None:
                names = {r["metadata"]["name"] for r in await rest.list(RULE, NAMESPACE)}
                want = {"nvidia-gpu-operator-metrics", "nvidia-node-status-exporter-alerts"}
                return names if want <= names else None

            await eventually(rules, what="PrometheusRules created")
            node_rules = await rest.get(RULE, "nvidia-node-status-exporter-alerts", NAMESPACE)
            assert node_rules is not None
            alerts = {r["alert"] for g in node_rules["spec"]["groups"] for r in g["rules"]}
            assert "GPUOperatorNodeDeploymentFailed" in alerts

            # The exporter switched off: its ServiceMonitor and rules go, the operator's stay.
            await rest.apply(_exporter_policy(False, "32s"))

            async def exporter_pruned() -> bool:
                return (
                    await rest.get(MONITOR, "nvidia-node-status-exporter", NAMESPACE) is None
                    and await rest.get(RULE, "nvidia-node-status-exporter-alerts", NAMESPACE)
                    is None
                )

            await eventually(exporter_pruned, what="exporter's monitoring pruned")
            assert await rest.get(MONITOR, "gpu-operator", NAMESPACE) is not None
            assert await rest.get(RULE, "nvidia-gpu-operator-metrics", NAMESPACE) is not None
    finally:
        for existing in await rest.list(POLICY):
            await rest.delete(POLICY, existing["metadata"]["name"])
        await rest.delete(CRD, CRD_NAME)
        await rest.delete(CRD, RULE_CRD_NAME)

        async def gone() -> bool:
            return not await rest.api_group_exists("monitoring.coreos.com/v1")

        await eventually(gone, what="monitoring API gone")
