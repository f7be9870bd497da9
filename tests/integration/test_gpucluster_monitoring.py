"""A GPUCluster's DCGM exporter ServiceMonitor and its UnsupportedFields condition on the
real control plane: with the Prometheus Operator's ServiceMonitor kind served, the
exporter's `nvidia-dcgm-exporter-dra` ServiceMonitor is created as upstream's DRA state
creates it and pruned once switched off; a field gpuop does not act on is named in the
GPUCluster's UnsupportedFields condition, as the other two kinds name theirs."""

from __future__ import annotations

import contextlib
import copy
from typing import Any

import pytest
from kubernetes_asyncio import client

import crd
from gpuop.devcluster._cluster import publish_dra
from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Rest
from tests.integration.harness import NAMESPACE, Running, eventually
from tests.integration.test_gpucluster import GC, _condition, _delete_policies, _gone, _sample
from tests.integration.test_service_monitor import CRD, CRD_NAME, MONITOR, SERVICE_MONITOR_CRD

pytestmark = pytest.mark.integration

EXPORTER = "nvidia-dcgm-exporter-dra"


def _cluster(monitor: bool) -> dict[str, Any]:
    document = copy.deepcopy(_sample())
    # Upstream's DRA manifests never read it: no effect, and said so.
    document["spec"]["daemonsets"]["updateStrategy"] = "OnDelete"
    exporter = document["spec"]["dcgmExporter"]
    exporter["serviceMonitor"] = {
        "enabled": monitor,
        "interval": "15s",
        "additionalLabels": {"release": "kube-prometheus-stack"},
    }
    return document


async def test_exporter_service_monitor_and_unsupported_fields(
    rest: Rest, api_client: client.ApiClient
) -> None:
    await _delete_policies(rest)
    await rest.apply(SERVICE_MONITOR_CRD)
    await eventually(
        lambda: rest.api_resource_exists("monitoring.coreos.com/v1", "servicemonitors"),
        what="ServiceMonitor API served",
    )
    try:
        async with Running(api_client):
            await rest.apply(_cluster(monitor=True))

            async def monitor() -> dict[str, Any] | None:
                return await rest.get(MONITOR, EXPORTER, NAMESPACE)

            created = await eventually(monitor, timeout=90, what="the exporter's ServiceMonitor")
            assert created["metadata"]["labels"]["release"] == "kube-prometheus-stack"
            assert created["spec"]["selector"] == {"matchLabels": {"app": EXPORTER}}
            assert created["spec"]["endpoints"][0]["interval"] == "15s"

            async def named() -> bool:
                found = await _condition(rest, GC, crd.GC_NAME, crd.CONDITION_UNSUPPORTED_FIELDS)
                return "spec.daemonsets.updateStrategy" in found.get("message", "")

            assert await eventually(named, timeout=60, what="the UnsupportedFields condition")
            exporter = await rest.get(by_kind("apps/v1", "DaemonSet"), EXPORTER, NAMESPACE)
            assert exporter is not None
            assert exporter["spec"]["updateStrategy"]["type"] == "RollingUpdate"

            await rest.apply(_cluster(monitor=False))

            async def pruned() -> bool:
                return await monitor() is None

            assert await eventually(pruned, timeout=60, what="the ServiceMonitor pruned")
            await rest.delete(GC, crd.GC_NAME)
            assert await eventually(
                lambda: _gone(rest, GC, crd.GC_NAME), timeout=120, what="the GPUCluster gone"
            )
    finally:
        with contextlib.suppress(Exception):
            await rest.delete(GC, crd.GC_NAME)
        await rest.delete(CRD, CRD_NAME)
        await publish_dra(api_client)  # the simulator's DeviceClass went with ours
