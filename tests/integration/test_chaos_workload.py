"""Chaos on the VM hand-over: six GPU nodes switched at random between container,
vm-passthrough and vm-vgpu (``nvidia.com/gpu.workload.config``) while the operator, its
own process, is SIGKILLed at random moments; first under the ClusterPolicy's driver,
then under two NVIDIADrivers (one precompiled), the flip itself among the chaos.

GPU workload pods are placed, as an administrator's scheduler would, only on nodes
that serve containers and run their driver; a node switched to a VM workload is
drained by the test a random moment later, so the hand-over must hold the VM claim
for them. Some switches are followed at once by another of the same node, as the
first claim label lands and before its pod has reached every cache. A watcher over
every pod and node event checks at each observed moment:

* never two GPU claimants' pods (NVIDIA driver, VFIO manager, vGPU manager) on one
  node, two driver pods included: a pod counts from its binding until its DELETED
  event, terminating ones too (a deletionTimestamp kwok has not acted on yet);
* never a GPU workload pod (one asking for ``nvidia.com/gpu``, not finished) on a node
  with a VFIO or vGPU manager pod (its GPUs bound to ``vfio-pci`` or the vGPU host
  driver);
* never two claim labels (``nvidia.com/gpu.deploy.{driver,vfio-manager,vgpu-manager}``)
  on one node;
* and, judged against the pods at the very revision a claim label appeared: no other
  claimant's pod there then, and for a VM claim no GPU workload pod either.

In the end every node serves its last asked workload: exactly its claimant's pod,
Ready, and its claim label alone. The seed is printed (``GPUOP_CHAOS_SEED`` replays
one's decisions).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import random
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from components.keys import (
    CONTAINER_WORKLOAD,
    DEPLOY_DRIVER_LABEL,
    DEPLOY_VFIO_MANAGER_LABEL,
    DEPLOY_VGPU_MANAGER_LABEL,
    VM_PASSTHROUGH_WORKLOAD,
    VM_VGPU_WORKLOAD,
    WORKLOAD_CONFIG_LABEL,
    WORKLOADS,
)
from gpuop.devcluster import ClusterInfo
from gpuop.kube.client import api_client as make_api_client
from gpuop.kube.kinds import KINDS, by_kind
from gpuop.kube.rest import Rest
from gpuop.operator.install import ensure_namespace, install_crd
from tests.integration.chaos_support import (
    EveryEvent,
    Killer,
    chaos_seed,
    labels_of,
    marker_pod,
    node_of,
    pod_ready,
)
from tests.integration.harness import eventually, own_cluster
from tests.integration.test_chaos import NODE, OPERATOR_NS, POD, POLICY, OperatorProcess
from tests.integration.test_sandbox import POLICY_DOC

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

GPU_NODES = 6
NODES = tuple(f"gpu-node-{i:04d}" for i in range(GPU_NODES))
POOL = frozenset(NODES[4:])
"""The precompiled NVIDIADriver's nodes in the second phase."""
POOL_LABEL = "nvidia.com/chaos-precompiled"  # nvidia.com/: a label the operator's cache keeps
NVD = by_kind("nvidia.com/v1alpha1", "NVIDIADriver")
WORKLOAD_NS = "chaos-vm-workload"
STEPS = 24
"""Random actions (a switch or a GPU pod placed) per phase."""
KILLS = 6
"""SIGKILLs per phase, each a moment after one of the steps."""
SETTLE_TIMEOUT = 150.0
"""Generous for 2 busy cores: a hand-over is a few seconds here."""

DRIVER, VFIO, VGPU = "driver", "vfio-manager", "vgpu-manager"
CLAIM_LABELS = {DEPLOY_DRIVER_LABEL: DRIVER, DEPLOY_VFIO_MANAGER_LABEL: VFIO}
CLAIM_LABELS[DEPLOY_VGPU_MANAGER_LABEL] = VGPU
CLAIMANT_OF_WORKLOAD = {
    CONTAINER_WORKLOAD: DRIVER,
    VM_PASSTHROUGH_WORKLOAD: VFIO,
    VM_VGPU_WORKLOAD: VGPU,
}
#: The test's own reading of what a pod is (``app.kubernetes.io/component``, as every
#: operand carries it), not the operator's ``claimant_of``.
CLAIMANT_COMPONENTS = {
    "nvidia-driver": DRIVER,
    "vfio-manager": VFIO,
    "vgpu-manager": VGPU,
    "nvidia-vgpu-host-manager": VGPU,
}


def claimant(pod: dict[str, Any]) -> str | None:
    return CLAIMANT_COMPONENTS.get(labels_of(pod).get("app.kubernetes.io/component", ""))


