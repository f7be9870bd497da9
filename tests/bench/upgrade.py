"""Figure 6: a fleet driver upgrade (``maxParallelUpgrades`` 50, ``maxUnavailable`` 10%).

On a converged cluster the benchmark changes ``spec.driver.version`` and turns
on ``autoUpgrade``, then watches every node (its own watch cache, admin identity)
until each GPU node has passed through an upgrade state and reached
``upgrade-done``. Sampled on every node event: nodes unschedulable (the budget
counts those) and nodes in a state between cordon and uncordon. Writes are the
operator's own (audit log) divided by GPU nodes.

If no node enters an upgrade state within ``start_timeout`` the figure is
reported as not available (the upgrade controller is absent or off), and if the
fleet does not finish within ``timeout`` the partial progress is reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from typing import Any

from gpuop.kube.informer import Informer, Obj, ResourceSpec
from gpuop.kube.rest import Rest
from gpuop.progress import Progress

from ._audit import as_table, writes
from ._harness import NODE, POLICY, BenchCluster, OperatorProcess, gpu_node_names

STATE_LABEL = "nvidia.com/gpu-driver-upgrade-state"
DONE = "upgrade-done"
FAILED = "upgrade-failed"
IDLE_STATES = {None, "", DONE, FAILED, "upgrade-required"}
MAX_PARALLEL = 50
MAX_UNAVAILABLE = "10%"


class _Tracker:
    def __init__(self, gpu: set[str]) -> None:
        self.gpu = gpu
        self.armed = False
        self.state: dict[str, str | None] = {}
        self.unschedulable: set[str] = set()
        self.touched: set[str] = set()
        self.peak_unschedulable = 0
        self.peak_in_progress = 0
        self.first_move: float | None = None

    def on_node(self, event: str, old: Obj | None, new: Obj | None) -> None:
        node = new or old
        assert node is not None
        name = node["metadata"]["name"]
        if name not in self.gpu:
            return
        if new is None:
            self.state.pop(name, None)
            self.unschedulable.discard(name)
            return
        value = (new["metadata"].get("labels") or {}).get(STATE_LABEL)
        self.state[name] = value
        if (new.get("spec") or {}).get("unschedulable"):
            self.unschedulable.add(name)
        else:
            self.unschedulable.discard(name)
        if not self.armed:
            return
        if value != DONE:
            self.touched.add(name)
            if self.first_move is None:
                self.first_move = time.monotonic()
        self.peak_unschedulable = max(self.peak_unschedulable, len(self.unschedulable))
        in_progress = sum(1 for s in self.state.values() if s not in IDLE_STATES)
        self.peak_in_progress = max(self.peak_in_progress, in_progress)

    def done(self) -> int:
        return sum(1 for n in self.gpu if n in self.touched and self.state.get(n) == DONE)

    def failed(self) -> int:
        return sum(1 for n in self.gpu if self.state.get(n) == FAILED)


def _trim(node: Obj) -> Obj:
    meta = node.get("metadata") or {}
    return {
        "metadata": {
            "name": meta.get("name"),
            "resourceVersion": meta.get("resourceVersion"),
            "labels": meta.get("labels") or {},
        },
        "spec": {"unschedulable": (node.get("spec") or {}).get("unschedulable", False)},
    }


async def measure(
    bench: BenchCluster,
    rest: Rest,
    op: OperatorProcess,
    timeout: float,
    start_timeout: float = 120.0,
) -> dict[str, Any]:
    names = set(await gpu_node_names(rest))
    budget_unavailable = math.ceil(0.10 * len(names))
    tracker = _Tracker(names)
    informer = Informer(ResourceSpec("nodes", rest.lister(NODE), transform=_trim), tracker.on_node)
    task = asyncio.create_task(informer.run())
    result: dict[str, Any] = {
        "gpu_nodes": len(names),
        "max_parallel_upgrades": MAX_PARALLEL,
        "max_unavailable": MAX_UNAVAILABLE,
        "budget_unavailable_nodes": budget_unavailable,
    }
    try:
        await asyncio.wait_for(informer.synced.wait(), 60)
        already_unschedulable = len(tracker.unschedulable)
        tracker.armed = True
        bench.audit.mark()
        started = time.monotonic()
        cpu_before = op.cpu_seconds()
        await rest.merge_patch(
            POLICY,
            "cluster-policy",
            {
                "spec": {
                    "driver": {
                        "version": "595.91.08-bench",
                        "upgradePolicy": {
                            "autoUpgrade": True,
                            "maxParallelUpgrades": MAX_PARALLEL,
                            "maxUnavailable": MAX_UNAVAILABLE,
                        },
                    }
                }
            },
        )
        progress = Progress("fleet upgrade", total=len(names))
        while True:
            await asyncio.sleep(0.5)
            op.ready()
            progress.done = tracker.done()
            progress.status(
                f"unschedulable={len(tracker.unschedulable)} peak={tracker.peak_unschedulable}"
            )
            elapsed = time.monotonic() - started
            if tracker.done() + tracker.failed() >= len(names) and tracker.touched >= names:
                break
            if tracker.first_move is None and elapsed > start_timeout:
                progress.finish("not available")
                result["available"] = False
                result["reason"] = (
                    f"no GPU node entered a driver upgrade state within {start_timeout:.0f}s"
                    " of the driver version change (upgrade controller absent or inactive)"
                )
                return result
            if elapsed > timeout:
                progress.finish("timed out")
                result["available"] = False
                result["reason"] = (
                    f"upgrade did not finish within {timeout:.0f}s:"
                    f" {tracker.done()}/{len(names)} done, {tracker.failed()} failed"
                )
                break
        wall = time.monotonic() - started
        counts = bench.audit.take()
        result.update(
            available=result.get("available", True),
            wall_s=wall,
            operator_cpu_s=round(op.cpu_seconds() - cpu_before, 2),
            done=tracker.done(),
            failed=tracker.failed(),
            peak_unschedulable=tracker.peak_unschedulable,
            unschedulable_before=already_unschedulable,
            peak_in_progress=tracker.peak_in_progress,
            within_budget=tracker.peak_unschedulable <= budget_unavailable,
            writes=writes(counts),
            writes_per_node=writes(counts) / max(1, len(names)),
            requests=as_table(counts),
        )
        if result["available"]:
            progress.finish(f"{tracker.done()} nodes upgraded in {wall:.1f}s")
        return result
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
