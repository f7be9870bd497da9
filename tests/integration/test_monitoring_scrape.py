"""Every metric the shipped alert rules and Grafana dashboard query is in a live scrape
of the operator or of a node agent: the operator process on the local control plane,
rolling out a policy with the node status exporter on, and the node agent's exporter
serving one simulated GPU node (NVML faked: an Ampere GPU, which remaps rows, and a
Turing one, which retires pages; its device plugin GPUs read from the API server),
scraped again once its driver is gone (the families only a failure brings)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
from pathlib import Path

import aiohttp
import pytest
from kubernetes_asyncio import client

import crd
from gpuop.devcluster import ClusterInfo
from gpuop.devcluster.nvml_fake import A100_SXM4_80GB, TESLA_T4, FakeNvml, make_gpus
from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Rest
from gpuop.nodeagent.devices import DevicePluginDevices, nvidia_pci_devices
from gpuop.nodeagent.exporter import serve
from gpuop.nodeagent.kube import KubernetesApi
from gpuop.nodeagent.nvml import DriverNotLoaded
from gpuop.nodeagent.status import CHECK_NAMES, StatusFiles
from gpuop.nodeagent.xid import XidCounts, XidWatcher
from gpuop.operator.app import run_operator
from gpuop.operator.controller import OperatorConfig
from tests.integration.harness import NAMESPACE, POLICY, eventually, policy_state_is
from tests.integration.harness import free_port as _free_port
from tests.monitoring_queries import queried, served_in_text

pytestmark = pytest.mark.integration

NODE = "gpu-node-0000"


async def _scrape(port: int) -> str:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{port}/metrics") as resp,
    ):
        assert resp.status == 200
        return await resp.text()


async def _operator_scrape(local_cluster: ClusterInfo, rest: Rest) -> str:
    policy = copy.deepcopy(crd.sample_policy())
    policy["spec"]["nodeStatusExporter"] = {"enabled": True}
    await rest.apply(policy)
    port = _free_port()
    config = OperatorConfig(
        namespace=NAMESPACE, workers=2, metrics_host="127.0.0.1", metrics_port=port, probe_port=port
    )
    task = asyncio.create_task(run_operator(config, local_cluster.kubeconfig))
    try:
        await eventually(lambda: policy_state_is(rest, "ready"), timeout=120, what="policy ready")
        return await _scrape(port)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        for existing in await rest.list(POLICY):
            await rest.delete(POLICY, existing["metadata"]["name"])


async def _node_agent_scrapes(
    api_client: client.ApiClient, tmp_path: Path, gpus: int
) -> tuple[str, str]:
    """A scrape of a healthy node agent, and one after its driver went away."""
    nvml = FakeNvml(make_gpus(A100_SXM4_80GB, TESLA_T4))
    status = StatusFiles(tmp_path / "validations")
    for check in CHECK_NAMES:
        status.write(check, {})
    device = tmp_path / "sys" / "bus" / "pci" / "devices" / "0000:3b:00.0"
    device.mkdir(parents=True)
    (device / "vendor").write_text("0x10de\n")
    devices = DevicePluginDevices(KubernetesApi(api_client), NODE)
    watcher = XidWatcher(nvml, XidCounts(), poll_ms=10)
    port = _free_port()
    stop = asyncio.Event()
    task = asyncio.create_task(
        serve(
            nvml,
            NODE,
            status,
            stop,
            host="127.0.0.1",
            port=port,
            watcher=watcher,
            plugin_devices=devices,
            pci_devices=lambda: nvidia_pci_devices(tmp_path / "sys"),
            background=[devices.run],
        )
    )
    try:

        async def watching() -> bool:
            return watcher.watching

        await eventually(watching, what="XID watcher")
        nvml.inject_xid(0, 79)

        async def complete() -> str | None:
            with contextlib.suppress(aiohttp.ClientError):
                text = await _scrape(port)
                wanted = ("gpu_operator_node_device_plugin_devices_total{", "xid=")
                return text if all(w in text for w in wanted) else None
            return None

        text: str = await eventually(complete, what="node agent metrics")
        assert f'gpu_operator_node_device_plugin_devices_total{{node="{NODE}"}} {gpus}.0' in text
        assert f'gpu_operator_nvidia_pci_devices_total{{node="{NODE}"}} 1.0' in text
        assert "gpu_operator_node_gpu_retired_pages{" in text  # the Turing GPU's
        nvml.init_error = DriverNotLoaded("Driver Not Loaded")
        down = await _scrape(port)
        assert 'reason="driver_not_loaded"' in down
        return text, down
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def test_every_metric_the_rules_and_dashboard_query_is_served(
    local_cluster: ClusterInfo, rest: Rest, api_client: client.ApiClient, tmp_path: Path
) -> None:
    operator = served_in_text(await _operator_scrape(local_cluster, rest))
    node_obj = await rest.get(by_kind("v1", "Node"), NODE)
    assert node_obj is not None
    gpus = int(node_obj["status"]["capacity"]["nvidia.com/gpu"])
    healthy, down = await _node_agent_scrapes(api_client, tmp_path, gpus)
    node = served_in_text(healthy) | served_in_text(down)
    assert "gpu_operator_reconciliation_status" in operator
    missing = {
        what: sorted(used - operator - node)
        for what, used in queried().items()
        if used - operator - node
    }
    assert missing == {}
