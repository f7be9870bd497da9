"""Figure 1's baseline: the DaemonSet controller alone.

On a fresh cluster the GPU nodes first get exactly the labels the operator would
set (``node_label_changes`` of the sample policy; not timed), then every object
the operator would render is applied at once by hand, and the clock runs until
every DaemonSet reports all its pods updated and Ready. No ordering, no status:
the lower bound the operator's ordered rollout is compared with.

The ``floor`` variant starts the clock before the labels instead. Any operator
must write them after it reads the policy, so that is the least any operator can
take on the same cluster: what is left to an operator's own work is the
difference between it and the operator's time.

The ``observed`` variant is the floor with a second process that holds the
operator's watches and reads every event without acting on it
(:mod:`tests.bench.observer`): what observing the rollout alone costs the shared
cores, before any of the operator's own work.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import crd
from components import (
    RenderContext,
    any_mig_capable,
    desired_objects,
    node_facts,
    node_label_changes,
)
from components.labels import is_gpu_node
from crd import parse_policy
from gpuop.devcluster import SIMULATED_LABEL
from gpuop.kube.rest import Rest
from gpuop.operator.controller import OperatorConfig
from gpuop.progress import Progress

from ._apiserver import ApiserverCounters
from ._harness import (
    DS,
    NAMESPACE,
    NODE,
    BenchCluster,
    ClusterCpu,
    Settings,
    process_cpu_seconds,
)

SAMPLE_S = 5.0
"""How often the rollout's progress (Ready pods per DaemonSet) is sampled."""
DS_POLL_S = 0.5
"""How often the harness lists the DaemonSets, in the baseline and in the operator's
run alike: the harness's own requests and parsing load the same two cores."""


def pods_ready(at: float, daemonsets: list[dict[str, Any]]) -> dict[str, float]:
    """One progress sample: seconds since the clock started, Ready pods per DaemonSet."""
    sample: dict[str, float] = {"t": round(at, 1)}
    for ds in daemonsets:
        sample[ds["metadata"]["name"]] = (ds.get("status") or {}).get("numberReady", 0)
    return sample


def ds_ready(ds: dict[str, Any]) -> bool:
    """Every pod it wants updated and Ready, once its controller has seen it: a DaemonSet
    no node is labelled for (the MPS control daemon without MPS sharing) wants 0 and is
    ready as soon as it is observed, as the operator counts it."""
    status = ds.get("status") or {}
    want = status.get("desiredNumberScheduled", -1)
    return bool(
        status.get("observedGeneration") == ds["metadata"].get("generation")
        and want >= 0
        # Counts of zero are left out of the status.
        and status.get("numberReady", 0) == want
        and status.get("updatedNumberScheduled", 0) == want
        and status.get("numberAvailable", 0) == want
    )


def all_ready(daemonsets: list[dict[str, Any]]) -> bool:
    """Some DaemonSet exists and every one is :func:`ds_ready`."""
    return bool(daemonsets) and all(map(ds_ready, daemonsets))


class ObserverProcess:
    """:mod:`tests.bench.observer` in its own process, as the operator runs in its own."""

    def __init__(self, kubeconfig: Path) -> None:
        argv = [sys.executable, "-m", "tests.bench.observer", "--kubeconfig", str(kubeconfig)]
        argv += ["--namespace", NAMESPACE]
        # Run from the harness's own tree, whatever --operator-src names.
        root = Path(__file__).resolve().parents[2]
        self.proc = subprocess.Popen(argv, cwd=root, stdout=subprocess.PIPE, text=True)
        self.cpu_before = 0.0

    async def synced(self, timeout: float = 120.0) -> None:
        """Waits for its lists to be done; the CPU count starts there."""
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(self.proc.stdout.readline), timeout)
        if line.strip() != "synced":
            raise RuntimeError(f"observer exited with {self.proc.poll()} before its lists")
        self.cpu_before = process_cpu_seconds(self.proc.pid)

    async def stop(self) -> dict[str, Any]:
        """Its CPU seconds since :meth:`synced` and what it read."""
        cpu = process_cpu_seconds(self.proc.pid) - self.cpu_before
        self.proc.send_signal(signal.SIGTERM)
        out, _ = await asyncio.to_thread(self.proc.communicate, None, 30)
        return {"cpu_s": round(cpu, 2), **json.loads(out.strip().splitlines()[-1])}

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