def gpu_pod(pod: dict[str, Any]) -> bool:
    """A workload holding a GPU: asks for ``nvidia.com/gpu`` and has not finished."""
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return False
    return any(
        "nvidia.com/gpu" in ((c.get("resources") or {}).get(section) or {})
        for c in (pod.get("spec") or {}).get("containers") or []
        for section in ("limits", "requests")
    )


def claims_of(node: dict[str, Any]) -> frozenset[str]:
    labels = labels_of(node)
    return frozenset(c for key, c in CLAIM_LABELS.items() if labels.get(key) == "true")


@dataclass(frozen=True)
class Held:
    """One node's GPU holders at one revision: claimant pods (one entry per pod) and
    GPU workload pods."""

    claimants: tuple[str, ...]
    gpu_pods: tuple[str, ...]


@dataclass
class HandoverWatch(EveryEvent):
    """The checks of the module docstring; claim labels appearing (while ``armed``) are
    kept as grants, judged by :meth:`judge_grants` once the pod stream read past them."""

    armed: bool = False
    claims: dict[str, frozenset[str]] = field(default_factory=dict)
    grants: list[tuple[str, str, int]] = field(default_factory=list)
    handovers: int = 0
    #: Per node, (revision, workload label, claim labels) at each node event.
    labels: dict[str, list[tuple[int, str, tuple[str, ...]]]] = field(default_factory=dict)
    #: Nodes a violation names, for :meth:`timeline`.
    suspects: dict[str, None] = field(default_factory=dict)

    def snapshot(self, node: str, pods: list[dict[str, Any]]) -> Held:
        holders = sorted((c, p["metadata"]["name"]) for p in pods if (c := claimant(p)))
        gpu = sorted(p["metadata"]["name"] for p in pods if gpu_pod(p))
        return Held(tuple(c for c, _ in holders), tuple(gpu))

    def observe(self, stream: str, what: str, rv: int, nodes: list[str]) -> None:
        if stream == "Pod":
            for node in nodes:
                held = self.history[node][-1][1]
                vm = {VFIO, VGPU} & set(held.claimants)
                if len(held.claimants) > 1 or (vm and held.gpu_pods):
                    self.suspects[node] = None
                    self.violations.append(f"{what}: {node} holds {held}")
            return
        for name in nodes:
            obj = self.nodes.get(name)
            if obj is None:
                continue
            now = claims_of(obj)
            workload = labels_of(obj).get(WORKLOAD_CONFIG_LABEL, "")
            self.labels.setdefault(name, []).append((rv, workload, tuple(sorted(now))))
            if len(now) > 1:
                self.suspects[name] = None
                self.violations.append(f"{what}: {name} carries claim labels {sorted(now)}")
            before = self.claims.get(name, frozenset())
            if self.armed:
                for claim in sorted(now - before):
                    self.grants.append((name, claim, rv))
            self.claims[name] = now

    def judge_grants(self) -> list[str]:
        """Each claim label granted while another claimant's pod, or (for a VM claim) a
        GPU workload pod, was on the node at that revision."""
        found = []
        for node, claim, rv in self.grants:
            held = self.at(node, rv)
            others = sorted(set(held.claimants) - {claim})
            if others or (claim != DRIVER and held.gpu_pods):
                self.suspects[node] = None
                found.append(f"{claim} label on {node} at rv={rv} while it held {held}")
            self.handovers += 1
        return found

    def timeline(self, node: str) -> str:
        """The node's pod snapshots and labels by revision, for a failure message."""
        events = [(rv, f"pods {held}") for rv, held in self.history.get(node, [])]
        events += [(rv, f"label {w!r}, claims {c}") for rv, w, c in self.labels.get(node, [])]
        return f"{node}:\n" + "\n".join(f"  rv={rv} {text}" for rv, text in sorted(events))


@pytest.fixture(scope="module")
def vm_cluster() -> Iterator[ClusterInfo]:
    with own_cluster("-chaos-workload", gpu_nodes=GPU_NODES) as info:
        yield info


@pytest.fixture(scope="module")
async def vm_rest(vm_cluster: ClusterInfo) -> AsyncIterator[Rest]:
    async with make_api_client(vm_cluster.kubeconfig, user_agent="gpuop-chaos-vm") as api:
        rest = Rest(api, KINDS)
        await install_crd(rest)
        for namespace in (OPERATOR_NS, WORKLOAD_NS):
            await ensure_namespace(rest, namespace)
        yield rest


def _nvd(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "NVIDIADriver",
        "metadata": {"name": name},
        "spec": spec,
    }


async def _workload_label(rest: Rest, node: str, workload: str) -> None:
    await rest.merge_patch(NODE, node, {"metadata": {"labels": {WORKLOAD_CONFIG_LABEL: workload}}})


