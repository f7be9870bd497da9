"""Figures 1 (operator side), 2, 3, 4 and 7 from one run per size and repetition:

fresh cluster -> operator process up -> ClusterPolicy applied -> ``ready``
(time to ready, requests, peak RSS) -> settle -> optional idle window (requests)
-> operator restarted on the converged cluster (startup timings, writes).
The restarted operator is handed to ``extra`` (event latency, upgrade) before
the cluster is torn down.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import crd
from gpuop.kube.rest import Rest
from gpuop.progress import Progress

from ._apiserver import ApiserverCounters
from ._audit import as_table, by_verb, writes
from ._harness import (
    DS,
    NAMESPACE,
    BenchCluster,
    ClusterCpu,
    OperatorProcess,
    Settings,
    policy_state,
)
from .baseline import DS_POLL_S, SAMPLE_S, all_ready, pods_ready

Extra = Callable[[BenchCluster, Rest, OperatorProcess], Awaitable[dict[str, Any]]]


@dataclass
class RolloutRun:
    gpu_nodes: int
    time_to_ready_s: float = 0.0
    # When every DaemonSet first reported all its pods ready (harness poll), and the
    # operator's CPU seconds over the rollout: what the gap to the baseline is made of.
    daemonsets_ready_s: float | None = None
    rollout_cpu_s: float = 0.0
    policy_applied_at: float | None = None
    """When the ClusterPolicy was applied (epoch seconds): where the rollout's window
    starts in the operator's log and in ``GPUOP_BENCH_CPU_BY_TASK`` snapshots."""
    startup_cpu_s: float | None = None
    """The operator's CPU seconds from its start until its startup passes were over
    (no pass for ``STARTUP_QUIET_S``), before the policy: what starting costs, kept out
    of ``rollout_cpu_s``."""
    startup_passes: dict[str, int] = field(default_factory=dict)
    """The passes it ran by then, by kind (each GPU node's first pass, the cluster's)."""
    rollout_passes_by_kind: dict[str, int] = field(default_factory=dict)
    """Passes run over the rollout, by kind (node, cluster, upgrades, ...)."""
    rollout_passes: int | None = None
    """ClusterPolicy reconciles over the rollout, and the CPU seconds they took
    (the operator's own counters): what the pacing of the cluster pass let through."""
    rollout_pass_cpu_s: float | None = None
    rollout_pod_events: dict[str, int] = field(default_factory=dict)
    """Operand pod watch events over the rollout by what became of them (the operator's
    ``gpu_operator_pod_events_total``): ``unchanged`` taken at intake (no record
    changed), ``idle`` told but woke nothing, ``woke`` queued a pass; their sum is what
    the pods watch received. Empty for an operator without the counter."""
    cluster_cpu_s: dict[str, float] = field(default_factory=dict)
    """CPU seconds of each control-plane process over the rollout."""
    apiserver: dict[str, Any] = field(default_factory=dict)
    """What kube-apiserver counted over the rollout (``_apiserver.delta``): kwok's
    rejected pod status patches, watchers closed for falling behind."""
    rollout_spans_s: dict[str, list[float]] = field(default_factory=dict)
    pods_ready: list[dict[str, float]] = field(default_factory=list)
    """Every SAMPLE_S: seconds since the policy, and each DaemonSet's Ready pods."""
    cpu_timeline: list[dict[str, float]] = field(default_factory=list)
    """At the same samples: CPU seconds since the policy of the operator and of each
    control-plane process, so when each spent its share can be read back."""
    labels_done_s: float | None = None
    """When the operator logged its last deploy-label patch, after the policy."""
    rollout_requests: dict[str, int] = field(default_factory=dict)
    rollout_by_verb: dict[str, int] = field(default_factory=dict)
    settle_requests: dict[str, int] = field(default_factory=dict)
    idle_seconds: float = 0.0
    idle_requests: dict[str, int] | None = None
    idle_by_verb: dict[str, int] | None = None
    idle_cluster_cpu_s: dict[str, float] | None = None
    """CPU seconds of each control-plane process over the idle window: the steady work
    (leases, node monitoring) that a longer rollout also pays for."""
    idle_cpu_s: float | None = None
    """The operator's own CPU seconds over the idle window (issue 49: at most 0.5 % of
    a core, so 0.005 CPU-s per second)."""
    peak_rss_mib: float = 0.0
    rss_after_mib: float = 0.0
    restart_synced_s: float | None = None
    restart_first_reconcile_s: float | None = None
    restart_peak_rss_mib: float = 0.0
    restart_window_s: float = 0.0
    restart_requests: dict[str, int] = field(default_factory=dict)
    restart_writes: int = 0
    operator_warnings: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


