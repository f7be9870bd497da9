"""Render the README's dashboard picture (docs/dashboard.png) from a real local run.

    python -m tests.monitoring_picture [--out docs/dashboard.png] [--gpu-nodes 8]

needs matplotlib (``pip install -e '.[docs]'``). It starts its own local control plane,
the operator and one node agent exporter per GPU node (NVML faked, everything else
real: the exporters read the API server and report GPUHealthy), then plays a short
day: the policy rolls out, a driver upgrade goes node by node, GPUs fail (an XID 79 on
one node, uncorrectable ECC errors on three more, which trips the remediation circuit
breaker) and the ECC faults clear again. Every ``--every`` seconds it scrapes every
``/metrics``; each dashboard panel's queries are then evaluated over that series (the
PromQL forms the dashboard uses: ``max``/``sum [by (..)]`` of a metric, ``rate`` or
``increase`` of a counter, ``time() - x`` and ``a / b``) and drawn where the dashboard
places the panel.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import json
import re
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

import crd
from gpuop.app import run_operator
from gpuop.cluster import LocalCluster
from gpuop.controller import OperatorConfig
from gpuop.install import ensure_namespace, install_crd
from gpuop.kinds import KINDS, by_kind
from gpuop.kube import api_client as make_api_client
from gpuop.nodeagent.devices import DevicePluginDevices
from gpuop.nodeagent.exporter import serve
from gpuop.nodeagent.health import HealthReporter, KubernetesNodeStatus
from gpuop.nodeagent.kube import KubernetesApi
from gpuop.nodeagent.status import CHECK_NAMES, StatusFiles
from gpuop.nodeagent.xid import XidCounts, XidWatcher
from gpuop.nvml.fake import A100_SXM4_80GB, FakeNvml, make_gpus
from gpuop.rest import Rest
from tests.monitoring_queries import dashboard

POLICY = by_kind("nvidia.com/v1", "ClusterPolicy")
Labels = frozenset[tuple[str, str]]
Sample = dict[tuple[str, Labels], float]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# ----------------------------------------------------------------- the run


@dataclass
class Node:
    name: str
    nvml: FakeNvml
    port: int


@dataclass
class Recording:
    """Scrapes over time: (seconds since start, every sample of every target)."""

    start: float = field(default_factory=time.time)
    scrapes: list[tuple[float, Sample]] = field(default_factory=list)
    marks: list[tuple[float, str]] = field(default_factory=list)

    def mark(self, what: str) -> None:
        self.marks.append((time.time() - self.start, what))
        print(f"{time.time() - self.start:6.1f}s  {what}", flush=True)


async def _scrape(http: aiohttp.ClientSession, port: int, target: str) -> Sample:
    async with http.get(f"http://127.0.0.1:{port}/metrics") as resp:
        text = await resp.text()
    out: Sample = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset({**s.labels, "target": target}.items()))] = s.value
    return out


async def _sampler(rec: Recording, ports: dict[str, int], every: float) -> None:
    async with aiohttp.ClientSession() as http:
        while True:
            sample: Sample = {}
            for target, port in ports.items():
                with contextlib.suppress(aiohttp.ClientError):
                    sample.update(await _scrape(http, port, target))
            rec.scrapes.append((time.time() - rec.start, sample))
            await asyncio.sleep(every)


def _policy(version: str) -> dict[str, Any]:
    policy = copy.deepcopy(crd.sample_policy())
    spec = policy["spec"]
    spec["nodeStatusExporter"] = {"enabled": True}
    spec["driver"]["version"] = version
    spec["driver"]["upgradePolicy"] = {
        "autoUpgrade": True,
        "maxParallelUpgrades": 2,
        "maxUnavailable": "25%",
        "drain": {"enable": True, "timeoutSeconds": 60},
    }
    spec["healthRemediation"] = {
        "enabled": True,
        "action": "taint",
        "maxUnhealthy": "25%",
        "settleSeconds": 20,
    }
    return policy


async def _gpu_nodes(rest: Rest) -> list[str]:
    nodes = await rest.list(by_kind("v1", "Node"))
    return sorted(
        n["metadata"]["name"]
        for n in nodes
        if "nvidia.com/gpu" in ((n.get("status") or {}).get("capacity") or {})
    )


async def _upgrades_done(rest: Rest, names: list[str]) -> bool:
    nodes = {n["metadata"]["name"]: n for n in await rest.list(by_kind("v1", "Node"))}
    state = "nvidia.com/gpu-driver-upgrade-state"
    return all(
        (nodes[n]["metadata"].get("labels") or {}).get(state) == "upgrade-done" for n in names
    )


async def _not(check: Any) -> bool:
    return not await check


async def _until(check: Callable[[], Any], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(1)


async def record(kubeconfig: Path, tmp: Path, every: float) -> Recording:
    rec = Recording()
    async with make_api_client(kubeconfig, user_agent="gpuop-picture") as api:
        rest = Rest(api, KINDS)
        await install_crd(rest)
        await ensure_namespace(rest, "gpu-operator")
        names = await _gpu_nodes(rest)
        nodes = [Node(n, FakeNvml(make_gpus(A100_SXM4_80GB, A100_SXM4_80GB)), 0) for n in names]
        stop = asyncio.Event()
        tasks = []
        for node in nodes:
            node.port = _free_port()
            status = StatusFiles(tmp / node.name)
            for check in CHECK_NAMES:
                status.write(check, {})
            reporter = HealthReporter(
                node.nvml, KubernetesNodeStatus(api), node.name, XidCounts(), interval_s=2
            )
            wake = reporter.wake.set
            watcher = XidWatcher(node.nvml, reporter.xids, on_event=lambda _, w=wake: w())
            devices = DevicePluginDevices(KubernetesApi(api), node.name, interval_s=5)
            tasks.append(
                asyncio.create_task(
                    serve(
                        node.nvml,
                        node.name,
                        status,
                        stop,
                        host="127.0.0.1",
                        port=node.port,
                        watcher=watcher,
                        plugin_devices=devices,
                        pci_devices=lambda: 2,  # the two fake GPUs
                        background=[reporter.run, devices.run],
                    )
                )
            )
        op_port = _free_port()
        config = OperatorConfig(
            namespace="gpu-operator",
            metrics_host="127.0.0.1",
            metrics_port=op_port,
            probe_port=op_port,
        )
        operator = asyncio.create_task(run_operator(config, kubeconfig))
        ports = {"operator": op_port, **{n.name: n.port for n in nodes}}
        sampler = asyncio.create_task(_sampler(rec, ports, every))
        try:
            await asyncio.sleep(10)
            rec.mark("ClusterPolicy applied")
            await rest.apply(_policy("580.95.05"))
            await _until(lambda: _ready(rest), 180)
            rec.mark("ready")
            await asyncio.sleep(20)
            rec.mark("driver 580.95.05 -> 595.91.07")
            await rest.apply(_policy("595.91.07"))
            # Every node starts in upgrade-done: first see the upgrade begin.
            await _until(lambda: _not(_upgrades_done(rest, names)), 60)
            await _until(lambda: _upgrades_done(rest, names), 300)
            rec.mark("upgrade done")
            await asyncio.sleep(15)
            rec.mark(f"XID 79 on {nodes[0].name}")
            nodes[0].nvml.inject_xid(1, 79)
            await asyncio.sleep(20)
            rec.mark("uncorrectable ECC on three more nodes")
            for node in nodes[1:4]:
                node.nvml.inject_ecc_uncorrectable(0, 2)
            await asyncio.sleep(45)
            rec.mark("ECC faults cleared")
            for node in nodes[1:4]:
                node.nvml.heal(0)
            await asyncio.sleep(50)
            rec.mark("end")
        finally:
            sampler.cancel()
            operator.cancel()
            stop.set()
            for task in [sampler, operator, *tasks]:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
    return rec


async def _ready(rest: Rest) -> bool:
    policy = await rest.get(POLICY, "cluster-policy")
    return bool(policy and (policy.get("status") or {}).get("state") == "ready")


# ----------------------------------------------------------------- PromQL, the subset

_AGG = re.compile(r"^(max|sum)(?: by \(([\w, ]+)\))? ?\((.+)\)$")
_RANGE = re.compile(r"^(rate|increase)\((\w+)\[(\d+)([mh])\]\)$")
Vector = dict[Labels, float]


def _at(rec: Recording, i: int, name: str) -> Vector:
    return {
        frozenset(kv for kv in labels if kv[0] != "target"): v
        for (n, labels), v in rec.scrapes[i][1].items()
        if n == name
    }


def _range(rec: Recording, i: int, fn: str, name: str, window: float) -> Vector:
    t = rec.scrapes[i][0]
    j = next((k for k, (tk, _) in enumerate(rec.scrapes) if tk >= t - window), 0)
    now, then = _at(rec, i, name), _at(rec, j, name)
    dt = max(t - rec.scrapes[j][0], 1e-9)
    out = {}
    for labels, value in now.items():
        delta = value - then.get(labels, 0.0)
        out[labels] = delta / dt if fn == "rate" else delta
    return out


def evaluate(expr: str, rec: Recording, i: int) -> Vector:
    expr = expr.strip()
    if expr.startswith("time() - "):
        t = rec.start + rec.scrapes[i][0]
        return {k: t - v for k, v in evaluate(expr[len("time() - ") :], rec, i).items()}
    if " / " in expr:
        a, b = expr.split(" / ", 1)
        left, right = evaluate(a, rec, i), evaluate(b, rec, i)
        return {k: v / right[k] for k, v in left.items() if right.get(k)}
    if m := _AGG.match(expr):
        op, by, inner = m.groups()
        keys = [k.strip() for k in by.split(",")] if by else []
        groups: dict[Labels, list[float]] = {}
        for labels, v in evaluate(inner, rec, i).items():
            key = frozenset((k, v2) for k, v2 in labels if k in keys)
            groups.setdefault(key, []).append(v)
        return {k: (max(vs) if op == "max" else sum(vs)) for k, vs in groups.items()}
    if m := _RANGE.match(expr):
        fn, name, n, unit = m.groups()
        return _range(rec, i, fn, name, int(n) * (60 if unit == "m" else 3600))
    if re.fullmatch(r"\w+", expr):
        return _at(rec, i, expr)
    raise ValueError(f"PromQL outside the subset this picture evaluates: {expr}")


def _legend(fmt: str, labels: Labels) -> str:
    found = dict(labels)
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: found.get(m.group(1), ""), fmt)


def series(rec: Recording, target: dict[str, Any]) -> dict[str, tuple[list[float], list[float]]]:
    out: dict[str, tuple[list[float], list[float]]] = {}
    for i, (t, _) in enumerate(rec.scrapes):
        for labels, v in evaluate(target["expr"], rec, i).items():
            xs, ys = out.setdefault(_legend(target.get("legendFormat", ""), labels), ([], []))
            xs.append(t)
            ys.append(v)
    return out


# ----------------------------------------------------------------- drawing


def _stat_text(panel: dict[str, Any], value: float | None) -> tuple[str, str]:
    defaults = panel["fieldConfig"]["defaults"]
    if value is None:
        return "no data", "#cccccc"
    for mapping in defaults.get("mappings") or []:
        hit = mapping["options"].get(str(int(value))) if value == int(value) else None
        if hit:
            return hit["text"], _COLORS.get(hit.get("color", ""), "#dddddd")
    color = "#dddddd"
    for step in (defaults.get("thresholds") or {}).get("steps") or []:
        if step["value"] is None or value >= step["value"]:
            color = _COLORS.get(step["color"], color)
    if defaults.get("unit") == "s":
        return f"{value:.0f} s", color
    return f"{value:g}", color


_COLORS = {
    "green": "#73bf69",
    "red": "#f2495c",
    "orange": "#ff9830",
    "blue": "#8ab8ff",
    "text": "#dddddd",
}


def draw(rec: Recording, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    board = dashboard()
    panels = board["panels"]
    bottom = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    unit_h = 0.42  # inches per grid row
    fig = plt.figure(figsize=(24, bottom * unit_h + 0.8), facecolor="#111217")
    fig.suptitle(
        f"{board['title']}: a local run ({len(rec.scrapes)} scrapes over "
        f"{rec.scrapes[-1][0]:.0f} s, {len(rec.scrapes[0][1]) and 'operator + node agents'})",
        color="#d8d9da",
        fontsize=15,
        y=1 - 0.2 / (bottom * unit_h + 0.8),
    )
    top = 1 - 0.8 / (bottom * unit_h + 0.8)

    def rect(p: dict[str, Any]) -> list[float]:
        g = p["gridPos"]
        pad = 0.004
        ticks = 0.022 if p["type"] == "timeseries" else 0.0  # room for the y tick labels
        return [
            g["x"] / 24 + pad + ticks,
            top - (g["y"] + g["h"]) / bottom * top + pad * 3,
            g["w"] / 24 - 2 * pad - ticks,
            g["h"] / bottom * top - pad * 6,
        ]

    for p in panels:
        if p["type"] == "row":
            g = p["gridPos"]
            fig.text(
                0.005,
                top - (g["y"] + 0.6) / bottom * top,
                p["title"],
                color="#d8d9da",
                fontsize=13,
                weight="bold",
            )
            continue
        ax = fig.add_axes(rect(p))
        ax.set_facecolor("#181b1f")
        for spine in ax.spines.values():
            spine.set_color("#2c3235")
        ax.set_title(p["title"], color="#d8d9da", fontsize=10, loc="left")
        ax.tick_params(colors="#8e8e8e", labelsize=7)
        if p["type"] == "stat":
            lines = series(rec, p["targets"][0])
            last = next(iter(lines.values()))[1][-1] if lines else None
            text, color = _stat_text(p, last)
            ax.set_facecolor(color)
            ax.text(
                0.5,
                0.42,
                text,
                ha="center",
                va="center",
                fontsize=20,
                color="#111217",
                weight="bold",
                transform=ax.transAxes,
            )
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        for target in p["targets"]:
            for legend, (xs, ys) in sorted(series(rec, target).items()):
                ax.plot(xs, ys, linewidth=1.2, label=legend)
        for t, _ in rec.marks:
            ax.axvline(t, color="#444", linewidth=0.6, linestyle=":")
        ax.grid(color="#2c3235", linewidth=0.5)
        ax.set_xlim(0, rec.scrapes[-1][0])
        if ax.get_legend_handles_labels()[0]:
            ax.legend(
                fontsize=6,
                loc="upper left",
                facecolor="#181b1f",
                labelcolor="#d8d9da",
                ncol=2,
                framealpha=0.8,
            )
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80, facecolor=fig.get_facecolor())
    print(f"wrote {out}; events: " + "; ".join(f"{t:.0f}s {w}" for t, w in rec.marks))


@contextlib.contextmanager
def _cluster(directory: Path, gpu_nodes: int) -> Iterator[Path]:
    cluster = LocalCluster(directory)
    cluster.down()
    info = cluster.up(nodes=gpu_nodes + 1, gpu_nodes=gpu_nodes, tie_to_parent=True)
    try:
        yield info.kubeconfig
    finally:
        cluster.down()


def _save(rec: Recording, path: Path) -> None:
    scrapes = [
        [t, [[n, sorted(labels), v] for (n, labels), v in sample.items()]]
        for t, sample in rec.scrapes
    ]
    path.write_text(json.dumps({"start": rec.start, "marks": rec.marks, "scrapes": scrapes}))


def _load(path: Path) -> Recording:
    data = json.loads(path.read_text())
    rec = Recording(start=data["start"], marks=[tuple(m) for m in data["marks"]])
    for t, samples in data["scrapes"]:
        rec.scrapes.append((t, {(n, frozenset(map(tuple, labels))): v for n, labels, v in samples}))
    return rec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("docs/dashboard.png"))
    parser.add_argument("--gpu-nodes", type=int, default=8)
    parser.add_argument("--every", type=float, default=2.0, help="seconds between scrapes")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/gpuop-dashboard-picture"))
    parser.add_argument(
        "--replay", action="store_true", help="draw the last run's scrapes again (no new run)"
    )
    args = parser.parse_args()
    saved = args.dir / "recording.json"
    if args.replay:
        rec = _load(saved)
    else:
        with _cluster(args.dir / "cluster", args.gpu_nodes) as kubeconfig:
            rec = asyncio.run(record(kubeconfig, args.dir / "validations", args.every))
        _save(rec, saved)
    draw(rec, args.out)


if __name__ == "__main__":
    main()