@dataclass
class Fleet:
    """The administrator: what each node was last asked to serve, its GPU pods, drains."""

    rest: Rest
    rng: random.Random
    asked: dict[str, str]
    nvidiadrivers: bool = False
    drains: list[asyncio.Task[None]] = field(default_factory=list)
    placed: int = 0
    switches: int = 0
    #: Drains that found the node still holding its VM claim for the GPU pods.
    held_for_pods: int = 0
    _names: Iterator[int] = field(default_factory=itertools.count)

    async def state(self) -> tuple[dict[str, dict[str, Any]], dict[str, list[dict[str, Any]]]]:
        """Nodes, and each GPU node's claimant pods (fresh reads)."""
        nodes = {n["metadata"]["name"]: n for n in await self.rest.list(NODE)}
        pods: dict[str, list[dict[str, Any]]] = {n: [] for n in NODES}
        for pod in await self.rest.list(POD, OPERATOR_NS):
            node = node_of(pod)
            if node in pods and claimant(pod):
                pods[node].append(pod)
        return nodes, pods

    def serves(self, name: str, node: dict[str, Any], pods: list[dict[str, Any]]) -> str | None:
        """None when the node serves its asked workload; else what is left."""
        workload = self.asked[name]
        want = CLAIMANT_OF_WORKLOAD[workload]
        got = [(claimant(p), pod_ready(p)) for p in pods]
        if labels_of(node).get(WORKLOAD_CONFIG_LABEL) != workload:
            return f"{name}: label is not {workload}"
        if got != [(want, True)] or claims_of(node) != {want}:
            return f"{name} ({workload}): pods {got}, claims {sorted(claims_of(node))}"
        if want == DRIVER:
            labels = labels_of(pods[0])
            policy = labels.get("app") == "nvidia-driver-daemonset"
            precompiled = labels.get("nvidia.com/precompiled") == "true"
            if policy == self.nvidiadrivers or precompiled != (self.nvidiadrivers and name in POOL):
                return f"{name}: driver pod {labels.get('app')} precompiled={precompiled}"
            if node["spec"].get("unschedulable"):
                return f"{name}: cordoned"
        return None

    async def left(self) -> list[str]:
        nodes, pods = await self.state()
        return [w for n in NODES if (w := self.serves(n, nodes[n], pods[n])) is not None]

    async def switch(self, node: str) -> None:
        workload = self.rng.choice([w for w in WORKLOADS if w != self.asked[node]])
        self.asked[node] = workload
        self.switches += 1
        await _workload_label(self.rest, node, workload)
        if workload != CONTAINER_WORKLOAD and await self._gpu_pods(node):
            delay = self.rng.uniform(0.5, 6.0)
            self.drains.append(asyncio.create_task(self._drain(node, delay)))

    async def place(self, node: str) -> bool:
        """A GPU pod on ``node`` if it serves containers now (its driver Ready), as the
        device plugin would admit one; False when it does not."""
        nodes, pods = await self.state()
        if self.asked[node] != CONTAINER_WORKLOAD or self.serves(node, nodes[node], pods[node]):
            return False
        name = f"cuda-{next(self._names)}"
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": WORKLOAD_NS, "labels": {"chaos": "gpu"}},
            "spec": {
                "nodeName": node,
                "terminationGracePeriodSeconds": 0,
                "containers": [
                    {
                        "name": "cuda",
                        "image": "cuda-sample",
                        "resources": {"limits": {"nvidia.com/gpu": "1"}},
                    }
                ],
            },
        }
        await self.rest.create(POD, pod, WORKLOAD_NS)
        self.placed += 1
        return True

    async def _gpu_pods(self, node: str) -> list[str]:
        pods = await self.rest.list(POD, WORKLOAD_NS, field_selector=f"spec.nodeName={node}")
        return [p["metadata"]["name"] for p in pods if gpu_pod(p)]

    async def _drain(self, node: str, delay: float) -> None:
        """The administrator empties the node of its GPU pods a moment later."""
        await asyncio.sleep(delay)
        got = await self.rest.get(NODE, node)
        want = CLAIMANT_OF_WORKLOAD[self.asked[node]]
        if got is not None and want != DRIVER and want not in claims_of(got):
            self.held_for_pods += 1
        for name in await self._gpu_pods(node):
            await self.rest.delete(POD, name, WORKLOAD_NS)

    async def drained(self) -> None:
        await asyncio.gather(*self.drains)
        self.drains.clear()


async def _landed(watcher: HandoverWatch, fleet: Fleet, node: str) -> None:
    """Until the watcher sees the node's asked claim label on it (5 s at most: a claim
    held for GPU pods lands later)."""
    want = {CLAIMANT_OF_WORKLOAD[fleet.asked[node]]}
    deadline = asyncio.get_running_loop().time() + 5.0
    while asyncio.get_running_loop().time() < deadline:
        if claims_of(watcher.nodes.get(node) or {"metadata": {}}) == want:
            return
        await asyncio.sleep(0.01)