async def run_once(
    settings: Settings,
    gpu_nodes: int,
    timeout: float,
    labels_timed: bool = False,
    policy: dict[str, Any] | None = None,
    observed: bool = False,
) -> dict[str, Any]:
    """One baseline run of ``policy`` (default: the sample policy); ``labels_timed``: the
    clock (and the CPU count) starts before the nodes are labelled, not after (the
    ``floor`` figure); ``observed``: the floor with :class:`ObserverProcess` reading
    beside it (the ``observed`` figure)."""
    model, problems = parse_policy(policy or crd.sample_policy())
    assert model is not None, problems
    assert not problems, problems
    spec = model.spec
    # Audited as in the operator's runs (the policy logs only the operator's user, so
    # nothing here), so kube-apiserver runs with the same flags in both.
    async with BenchCluster(settings, gpu_nodes) as bench, bench.admin() as rest:
        await bench.prepare(rest)
        watcher = ObserverProcess(bench.operator_kubeconfig) if observed else None
        try:
            what = "floor" if labels_timed else "baseline"
            if watcher is not None:
                await watcher.synced()
                what = "observed"
            got = await _timed(bench, rest, spec, gpu_nodes, timeout, labels_timed, what)
            if watcher is not None:
                got["observer"] = await watcher.stop()
        finally:
            if watcher is not None:
                watcher.kill()
    return got


async def _timed(
    bench: BenchCluster,
    rest: Rest,
    spec: Any,
    gpu_nodes: int,
    timeout: float,
    labels_timed: bool,
    what: str,
) -> dict[str, Any]:
    """The clocked part of :func:`run_once`: labels (timed or not), DaemonSets, Ready."""
    nodes = await rest.list(NODE, label_selector=f"{SIMULATED_LABEL}=true")
    cluster_cpu = ClusterCpu(bench)
    counted = ApiserverCounters(rest)  # read where the clock starts, as the CPU is
    if labels_timed:
        await counted.start()
        cluster_cpu.start()
    label_started = time.monotonic()
    await _label(rest, nodes, spec)
    label_s = time.monotonic() - label_started
    ctx = RenderContext(
        namespace=NAMESPACE,
        operator_image=OperatorConfig().operator_image,
        mig_capable=any_mig_capable(n["metadata"].get("labels", {}) for n in nodes),
        service_monitor_crd=False,
        prometheus_rule_crd=False,
        # As the operator renders: the driver DaemonSet per OS pool of the GPU nodes.
        gpu_nodes=tuple(
            node_facts(n)
            for n in sorted(nodes, key=lambda n: n["metadata"]["name"])
            if is_gpu_node(n["metadata"].get("labels", {}))
        ),
    )
    objects = [o for objs in desired_objects(spec, ctx).values() for o in objs]
    n_ds = sum(1 for o in objects if o["kind"] == "DaemonSet")
    progress = Progress(f"{what} {gpu_nodes} GPU nodes", total=n_ds)
    if labels_timed:
        started = label_started
    else:
        await counted.start()
        cluster_cpu.start()
        started = time.monotonic()
    for obj in objects:
        await rest.apply(obj)
    samples: list[dict[str, float]] = []
    cpu_timeline: list[dict[str, float]] = []
    while True:
        daemonsets = await rest.list(DS, NAMESPACE)
        now = time.monotonic() - started
        if not samples or now - samples[-1]["t"] >= SAMPLE_S:
            samples.append(pods_ready(now, daemonsets))
            cpu_timeline.append({"t": round(now, 1), **cluster_cpu.take()})
        ready = sum(1 for d in daemonsets if ds_ready(d))
        progress.done = ready
        progress.status("DaemonSets ready")
        if ready == n_ds:
            break
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"{what}: {ready}/{n_ds} DaemonSets ready in {timeout}s")
        await asyncio.sleep(DS_POLL_S)
    elapsed = time.monotonic() - started
    used = cluster_cpu.take()
    apiserver = await counted.take()
    progress.finish(
        f"all {n_ds} DaemonSets ready in {elapsed:.1f}s (cluster CPU {sum(used.values()):.1f}s)"
    )
    return {
        "time_to_ready_s": elapsed,
        "label_nodes_s": label_s,
        "pods_ready": samples,
        "cpu_timeline": cpu_timeline,
        "cluster_cpu_s": used,
        "apiserver": apiserver,
    }


async def _label(rest: Rest, nodes: list[dict[str, Any]], spec: Any) -> None:
    sem = asyncio.Semaphore(16)

    async def one(node: dict[str, Any]) -> None:
        changes = node_label_changes(node["metadata"].get("labels", {}), spec)
        if changes:
            async with sem:
                await rest.merge_patch(
                    NODE, node["metadata"]["name"], {"metadata": {"labels": dict(changes)}}
                )

    await asyncio.gather(*(one(n) for n in nodes))
