"""`gpuop doctor` on a support bundle, the rules over containers' lines: kwok's nodes
serve no log, so a bundle of the local cluster (written by `gpuop support-bundle`) gets
the lines a real node's driver and validator containers would have left, and the
command reads it back, archive and unpacked directory."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpuop.devcluster import ClusterInfo
from gpuop.kube.rest import Rest
from tests.integration.doctor_support import (
    bare_pod,
    clear_daemonsets,
    delete_pods,
    doctor,
    driver_pod,
    of_rule,
    running,
)
from tests.integration.harness import NAMESPACE

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
async def no_daemonsets(rest: Rest) -> AsyncIterator[None]:
    await clear_daemonsets(rest)
    yield
    await clear_daemonsets(rest)


@pytest.fixture
async def cleanup(rest: Rest) -> AsyncIterator[list[tuple[str, str]]]:
    """Pods (namespace, name) to delete after the test."""
    made: list[tuple[str, str]] = []
    yield made
    await delete_pods(rest, made)


LOG_LINES = {
    "gpu-node-0001": (
        "nouveau-loaded",
        "modprobe: ERROR: could not insert 'nvidia': No such device",
    ),
    "gpu-node-0002": (
        "unsigned-module",
        "modprobe: ERROR: could not insert 'nvidia': Key was rejected by service",
    ),
    "gpu-node-0003": ("kernel-headers", "E: Unable to locate package linux-headers-6.8.0-1029-gke"),
}
"""Per node, the rule and the driver container's line (gpu-driver-container's script and
the kernel's words users report: NVIDIA/gpu-operator#206, #497, #1726)."""
DEV_CHAR_LINE = (
    "check failed check=driver reason='cannot link /dev/char: [Errno 30] Read-only file"
    " system: /host-dev-char/195:0'"
)
"""Our validator's words (gpuop/nodeagent/driver.py) in its driver-validation log."""


async def test_log_signatures_in_a_support_bundle(
    local_cluster: ClusterInfo, rest: Rest, cleanup: list[tuple[str, str]], tmp_path: Path
) -> None:
    """A bundle of this cluster, then the same bundle unpacked with the nodes' log lines
    written in: one finding per rule, each naming its node and container."""
    drivers = {}
    for node in LOG_LINES:
        pod = await running(rest, driver_pod(node, "logs"))
        drivers[node] = pod["metadata"]["name"]
        cleanup.append((NAMESPACE, drivers[node]))
    validator = bare_pod(
        "nvidia-operator-validator-doctor",
        NAMESPACE,
        "gpu-node-0000",
        labels={"app": "nvidia-operator-validator"},
        initContainers=[{"name": "driver-validation", "image": "gpuop"}],
    )
    await running(rest, validator)
    cleanup.append((NAMESPACE, validator["metadata"]["name"]))

    archive = tmp_path / "bundle.tar.gz"
    proc = await asyncio.to_thread(
        subprocess.run,
        [
            sys.executable,
            "-m",
            "gpuop",
            "support-bundle",
            "--kubeconfig",
            str(local_cluster.kubeconfig),
            "--namespace",
            NAMESPACE,
            "--since",
            "5m",
            "--output",
            str(archive),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    _, lines = await doctor(local_cluster, "--bundle", str(archive))
    rules = [rule for rule, _ in LOG_LINES.values()] + ["dev-char-links"]
    assert not [line for line in lines if line.split(":")[0] in rules], lines  # kwok: no logs

    unpacked = tmp_path / "unpacked"
    with tarfile.open(archive) as tar:
        tar.extractall(unpacked, filter="data")
    (root,) = unpacked.iterdir()
    assert json.loads((root / "manifest.json").read_text())["namespace"] == NAMESPACE
    logs = {(drivers[node], "nvidia-driver-ctr"): line for node, (_, line) in LOG_LINES.items()}
    logs[validator["metadata"]["name"], "driver-validation"] = DEV_CHAR_LINE
    for (pod, container), line in logs.items():
        log = root / "logs" / pod / f"{container}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"2026-01-01T00:00:00Z starting\n2026-01-01T00:00:01Z {line}\n")
    code, lines = await doctor(local_cluster, "--bundle", str(unpacked))
    assert code == 1
    for node, (rule, _) in LOG_LINES.items():
        (line,) = of_rule(lines, rule)
        assert f"node/{node}, pod/{NAMESPACE}/{drivers[node]} (nvidia-driver-ctr)" in line
    (line,) = of_rule(lines, "dev-char-links")
    assert "node/gpu-node-0000" in line
    assert "DISABLE_DEV_CHAR_SYMLINK_CREATION=true" in line
