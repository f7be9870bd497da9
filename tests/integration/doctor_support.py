"""Helpers of the `gpuop doctor` integration tests (``test_doctor*.py``): the command
run as a user runs it, and bare pods carrying operand labels, played Running by kwok.

kwok runs no container, so the states NVIDIA's images would leave are patched through
the pods' status subresource once kwok has made the pod Running (kwok's ``pod-ready``
stage plays only Pending pods, so a Running pod's patched status stays)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from gpuop.devcluster import ClusterInfo
from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Rest
from tests.integration.harness import NAMESPACE, eventually

POD = by_kind("v1", "Pod")
DS = by_kind("apps/v1", "DaemonSet")
GPU_NODE = "gpu-node-0001"


async def doctor(info: ClusterInfo, *args: str) -> tuple[int, list[str]]:
    """`gpuop doctor` as a user runs it (on the cluster, or ``args`` such as
    ``--bundle PATH``): exit code and its stdout lines."""
    source = list(args) or ["--kubeconfig", str(info.kubeconfig), "--since", "5m"]
    proc = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "gpuop", "doctor", "--namespace", NAMESPACE, *source],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode in (0, 1), proc.stderr
    folder = os.environ.get("GPUOP_CAPTURE_DIR")
    if folder:  # docs/operations.md quotes these
        out = Path(folder) / "doctor.txt"
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("a") as f:
            f.write(f"$ gpuop doctor {' '.join(args)}\n{proc.stdout}")
    return proc.returncode, proc.stdout.splitlines()


def of_rule(lines: list[str], rule: str) -> list[str]:
    return [line for line in lines if line.startswith(f"{rule}: ")]


def bare_pod(name: str, namespace: str, node: str, **spec: Any) -> dict[str, Any]:
    labels = spec.pop("labels", {})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "busybox"}], **spec},
    }


def driver_pod(node: str, test: str) -> dict[str, Any]:
    """A driver pod as the operator renders it, as far as the rules look: its
    component label and the driver manager init container."""
    return bare_pod(
        f"nvidia-driver-daemonset-{test}-{node[-4:]}",
        NAMESPACE,
        node,
        labels={"app": "nvidia-driver-daemonset", "app.kubernetes.io/component": "nvidia-driver"},
        initContainers=[{"name": "k8s-driver-manager", "image": "nvcr.io/k8s-driver-manager:v0"}],
        containers=[{"name": "nvidia-driver-ctr", "image": "nvcr.io/nvidia/driver:595.91.07"}],
    )


async def running(rest: Rest, body: dict[str, Any]) -> dict[str, Any]:
    """Create the pod and wait until kwok has played it Running (and leaves it be)."""
    meta = body["metadata"]
    await rest.create(POD, body, meta["namespace"])

    async def is_running() -> bool:
        got = await rest.get(POD, meta["name"], meta["namespace"])
        return got is not None and got["status"].get("phase") == "Running"

    await eventually(is_running, timeout=60, what=f"pod {meta['name']} Running")
    return body


async def patch_status(rest: Rest, name: str, status: dict[str, Any]) -> None:
    await rest.merge_patch(POD, name, {"status": status}, NAMESPACE, subresource="status")


async def clear_daemonsets(rest: Rest) -> None:
    """No operand DaemonSet left by another test (or by an operator run here): its
    controller would adopt the bare pods built here, which carry operand labels, and
    delete them."""
    for ds in await rest.list(DS, NAMESPACE):
        await rest.delete(DS, ds["metadata"]["name"], NAMESPACE)

    async def gone() -> bool:
        return not await rest.list(DS, NAMESPACE)

    await eventually(gone, timeout=60, what="operand DaemonSets gone")


async def delete_pods(rest: Rest, pods: list[tuple[str, str]]) -> None:
    for namespace, name in pods:
        await rest.delete(POD, name, namespace, body={"gracePeriodSeconds": 0})