async def _chaos(fleet: Fleet, kill: Killer, phase: str, watcher: HandoverWatch) -> None:
    """``STEPS`` random actions, ``KILLS`` of them followed by a SIGKILL a moment later."""
    rng = fleet.rng
    kill_after = set(rng.sample(range(STEPS), KILLS))
    for step in range(STEPS):
        await asyncio.sleep(rng.uniform(0.2, 2.0))
        hosts = [n for n in NODES if fleet.asked[n] == CONTAINER_WORKLOAD]
        if hosts and rng.random() < 0.35:
            await fleet.place(rng.choice(hosts))
        else:
            node = rng.choice(NODES)
            await fleet.switch(node)
            if rng.random() < 0.3:
                # A change of mind: switched again as the first claim label lands,
                # before its pod has reached every cache.
                await _landed(watcher, fleet, node)
                await asyncio.sleep(rng.uniform(0.0, 0.2))
                await fleet.switch(node)
        if step in kill_after:
            await asyncio.sleep(rng.uniform(0.0, 1.5))
            kill(f"{phase} step {step}")


async def _settled(
    fleet: Fleet, phase: str, watcher: HandoverWatch, watching: asyncio.Task[None]
) -> None:
    await fleet.drained()

    async def serving() -> bool:
        if watching.done():
            watching.result()
        return not await fleet.left()

    try:
        await eventually(serving, SETTLE_TIMEOUT, interval=1.0, what=f"{phase}: settled")
    except AssertionError as err:
        raise AssertionError(
            f"{err}\nleft: {await fleet.left()}\nviolations so far: {watcher.violations[:5]}"
        ) from err


async def test_sigkilled_operator_hands_gpus_between_workloads_one_claimant_at_a_time(
    vm_cluster: ClusterInfo, vm_rest: Rest, tmp_path: Path
) -> None:
    rest = vm_rest
    seed, rng = chaos_seed()
    asked = {n: rng.choice(WORKLOADS) for n in NODES}
    fleet = Fleet(rest, rng, asked)
    operator = OperatorProcess(vm_cluster.kubeconfig, tmp_path)
    kill = Killer(operator)
    watcher = HandoverWatch(rest)
    watching = asyncio.create_task(watcher.run())
    marker = await marker_pod(rest, WORKLOAD_NS, "cpu-node-0000")
    try:
        for node in NODES:
            pool = "true" if node in POOL else None
            patch = {WORKLOAD_CONFIG_LABEL: asked[node], POOL_LABEL: pool}
            await rest.merge_patch(NODE, node, {"metadata": {"labels": patch}})
        await watcher.catch_up(rest, marker, NODES[0])
        watcher.armed = True
        policy = copy.deepcopy(POLICY_DOC)
        await rest.apply(policy)
        operator.start()
        await _settled(fleet, "initial rollout", watcher, watching)

        # Phase 1: the ClusterPolicy's driver.
        await _chaos(fleet, kill, "ClusterPolicy", watcher)
        await _settled(fleet, "ClusterPolicy", watcher, watching)

        # Phase 2: two NVIDIADrivers take the nodes over, one precompiled; the chaos
        # goes on while they do.
        fleet.nvidiadrivers = True
        await rest.apply(_nvd("default", default=True, version="580.95.05"))
        await rest.apply(
            _nvd(
                "precompiled", usePrecompiled=True, version="580", nodeSelector={POOL_LABEL: "true"}
            )
        )
        await rest.merge_patch(
            POLICY, "cluster-policy", {"spec": {"driver": {"useNvidiaDriverCRD": True}}}
        )
        await _chaos(fleet, kill, "NVIDIADriver", watcher)
        await _settled(fleet, "NVIDIADriver", watcher, watching)
        kill.alive()

        await watcher.catch_up(rest, marker, NODES[0])
        watcher.violations.extend(watcher.judge_grants())
        if watcher.violations:
            raise AssertionError(
                f"seed {seed}, kills {kill.kills}; {len(watcher.violations)} violations, "
                "first:\n"
                + "\n".join(watcher.violations[:8])
                + "\n"
                + "\n".join(watcher.timeline(n) for n in list(watcher.suspects)[:2])
            )
        assert fleet.switches >= STEPS, fleet.switches  # both phases switched nodes
        print(
            f"chaos (VM hand-over): seed {seed}, {fleet.switches} switches, "
            f"{fleet.placed} GPU pods placed, {fleet.held_for_pods} VM claims held for GPU "
            f"pods, {watcher.handovers} claims granted, kills {kill.kills}, "
            f"{watcher.observations} observations"
        )
    except BaseException:
        print(f"chaos seed {seed}: kills {kill.kills}\n{operator.tail()}")
        raise
    finally:
        operator.stop()
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await watching