async def _wait_policy_ready(
    rest: Rest,
    timeout: float,
    progress: Progress,
    result: RolloutRun,
    cpu_now: Callable[[], dict[str, float]],
) -> None:
    """Poll until the ClusterPolicy says ``ready``; every SAMPLE_S record the Ready pods
    per DaemonSet and ``cpu_now()`` (CPU seconds so far, by process)."""
    started = time.monotonic()
    deadline = started + timeout
    sampled = polled = float("-inf")
    while True:
        state = await policy_state(rest)
        now = time.monotonic()
        due = result.daemonsets_ready_s is None and now - polled >= DS_POLL_S
        if due or now - sampled >= SAMPLE_S:
            polled = now
            daemonsets = await rest.list(DS, NAMESPACE)
            if now - sampled >= SAMPLE_S:
                sampled = now
                result.pods_ready.append(pods_ready(now - started, daemonsets))
                result.cpu_timeline.append({"t": round(now - started, 1), **cpu_now()})
            if result.daemonsets_ready_s is None and all_ready(daemonsets):
                result.daemonsets_ready_s = time.monotonic() - started
        progress.status(f"state={state}")
        if state == "ready":
            if result.daemonsets_ready_s is None:
                # Ready between two DaemonSet polls: they were ready by now at the latest.
                daemonsets = await rest.list(DS, NAMESPACE)
                if all_ready(daemonsets):
                    result.daemonsets_ready_s = time.monotonic() - started
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"ClusterPolicy not ready within {timeout:.0f}s (state={state})")
        await asyncio.sleep(0.2)


async def _quiet(
    op: OperatorProcess,
    quiet: float,
    timeout: float,
    count: Callable[[], float | None] | None = None,
    poll: float = 0.5,
) -> float:
    """Wait until ``count`` (default: the operator's ClusterPolicy reconciles) stays
    still for ``quiet`` seconds, at most ``timeout``; the seconds waited."""
    read = count or (lambda: op.metric("gpu_operator_reconciliation_total"))
    started = time.monotonic()
    last = read()
    still_since = time.monotonic()
    while time.monotonic() - started < timeout:
        await asyncio.sleep(poll)
        now = read()
        if now != last:
            last, still_since = now, time.monotonic()
        elif time.monotonic() - still_since >= quiet:
            break
    return time.monotonic() - started


async def run_once(
    settings: Settings,
    gpu_nodes: int,
    idle_seconds: float,
    settle_seconds: float,
    ready_timeout: float,
    extra: Extra | None = None,
    policy: dict[str, Any] | None = None,
) -> RolloutRun:
    """One rollout of ``policy`` (default: the sample policy) on a fresh cluster."""
    result = RolloutRun(gpu_nodes)
    logs = settings.cluster_dir.parent / f"{settings.cluster_dir.name}-logs"
    logs.mkdir(parents=True, exist_ok=True)
    async with BenchCluster(settings, gpu_nodes) as bench, bench.admin() as rest:
        await bench.prepare(rest)
        first = OperatorProcess(
            bench.operator_kubeconfig,
            logs / f"operator-{gpu_nodes}-{int(time.time())}.log",
            settings.operator_src,
            settings.workers,
        )
        first.start()
        try:
            await asyncio.to_thread(first.wait_ready)
            # /readyz is the caches synced; the first pass of every node runs after it.
            # The rollout's clock starts once those are over, so the operator's rollout
            # CPU is the rollout's alone (its start is its own row).
            waited = await _quiet(first, STARTUP_QUIET_S, ready_timeout, _all_passes(first), 0.2)
            if waited >= ready_timeout:
                raise TimeoutError(f"operator passes still running {waited:.0f}s after /readyz")
            result.startup_cpu_s = round(first.cpu_seconds(), 2)
            result.startup_passes = {k: int(n) for k, n in _passes(first).items()}
            bench.audit.mark()
            progress = Progress(f"rollout {gpu_nodes} GPU nodes")
            cpu_before = first.cpu_seconds()
            passes_before = first.metric("gpu_operator_reconciliation_total") or 0.0
            pass_cpu_before = first.metric("gpu_operator_reconciliation_cpu_seconds_total") or 0.0
            pod_events_before = _pod_events(first)
            passes_by_kind_before = _passes(first)
            cluster_cpu = ClusterCpu(bench)
            counted = ApiserverCounters(rest)
            await counted.start()
            cluster_cpu.start()
            started = time.monotonic()
            started_wall = time.time()
            result.policy_applied_at = started_wall
            await rest.apply(policy or crd.sample_policy())

            def cpu_now() -> dict[str, float]:
                spent = cluster_cpu.take()
                spent["operator"] = round(first.cpu_seconds() - cpu_before, 2)
                return spent

            await _wait_policy_ready(rest, ready_timeout, progress, result, cpu_now)
            result.time_to_ready_s = time.monotonic() - started
            result.rollout_cpu_s = first.cpu_seconds() - cpu_before
            passes = first.metric("gpu_operator_reconciliation_total")
            pass_cpu = first.metric("gpu_operator_reconciliation_cpu_seconds_total")
            if passes is not None and pass_cpu is not None:
                result.rollout_passes = int(passes - passes_before)
                result.rollout_pass_cpu_s = round(pass_cpu - pass_cpu_before, 2)
            result.rollout_passes_by_kind = {
                k: int(n - passes_by_kind_before.get(k, 0.0)) for k, n in _passes(first).items()
            }
            pod_events = _pod_events(first)
            result.rollout_pod_events = {
                k: int(n - pod_events_before.get(k, 0.0)) for k, n in pod_events.items()
            }  # empty: an operator without the counters (--operator-src of an older tree)
            result.cluster_cpu_s = cluster_cpu.take()
            result.apiserver = await counted.take()
            progress.finish(
                f"ready in {result.time_to_ready_s:.1f}s "
                f"(DaemonSets {result.daemonsets_ready_s or 0:.1f}s, "
                f"operator CPU {result.rollout_cpu_s:.1f}s, "
                f"cluster CPU {sum(result.cluster_cpu_s.values()):.1f}s)"
            )
            rollout = bench.audit.take()
            labelled = [t - started_wall for t in first.event_times("node labels")]
            result.labels_done_s = round(max(labelled), 2) if labelled else None
            result.rollout_spans_s = {
                f"{verb} {res}": [round(a - started_wall, 2), round(b - started_wall, 2)]
                for (verb, res), (a, b) in sorted(bench.audit.spans.items())
            }
            result.rollout_requests = as_table(rollout)
            result.rollout_by_verb = by_verb(rollout)
            await asyncio.sleep(settle_seconds)
            result.settle_requests = as_table(bench.audit.take())
            if idle_seconds > 0:
                steady = ClusterCpu(bench)
                steady.start()
                idle_cpu_before = first.cpu_seconds()
                idle = await _idle(first, bench, idle_seconds)
                result.idle_cpu_s = round(first.cpu_seconds() - idle_cpu_before, 3)
                result.idle_cluster_cpu_s = steady.take()
                result.idle_seconds = idle_seconds
                result.idle_requests = as_table(idle)
                result.idle_by_verb = by_verb(idle)
            await asyncio.to_thread(first.dump_memory)
            result.peak_rss_mib = first.peak_rss_mib()
            result.rss_after_mib = first.rss_mib()
            result.operator_warnings += first.errors()
        finally:
            first.stop()

        # Figure 3 and 7: a no-op restart of a converged operator.
        bench.audit.mark()
        again = OperatorProcess(
            bench.operator_kubeconfig,
            logs / f"operator-{gpu_nodes}-restart-{int(time.time())}.log",
            settings.operator_src,
            settings.workers,
        )
        again.start()
        try:
            startup = await asyncio.to_thread(again.measure_startup)
            result.restart_synced_s = startup.synced_s
            result.restart_first_reconcile_s = startup.first_reconcile_s
            result.restart_window_s = await _quiet(again, quiet=settle_seconds, timeout=600)
            restart = bench.audit.take()
            result.restart_requests = as_table(restart)
            result.restart_writes = writes(restart)
            result.restart_peak_rss_mib = again.peak_rss_mib()
            if extra is not None:
                result.extra = await extra(bench, rest, again)
            result.operator_warnings += again.errors()
        finally:
            again.stop()
    return result


