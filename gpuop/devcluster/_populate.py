"""Filling a local control plane once it serves: the simulated nodes (created, then
waited for until Ready and schedulable), the ``default`` ServiceAccount pods need, and
the simulated GPUs published as DRA devices."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from typing import Any

from gpuop.progress import Progress

from ._errors import ClusterError
from ._nodes import LEGACY_SIMULATED_LABEL, SIMULATED_LABEL, node_manifests


async def publish_dra(api: Any) -> None:
    """Publish the simulated nodes' GPUs as DRA devices (idempotent)."""
    from gpuop.kube.kinds import KINDS
    from gpuop.kube.rest import Rest

    from ._dra import publish

    progress = Progress("DRA devices")
    done = await publish(Rest(api, KINDS))
    progress.finish(
        f"ResourceSlices of gpu.nvidia.com: {len(done.created)} created, "
        f"{len(done.replaced)} replaced, {len(done.deleted)} deleted"
    )


async def create_nodes(
    api: Any,
    nodes: int,
    gpu_nodes: int,
    concurrency: int = 32,
    workloads: Mapping[str, str] | None = None,
) -> None:
    """Create the simulated nodes (idempotent: existing ones are left as they are);
    ``workloads`` labels GPU nodes with their workload (see ``node_manifests``)."""
    from kubernetes_asyncio import client
    from kubernetes_asyncio.client.exceptions import ApiException

    core: Any = client.CoreV1Api(api)  # accepts plain dicts as bodies
    manifests = node_manifests(nodes, gpu_nodes, workloads)
    progress = Progress("nodes created", total=len(manifests))
    sem = asyncio.Semaphore(concurrency)

    async def one(body: dict[str, Any]) -> None:
        async with sem:
            try:
                await core.create_node(body)
            except ApiException as err:
                if err.status != 409:
                    raise
            progress.advance(1)

    await asyncio.gather(*(one(m) for m in manifests))
    progress.finish(f"{len(manifests)} nodes ({gpu_nodes} with GPUs)")


_NOT_READY_TAINT = "node.kubernetes.io/not-ready"


def _simulated(labels: dict[str, str]) -> bool:
    """A node of ours, also one created before the label moved to `gpuop.io/`."""
    return "true" in (labels.get(SIMULATED_LABEL), labels.get(LEGACY_SIMULATED_LABEL))


async def wait_nodes_ready(api: Any, expected: int, timeout: float = 300.0) -> None:
    """Wait until ``expected`` simulated nodes report Ready (kwok heartbeats them) and
    the node lifecycle controller has lifted their ``not-ready`` taint, so pods can
    be scheduled on them the moment this returns."""
    from kubernetes_asyncio import client

    core = client.CoreV1Api(api)
    progress = Progress("nodes ready", total=expected)
    deadline = time.monotonic() + timeout
    while True:
        listed = await core.list_node()
        ready = sum(
            1
            for n in listed.items
            if _simulated(n.metadata.labels or {})
            and any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
            and not any(t.key == _NOT_READY_TAINT for t in n.spec.taints or [])
        )
        progress.done = ready
        progress.status("")
        if ready >= expected:
            progress.finish(f"{ready} Ready")
            return
        if time.monotonic() > deadline:
            raise ClusterError(
                f"only {ready} of {expected} simulated nodes became Ready in {timeout:.0f}s",
                "see the kwok log in the cluster directory",
            )
        await asyncio.sleep(0.5)


async def wait_default_service_account(api: Any, timeout: float = 60.0) -> None:
    """Pods are refused until the controller manager creates ``default`` accounts."""
    from kubernetes_asyncio import client
    from kubernetes_asyncio.client.exceptions import ApiException

    core = client.CoreV1Api(api)
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(ApiException):
            await core.read_namespaced_service_account("default", "default")
            return
        if time.monotonic() > deadline:
            raise ClusterError(
                "the default ServiceAccount never appeared",
                "see the kube-controller-manager log in the cluster directory",
            )
        await asyncio.sleep(0.25)
