"""The shipped alert rules in a real Prometheus (built from the Go module proxy at
promtool's release, `ensure_prometheus`) scraping a real operator and a node agent on
the local control plane, read back through Prometheus's HTTP API (`/api/v1/alerts`):

- the operator killed -> GPUOperatorDown (the chart's rule) fires, and resolves once
  it is back;
- a node whose driver upgrade fails -> exactly one upgrade alert, resolved when the
  node recovers;
- a simulated XID 79 on a faked GPU -> GPUOperatorGPULost (one alert, also once NVML
  says the GPU is lost), resolved once it is reset and its node agent restarted.

The rules are what ships: the operator's PrometheusRules rendered by the components
(the node status exporter's included) and the chart's gpu-operator-down rendered by
`helm template`. Only their `for:` durations are scaled down (1/100, at least 1s) and
Prometheus evaluates every second; the expressions are unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import re
import subprocess
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

import crd
from components import COMPONENTS, RenderContext
from gpuop.devcluster import NFD_GPU_LABEL, ClusterInfo
from gpuop.devcluster._build import ensure_prometheus
from gpuop.devcluster.nvml_fake import A100_SXM4_80GB, FakeNvml, make_gpus
from gpuop.kube.rest import Rest
from gpuop.nodeagent.exporter import serve
from gpuop.nodeagent.status import CHECK_NAMES, StatusFiles
from gpuop.nodeagent.xid import XidCounts, XidWatcher
from tests.integration.harness import NAMESPACE, NODE, POLICY, eventually, policy_state_is
from tests.integration.helm_chart import documents, one, template
from tests.integration.test_chaos import OperatorProcess, _free_port

pytestmark = pytest.mark.integration

OPERATOR_JOB = "gpu-operator"
NODE_JOB = "nvidia-node-status-exporter"
AGENT_NODE = "gpu-node-0000"
UPGRADE_ALERTS = {
    "GPUOperatorDriverAutoUpgradeFailures",
    "GPUOperatorDriverUpgradeHalted",
    "GPUOperatorNodeUpgradeFailed",  # merged away: must never come back
}
_DURATION = re.compile(r"(\d+)([smh])")
_SECONDS = {"s": 1, "m": 60, "h": 3600}


def _scaled(duration: str) -> str:
    seconds = sum(int(n) * _SECONDS[u] for n, u in _DURATION.findall(duration))
    return f"{max(1, seconds // 100)}s"


def shipped_rule_groups() -> list[dict[str, Any]]:
    """Every rule group as it reaches a Prometheus: the operator's PrometheusRules (its
    own and the node status exporter's) and the chart's gpu-operator-down."""
    spec = crd.default_policy().spec.model_copy(
        update={"node_status_exporter": crd.NodeStatusExporterSpec(enabled=True)}
    )
    ctx = RenderContext(namespace=NAMESPACE, operator_image="x")
    groups = [
        group
        for component in COMPONENTS
        for obj in component.objects(spec, ctx)
        if obj["kind"] == "PrometheusRule"
        for group in obj["spec"]["groups"]
    ]
    chart = documents(template("--api-versions", "monitoring.coreos.com/v1/PrometheusRule"))
    groups += one(chart, "PrometheusRule", "gpu-operator-down")["spec"]["groups"]
    return groups


def _test_rules(groups: list[dict[str, Any]]) -> dict[str, Any]:
    fast = copy.deepcopy(groups)
    for group in fast:
        group["interval"] = "1s"
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = _scaled(rule["for"])
    return {"groups": fast}


@dataclass
class PrometheusServer:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    async def alerts(self) -> list[dict[str, Any]]:
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"{self.url}/api/v1/alerts") as resp,
        ):
            assert resp.status == 200, await resp.text()
            body = await resp.json()
        assert body["status"] == "success", body
        found: list[dict[str, Any]] = body["data"]["alerts"]
        return found

    async def firing(self, name: str) -> list[dict[str, Any]]:
        return [
            a
            for a in await self.alerts()
            if a["labels"]["alertname"] == name and a["state"] == "firing"
        ]

    async def gone(self, name: str) -> bool:
        return not [a for a in await self.alerts() if a["labels"]["alertname"] == name]

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-20:])


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return int(resp.status) == 200
    except OSError:
        return False


@dataclass(frozen=True)
class Ports:
    operator_metrics: int
    operator_probes: int
    node_agent: int


@pytest.fixture(scope="module")
def ports() -> Ports:
    return Ports(_free_port(), _free_port(), _free_port())


@pytest.fixture(scope="module")
def prometheus(
    tmp_path_factory: pytest.TempPathFactory, ports: Ports
) -> Iterator[PrometheusServer]:
    binary = ensure_prometheus()
    folder = tmp_path_factory.mktemp("prometheus")
    rules = folder / "rules.yaml"
    rules.write_text(yaml.safe_dump(_test_rules(shipped_rule_groups())))
    web = _free_port()
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [
            {
                "job_name": OPERATOR_JOB,
                "static_configs": [{"targets": [f"127.0.0.1:{ports.operator_metrics}"]}],
            },
            {
                "job_name": NODE_JOB,
                "static_configs": [{"targets": [f"127.0.0.1:{ports.node_agent}"]}],
            },
        ],
    }
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    log = folder / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                str(binary),
                f"--config.file={folder / 'prometheus.yml'}",
                f"--storage.tsdb.path={folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{web}",
                "--log.level=warn",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=folder,
        )
    server = PrometheusServer(f"http://127.0.0.1:{web}", proc, log)
    deadline = time.monotonic() + 60
    while not _ready(f"{server.url}/-/ready"):
        assert proc.poll() is None, server.tail()
        assert time.monotonic() < deadline, f"Prometheus not ready in 60s\n{server.tail()}"
        time.sleep(0.2)
    try:
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class ScrapedOperator(OperatorProcess):
    """`gpuop run` as a process serving /metrics where Prometheus scrapes it."""

    async def serving(self) -> bool:
        with contextlib.suppress(aiohttp.ClientError):
            async with (
                aiohttp.ClientSession() as http,
                http.get(f"http://127.0.0.1:{self.metrics_port}/metrics") as resp,
            ):
                return resp.status == 200
        return False


@pytest.fixture
def operator(local_cluster: ClusterInfo, ports: Ports, tmp_path: Path) -> Iterator[ScrapedOperator]:
    process = ScrapedOperator(
        local_cluster.kubeconfig,
        tmp_path,
        namespace=NAMESPACE,
        workers=2,
        metrics_port=ports.operator_metrics,
        probe_port=ports.operator_probes,
    )
    try:
        yield process
    finally:
        process.stop()


class NodeAgent:
    """The node agent's exporter for one node with one faked A100, in this process."""

    def __init__(self, folder: Path, port: int) -> None:
        self.nvml = FakeNvml(make_gpus(A100_SXM4_80GB))
        self.status = StatusFiles(folder / "validations")
        for check in CHECK_NAMES:
            self.status.write(check, {})
        self.port = port
        self.stop_event = asyncio.Event()
        self.watcher = XidWatcher(self.nvml, XidCounts(), poll_ms=10)
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Serve (again, as after a reboot: XID counts start from nothing)."""
        self.stop_event = asyncio.Event()
        self.watcher = XidWatcher(self.nvml, XidCounts(), poll_ms=10)
        self.task = asyncio.create_task(
            serve(
                self.nvml,
                AGENT_NODE,
                self.status,
                self.stop_event,
                host="127.0.0.1",
                port=self.port,
                watcher=self.watcher,
                pci_devices=lambda: 1,
            )
        )

        async def watching() -> bool:
            return self.watcher.watching

        await eventually(watching, what="XID watcher")

    async def stop(self) -> None:
        self.stop_event.set()
        if self.task is not None:
            await asyncio.wait_for(self.task, 10)


@pytest.fixture
async def node_agent(tmp_path: Path, ports: Ports) -> AsyncIterator[NodeAgent]:
    agent = NodeAgent(tmp_path, ports.node_agent)
    await agent.start()
    try:
        yield agent
    finally:
        await agent.stop()


async def test_a_simulated_xid_79_fires_gpu_lost_once_and_it_resolves(
    prometheus: PrometheusServer, node_agent: NodeAgent
) -> None:
    async def lost() -> list[dict[str, Any]]:
        return await prometheus.firing("GPUOperatorGPULost")

    node_agent.nvml.inject_xid(0, 79)  # the driver's report; NVML still answers
    (alert,) = await eventually(lost, timeout=60, what="GPUOperatorGPULost firing")
    assert alert["labels"]["node"] == AGENT_NODE
    assert alert["labels"]["gpu"] == "0"
    assert alert["labels"]["severity"] == "critical"
    assert alert["annotations"]["runbook_url"].endswith("docs/runbooks.md#gpuoperatorgpulost")
    # The GPU then falls off the bus (NVML: lost): still one alert for it, not two.
    node_agent.nvml.lose_gpu(0)

    async def reported_lost() -> bool:
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{node_agent.port}/metrics") as resp,
        ):
            text = await resp.text()
        return re.search(r'gpu_operator_node_gpu_up\{[^}]*gpu="0"[^}]*\} 0\.0', text) is not None

    await eventually(reported_lost, what="gpu_up 0 served")
    await asyncio.sleep(3)  # a few evaluations with both arms true
    assert len(await lost()) == 1
    assert await prometheus.gone("GPUOperatorGPUUncorrectableECCErrors")
    # Reset (the fake heals) and the node agent restarted, as a reboot does.
    node_agent.nvml.heal(0)
    await node_agent.stop()
    await node_agent.start()

    async def resolved() -> bool:
        return await prometheus.gone("GPUOperatorGPULost")

    await eventually(resolved, timeout=60, what="GPUOperatorGPULost resolved")
    await asyncio.sleep(3)  # resolved for good, the agent serving the healthy GPU
    assert await prometheus.gone("GPUOperatorGPULost")


async def test_the_operator_killed_fires_the_absent_rule_and_it_resolves(
    prometheus: PrometheusServer, operator: ScrapedOperator, rest: Rest
) -> None:
    operator.start()
    await eventually(operator.serving, timeout=60, what="operator serving /metrics")

    async def down() -> list[dict[str, Any]]:
        return await prometheus.firing("GPUOperatorDown")

    async def gone() -> bool:
        return await prometheus.gone("GPUOperatorDown")

    await eventually(gone, timeout=60, what="GPUOperatorDown silent while scraped")
    operator.kill()
    (alert,) = await eventually(down, timeout=60, what="GPUOperatorDown firing")
    assert alert["labels"]["severity"] == "critical"
    assert alert["annotations"]["runbook_url"].endswith("docs/runbooks.md#gpuoperatordown")
    operator.start()
    await eventually(gone, timeout=90, what="GPUOperatorDown resolved")
    assert await operator.serving()


async def _gpu_nodes(rest: Rest) -> list[str]:
    return sorted(
        n["metadata"]["name"]
        for n in await rest.list(NODE)
        if (n["metadata"].get("labels") or {}).get(NFD_GPU_LABEL) == "true"
    )


def _upgrade_policy(version: str, nodes: int) -> dict[str, Any]:
    """Every GPU node upgrades at once, without draining; a new driver pod not Ready
    within 5s fails its node (the startup probe's budget)."""
    policy = copy.deepcopy(crd.sample_policy())
    driver = policy["spec"].setdefault("driver", {})
    driver["version"] = version
    driver["startupProbe"] = {"initialDelaySeconds": 0, "periodSeconds": 1, "failureThreshold": 5}
    driver["upgradePolicy"] = {
        "autoUpgrade": True,
        "maxParallelUpgrades": nodes,
        "maxUnavailable": "100%",
        "drain": {"enable": False},
        "podDeletion": {"timeoutSeconds": 30},
    }
    return policy


async def test_a_failed_driver_upgrade_fires_exactly_one_upgrade_alert(
    prometheus: PrometheusServer, operator: ScrapedOperator, rest: Rest
) -> None:
    gpu = await _gpu_nodes(rest)
    failing = gpu[0]
    blocked = {"key": "gpuop.io/test-no-new-pods", "value": "x", "effect": "NoSchedule"}
    node = await rest.get(NODE, failing)
    assert node is not None
    taints_before = node["spec"].get("taints") or []
    await rest.apply(_upgrade_policy("595.91.07", len(gpu)))
    operator.start()
    try:
        await eventually(lambda: policy_state_is(rest, "ready"), timeout=150, what="ready")
        # A taint the new driver pod does not tolerate: it is never created, so the
        # node fails its upgrade (as in test_upgrade_ops); the others upgrade.
        await rest.merge_patch(NODE, failing, {"spec": {"taints": [*taints_before, blocked]}})
        await rest.apply(_upgrade_policy("600.10.01", len(gpu)))

        async def upgrade_alerts() -> list[dict[str, Any]]:
            return [
                a for a in await prometheus.alerts() if a["labels"]["alertname"] in UPGRADE_ALERTS
            ]

        async def one_firing() -> list[dict[str, Any]]:
            alerts = await upgrade_alerts()
            return alerts if any(a["state"] == "firing" for a in alerts) else []

        alerts = await eventually(one_firing, timeout=120, what="an upgrade alert firing")
        await asyncio.sleep(5)  # more evaluations: no second alert joins it
        alerts = await upgrade_alerts()
        assert [a["labels"]["alertname"] for a in alerts] == [
            "GPUOperatorDriverAutoUpgradeFailures"
        ], alerts
        assert alerts[0]["state"] == "firing"
        assert alerts[0]["annotations"]["summary"] == "Driver upgrade failed on 1 node(s)"
        node = await rest.get(NODE, failing)
        assert node is not None
        assert node["metadata"]["labels"]["nvidia.com/gpu-driver-upgrade-state"] == (
            "upgrade-failed"
        )

        # The cause goes: the new driver pod starts, the node recovers, the alert resolves.
        await rest.merge_patch(NODE, failing, {"spec": {"taints": taints_before or None}})

        async def resolved() -> bool:
            return not await upgrade_alerts()

        await eventually(resolved, timeout=120, what="the upgrade alert resolved")
    finally:
        await rest.merge_patch(NODE, failing, {"spec": {"taints": taints_before or None}})
        operator.stop()
        with contextlib.suppress(Exception):
            await rest.delete(POLICY, "cluster-policy")
