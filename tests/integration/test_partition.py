"""A network partition: one GPU node's heartbeat stops for two minutes while operands
change, the operator running. Kubernetes only taints such a node; the operator must not
do more (issue 35).

That node is played by a kwok process of this test's own (the cluster's kwok keeps
heartbeating a node whatever its annotation says once it took it), frozen with
SIGSTOP: no lease renewal, no pod started or deletion confirmed there, exactly a kubelet
cut off from the API server; SIGCONT brings it back with its state.

A watcher over every operand pod (a watch, not polls) records, at each event: any pod
removed without a graceful deletion, or removed from the partitioned node while no
kubelet is there to confirm it (a force deletion, whoever sent it); any pod created on
the partitioned node before it returns; any moment two driver pods share a node. After
the node returns, its rolled pods are replaced there.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

import crd
from gpuop.devcluster import NFD_GPU_LABEL, BinaryPaths, ClusterInfo, Versions, cache_dir
from gpuop.devcluster._nodes import KWOK_ANNOTATION, node_manifest
from gpuop.kube.client import api_client as make_api_client
from gpuop.kube.kinds import KINDS, by_kind
from gpuop.kube.rest import Rest
from gpuop.operator.controller import OperatorConfig
from gpuop.operator.install import ensure_namespace, install_crd
from statemachine.node_rollout import UNREACHABLE_TAINT
from tests.integration.harness import (
    NAMESPACE,
    NODE,
    Running,
    cluster_dir,
    eventually,
    own_cluster,
    policy_state_is,
    watch_from,
)

pytestmark = [pytest.mark.integration, pytest.mark.partition]

POD = by_kind("v1", "Pod")
EVENT = by_kind("v1", "Event")
SUFFIX = "-partition"
#: GPU nodes of the cluster's own kwok, and the one the test partitions.
STEADY_GPU_NODES = 2
LOST = node_manifest(9, True)["metadata"]["name"]
LOST_KWOK = "partition"
"""The value of kwok's annotation on the partitioned node: only the test's kwok plays it."""
#: How long the node stays partitioned once the operand change is applied: what the
#: issue asks for, time for a rolling update to reach every other node and for the
#: operator to run many passes over the partitioned node.
PARTITION_S = 120.0
DEVICE_PLUGIN = "nvidia-device-plugin-daemonset"
DRIVER = "nvidia-driver-daemonset"
NEW_PLUGIN = "v0.99.1"
NEW_DRIVER = "600.10.01"
DRIVER_COMPONENT_LABEL = "app.kubernetes.io/component"
DRIVER_COMPONENTS = ("nvidia-driver", "nvidia-vgpu-host-manager")


@pytest.fixture(scope="module")
def fleet() -> Iterator[ClusterInfo]:
    with own_cluster(SUFFIX, gpu_nodes=STEADY_GPU_NODES) as info:
        yield info


@pytest.fixture(scope="module")
def lost_kubelet(fleet: ClusterInfo) -> Iterator[subprocess.Popen[bytes]]:
    """kwok for the partitioned node alone, run as the cluster runs its own."""
    directory = cluster_dir(SUFFIX)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with (directory / "logs" / "kwok-partitioned.log").open("wb") as log:
        proc = subprocess.Popen(
            [
                str(BinaryPaths.under(cache_dir(), Versions.from_env()).kwok),
                f"--config={directory / 'kwok.yaml'}",
                f"--kubeconfig={fleet.kubeconfig}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}={LOST_KWOK}",
                "--node-lease-duration-seconds=40",
                f"--server-address=127.0.0.1:{port}",
                "--cidr=10.245.0.0/16",
                "--node-ip=10.240.0.2",
                "--v=INFO",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        yield proc
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
async def rest(fleet: ClusterInfo, lost_kubelet: subprocess.Popen[bytes]) -> AsyncIterator[Rest]:
    async with make_api_client(fleet.kubeconfig, user_agent="gpuop-tests") as api:
        rest = Rest(api, KINDS)
        await install_crd(rest)
        await ensure_namespace(rest, NAMESPACE)
        node = node_manifest(9, True)
        node["metadata"]["annotations"][KWOK_ANNOTATION] = LOST_KWOK
        await rest.create(NODE, node)

        async def ready() -> bool:
            return _node_ready(await _node(rest, LOST)) == "True"

        await eventually(ready, 60, 0.5, "the partitionable node Ready")
        yield rest


def _policy() -> dict[str, Any]:
    """The sample policy with ``autoUpgrade`` off: the driver DaemonSet rolls its pods
    itself (RollingUpdate), so a driver change reaches the partitioned node too."""
    policy = copy.deepcopy(crd.sample_policy())
    policy["spec"]["driver"]["upgradePolicy"]["autoUpgrade"] = False
    return policy


def _ready(pod: dict[str, Any]) -> bool:
    return not pod["metadata"].get("deletionTimestamp") and any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in pod.get("status", {}).get("conditions") or []
    )


def _is_driver(pod: dict[str, Any]) -> bool:
    labels = pod["metadata"].get("labels") or {}
    return labels.get(DRIVER_COMPONENT_LABEL) in DRIVER_COMPONENTS


@dataclass
class Watcher:
    """Every operand pod event, each followed by the checks."""

    rest: Rest
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    partitioned: str | None = None
    """The node with no kubelet right now (None once it returned)."""
    forced: list[str] = field(default_factory=list)
    early: list[str] = field(default_factory=list)
    doubles: list[str] = field(default_factory=list)
    events: int = 0
    synced: bool = False

    async def run(self) -> None:
        call = self.rest.lister(POD, NAMESPACE)
        resp = await call()
        assert resp.status == 200, await resp.read()
        body = json.loads(await resp.read())
        self.pods.update({o["metadata"]["name"]: o for o in body["items"]})
        rv = body["metadata"]["resourceVersion"]
        self.synced = True
        async for kind_of_event, obj in watch_from(call, rv, "pods"):
            self.observe(kind_of_event, obj)

    def observe(self, kind: str, pod: dict[str, Any]) -> None:
        self.events += 1
        meta = pod["metadata"]
        name = meta["name"]
        node = pod["spec"].get("nodeName")
        before = self.pods.get(name)
        what = f"{kind} {name} on {node} (rv {meta['resourceVersion']})"
        if kind == "DELETED":
            self.pods.pop(name, None)
            graceful = before is not None and before["metadata"].get("deletionTimestamp")
            if not graceful or (node is not None and node == self.partitioned):
                self.forced.append(what)
        else:
            self.pods[name] = pod
            if meta.get("deletionGracePeriodSeconds") == 0 and not (
                before and before["metadata"].get("deletionTimestamp")
            ):
                self.forced.append(f"{what}: deletionGracePeriodSeconds 0")
            if kind == "ADDED" and node is not None and node == self.partitioned:
                self.early.append(what)
        per_node: dict[str, list[str]] = {}
        for other in self.pods.values():
            bound = other["spec"].get("nodeName")
            if bound and _is_driver(other):
                per_node.setdefault(bound, []).append(other["metadata"]["name"])
        for bound, names in per_node.items():
            if len(names) > 1:
                self.doubles.append(f"after {what}: {bound} has {sorted(names)}")


async def _gpu_nodes(rest: Rest) -> list[str]:
    return sorted(
        n["metadata"]["name"]
        for n in await rest.list(NODE)
        if (n["metadata"].get("labels") or {}).get(NFD_GPU_LABEL) == "true"
    )


async def _node(rest: Rest, name: str) -> dict[str, Any]:
    node = await rest.get(NODE, name)
    assert node is not None
    return node


def _node_ready(node: dict[str, Any]) -> str | None:
    return next(
        (c["status"] for c in node["status"].get("conditions") or [] if c["type"] == "Ready"),
        None,
    )


def _new(pod: dict[str, Any]) -> bool:
    image = pod["spec"]["containers"][0]["image"]
    app = pod["metadata"]["labels"].get("app")
    return (app == DEVICE_PLUGIN and NEW_PLUGIN in image) or (app == DRIVER and NEW_DRIVER in image)


async def _rolled_on(rest: Rest, node: str) -> list[str]:
    """The rolled operands (device plugin, driver) that lack a Ready new pod on ``node``."""
    pods = [p for p in await rest.list(POD, NAMESPACE) if p["spec"].get("nodeName") == node]
    return [
        app
        for app in (DEVICE_PLUGIN, DRIVER)
        if not any(
            p["metadata"]["labels"].get("app") == app and _ready(p) and _new(p) for p in pods
        )
    ]


async def test_a_partitioned_node_loses_no_pod_until_it_returns(
    rest: Rest, fleet: ClusterInfo, lost_kubelet: subprocess.Popen[bytes]
) -> None:
    policy = _policy()
    await rest.apply(policy)
    config = OperatorConfig(namespace=NAMESPACE, workers=4)
    watcher = Watcher(rest)
    watching: asyncio.Task[None] | None = None
    async with (
        make_api_client(fleet.kubeconfig, user_agent="gpuop-operator") as api,
        Running(api, config),
    ):
        await eventually(lambda: policy_state_is(rest, "ready"), 240, 1.0, "policy ready")
        gpu = await _gpu_nodes(rest)
        assert len(gpu) == STEADY_GPU_NODES + 1
        assert LOST in gpu
        lost = LOST
        watching = asyncio.create_task(watcher.run())
        try:
            await eventually(lambda: _true(watcher.synced), 30, what="watcher listed")

            # The heartbeat stops: that node's kubelet is cut off.
            watcher.partitioned = lost
            os.kill(lost_kubelet.pid, signal.SIGSTOP)

            async def unreachable() -> bool:
                node = await _node(rest, lost)
                taints = node["spec"].get("taints") or []
                return _node_ready(node) == "Unknown" and any(
                    t["key"] == UNREACHABLE_TAINT for t in taints
                )

            await eventually(unreachable, 240, 1.0, "node lifecycle controller's verdict")

            # An operand change while the node is gone: both DaemonSets roll.
            policy["spec"]["devicePlugin"]["version"] = NEW_PLUGIN
            policy["spec"]["driver"]["version"] = NEW_DRIVER
            await rest.apply(policy)
            started = time.monotonic()
            while time.monotonic() - started < PARTITION_S:
                if watching.done():
                    watching.result()
                await asyncio.sleep(1.0)
            during = list(watcher.forced), list(watcher.early), list(watcher.doubles)

            # The node returns: its kubelet heartbeats again and confirms the deletions.
            watcher.partitioned = None
            os.kill(lost_kubelet.pid, signal.SIGCONT)
            await eventually(
                lambda: _true_async(_node(rest, lost), lambda n: _node_ready(n) == "True"),
                120,
                1.0,
                "node Ready again",
            )
            await eventually(lambda: _none_missing(rest, lost), 240, 1.0, "replaced on return")
            for name in gpu:
                await eventually(lambda n=name: _none_missing(rest, n), 240, 1.0, "rolled")
            if watching.done():
                watching.result()
        finally:
            if watching is not None:
                watching.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watching

    forced, early, doubles = during
    assert watcher.events > 0
    assert forced == [], f"{len(forced)} force deletions during the partition: {forced[:10]}"
    assert early == [], f"pods placed on the partitioned node before it returned: {early[:10]}"
    assert doubles == [], f"two driver pods on one node: {doubles[:10]}"
    assert watcher.forced == [], f"force deletions after the return: {watcher.forced[:10]}"
    assert watcher.doubles == [], f"two driver pods on one node: {watcher.doubles[:10]}"


async def _true(value: bool) -> bool:
    return value


async def _true_async(obj: Any, test: Any) -> bool:
    return bool(test(await obj))


async def _none_missing(rest: Rest, node: str) -> bool:
    return not await _rolled_on(rest, node)