POD_EVENTS = "gpu_operator_pod_events_total"
POD_EVENT_OUTCOMES = ("unchanged", "idle", "woke")


STARTUP_QUIET_S = 2.0
"""No pass for this long after /readyz: the operator's startup passes are over (the
work queue starts once the NVIDIADriver and GPUCluster caches listed, at most 10 s
later, and the 1,000 nodes' first passes take a few seconds)."""
PASS_KINDS = ("node", "cluster", "upgrades", "nvidiadrivers", "remediation", "gpuclusters")
PASSES = "gpu_operator_reconcile_duration_seconds_count"


def _all_passes(op: OperatorProcess) -> Callable[[], float]:
    """Reads how many passes of any kind the operator has run."""
    return lambda: sum(_passes(op).values())


def _passes(op: OperatorProcess) -> dict[str, float]:
    """How many passes of each kind the operator has run (its duration histogram's
    counts); a kind not run yet is absent."""
    counts = {k: op.metric(f'{PASSES}{{pass="{k}"}}') for k in PASS_KINDS}
    return {k: n for k, n in counts.items() if n is not None}


def _pod_events(op: OperatorProcess) -> dict[str, float]:
    """The operator's pod event counters by outcome (none before the first event, or
    from an operator without them)."""
    counts = {k: op.metric(f'{POD_EVENTS}{{outcome="{k}"}}') for k in POD_EVENT_OUTCOMES}
    if all(n is None for n in counts.values()):
        return {}
    return {k: n or 0.0 for k, n in counts.items()}


async def _idle(
    op: OperatorProcess, bench: BenchCluster, seconds: float
) -> Counter[tuple[str, str]]:
    progress = Progress("idle window", total=int(seconds))
    bench.audit.mark()
    started = time.monotonic()
    while (elapsed := time.monotonic() - started) < seconds:
        await asyncio.sleep(min(5.0, seconds - elapsed))
        op.ready()  # fails fast if the operator died
        progress.done = int(time.monotonic() - started)
        progress.status("")
    counts = bench.audit.take()
    progress.finish(f"{sum(counts.values())} requests in {seconds:.0f}s")
    return counts
