"""Figure 5: node label change -> the operator's resulting write.

On a converged cluster, for one random GPU node at a time, the benchmark opens a
watch on that node, removes the operator's ``nvidia.com/gpu.present`` label
(no DaemonSet selects on it, so nothing else reacts) and times, on that watch,
from the event showing the label gone to the event showing the operator's patch
putting it back. Both ends are seen through the same watch path, so the figure
is the operator's reaction (its watch delivery, queue, reconcile, PATCH) plus
one watch delivery of its write.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Any

import aiohttp

from components import GPU_PRESENT_LABEL
from gpuop.kube.rest import Rest
from gpuop.progress import Progress

from ._harness import NODE, BenchCluster, OperatorProcess, gpu_node_names
from ._stats import percentile


async def _one(rest: Rest, name: str, timeout: float) -> float | None:
    node = await rest.get(NODE, name)
    assert node is not None
    rv = node["metadata"]["resourceVersion"]
    resp = await rest.lister(NODE)(
        watch=True,
        field_selector=f"metadata.name={name}",
        resource_version=rv,
        allow_watch_bookmarks=False,
        timeout_seconds=int(timeout) + 5,
        _request_timeout=aiohttp.ClientTimeout(total=timeout + 10),
    )
    removed_at: float | None = None
    try:
        await rest.merge_patch(NODE, name, {"metadata": {"labels": {GPU_PRESENT_LABEL: None}}})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = await asyncio.wait_for(resp.content.readline(), deadline - time.monotonic())
            if not line:
                break
            event: dict[str, Any] = json.loads(line)
            obj_labels = ((event.get("object") or {}).get("metadata") or {}).get("labels") or {}
            present = obj_labels.get(GPU_PRESENT_LABEL) == "true"
            if removed_at is None and not present:
                removed_at = time.monotonic()
            elif removed_at is not None and present:
                return (time.monotonic() - removed_at) * 1000.0
    except TimeoutError:
        pass
    finally:
        resp.release()
    return None


async def measure(
    bench: BenchCluster, rest: Rest, op: OperatorProcess, samples: int, timeout: float = 10.0
) -> dict[str, Any]:
    names = await gpu_node_names(rest)
    rng = random.Random(8)
    latencies: list[float] = []
    missed = 0
    progress = Progress("event latency", total=samples)
    for _ in range(samples):
        got = await _one(rest, rng.choice(names), timeout)
        if got is None:
            missed += 1
        else:
            latencies.append(got)
        progress.advance(1)
        await asyncio.sleep(rng.uniform(0.05, 0.25))
    op.ready()
    result: dict[str, Any] = {"samples": len(latencies), "missed": missed}
    if latencies:
        result.update(
            p50_ms=percentile(latencies, 50),
            p99_ms=percentile(latencies, 99),
            max_ms=max(latencies),
            latencies_ms=[round(v, 2) for v in latencies],
        )
    progress.finish(
        f"p50 {result.get('p50_ms', 0):.1f} ms, p99 {result.get('p99_ms', 0):.1f} ms"
        f" ({missed} missed)"
    )
    return result
