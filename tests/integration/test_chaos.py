"""Chaos: the operator as its own process, SIGKILLed at random moments during a
12-node driver upgrade with a GPU workload under a PodDisruptionBudget.

Progress lives in node labels, so every restart must resume where the last one
stopped. A watcher (watches, not polls) checks every observed moment: nodes in
progress within ``maxParallelUpgrades``, nodes made unavailable within
``maxUnavailable``, the workload's healthy pods never below ``minAvailable``. In the
end every node is ``upgrade-done`` on the new driver, none cordoned, the workload
available. The seed is printed (``GPUOP_CHAOS_SEED`` replays one).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes_asyncio import client

import crd
from gpuop.devcluster import NFD_GPU_LABEL, ClusterInfo
from gpuop.kube.client import api_client as make_api_client
from gpuop.kube.kinds import KINDS, by_kind
from gpuop.kube.rest import Kind, Rest
from gpuop.operator.install import ensure_namespace, install_crd
from statemachine.driver_owner import NEXT_OWNER_LABEL
from statemachine.upgrade_keys import (
    IN_PROGRESS_STATES,
    STATE_LABEL,
    STATE_SINCE_ANNOTATION,
    UpgradeState,
)
from tests.integration.harness import eventually, own_cluster, watch_from
from tests.integration.harness import free_port as _free_port

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

GPU_NODES = 12
MAX_PARALLEL = 3
MAX_UNAVAILABLE = "25%"
BUDGET = 3  # 25% of 12
KILLS = 10
#: The first change, then more should an upgrade finish before the tenth kill.
DRIVER_VERSIONS = ("600.10.01", "610.0.0", "620.0.0", "630.0.0", "640.0.0", "650.0.0")
REPLICAS = 16
MIN_AVAILABLE = REPLICAS - 1  # one disruption at a time: any two at once violate it
OPERATOR_NS = "gpu-operator"
WORKLOAD_NS = "chaos-workload"
APP = "chaos-trainer"
NODE = by_kind("v1", "Node")
POD = by_kind("v1", "Pod")
POLICY = by_kind("nvidia.com/v1", "ClusterPolicy")
DEPLOYMENT = by_kind("apps/v1", "Deployment")
#: Bounds of the whole test's phases (seconds); generous for 2 busy cores.
ROLLOUT_TIMEOUT = 180.0
#: A kill during an eviction request often leaves the PDB holding the pod in
#: ``status.disruptedPods`` while the pod is never deleted (the server's pod delete is
#: cancelled with the connection); the disruption controller forgets it only after
#: two minutes, and with ``minAvailable = replicas - 1`` every eviction waits for that.
#: Most runs take ~2.5 minutes for this reason; the bound leaves room for two such waits.
UPGRADE_TIMEOUT = 300.0


@pytest.fixture(scope="module")
def chaos_cluster() -> Iterator[ClusterInfo]:
    """A cluster of its own: the session cluster has too few GPU nodes."""
    with own_cluster("-chaos", gpu_nodes=GPU_NODES) as info:
        yield info


@pytest.fixture(scope="module")
async def chaos_rest(chaos_cluster: ClusterInfo) -> AsyncIterator[Rest]:
    async with make_api_client(chaos_cluster.kubeconfig, user_agent="gpuop-chaos") as api:
        rest = Rest(api, KINDS)
        await install_crd(rest)
        await ensure_namespace(rest, OPERATOR_NS)
        await ensure_namespace(rest, WORKLOAD_NS)
        yield rest


def _policy(version: str) -> dict[str, Any]:
    policy = copy.deepcopy(crd.sample_policy())
    policy["spec"]["driver"]["version"] = version
    policy["spec"]["driver"]["upgradePolicy"] = {
        "autoUpgrade": True,
        "maxParallelUpgrades": MAX_PARALLEL,
        "maxUnavailable": MAX_UNAVAILABLE,
        # No time limits: a restart must not turn a slow step into a failure.
        "podDeletion": {"timeoutSeconds": 0},
        "drain": {"enable": True, "timeoutSeconds": 0},
    }
    return policy


def _workload() -> tuple[dict[str, Any], dict[str, Any]]:
    labels = {"app": APP}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": APP, "namespace": WORKLOAD_NS},
        "spec": {
            "replicas": REPLICAS,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {NFD_GPU_LABEL: "true"},
                    "terminationGracePeriodSeconds": 0,
                    "topologySpreadConstraints": [
                        {
                            "maxSkew": 1,
                            "topologyKey": "kubernetes.io/hostname",
                            "whenUnsatisfiable": "ScheduleAnyway",
                            "labelSelector": {"matchLabels": labels},
                        }
                    ],
                    "containers": [
                        {
                            "name": "train",
                            "image": "cuda-sample",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ],
                },
            },
        },
    }
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": APP, "namespace": WORKLOAD_NS},
        "spec": {"minAvailable": MIN_AVAILABLE, "selector": {"matchLabels": labels}},
    }
    return deployment, pdb


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    return obj["metadata"].get("labels") or {}


def _ready(obj: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (obj.get("status") or {}).get("conditions") or []
    )


def _in_progress(node: dict[str, Any]) -> bool:
    try:
        return UpgradeState(_labels(node).get(STATE_LABEL, "unknown")) in IN_PROGRESS_STATES
    except ValueError:
        return False


def _budget_use(nodes: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """(nodes upgrading, nodes unavailable: upgrading or cordoned), by name: what the
    upgrade budget counts."""
    in_progress = sorted(n["metadata"]["name"] for n in nodes if _in_progress(n))
    unavailable = sorted(
        n["metadata"]["name"]
        for n in nodes
        if _in_progress(n) or n.get("spec", {}).get("unschedulable")
    )
    return in_progress, unavailable


# ---------------------------------------------------------------- watcher
@dataclass
class Watcher:
    """Every event of two watches, each followed by a check of the invariants."""

    rest: Rest
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    observations: int = 0
    peak_in_progress: int = 0
    peak_unavailable: int = 0
    lowest_healthy: int = REPLICAS
    guard_pods: bool = False
    #: Per node, (resourceVersion, cordoned) at each of its events: what the node was
    #: at a given revision, whatever order the two watches deliver their events in.
    cordons: dict[str, list[tuple[int, bool]]] = field(default_factory=dict)
    #: The kinds whose LIST is done: a write made after it reaches the watch as an event.
    listed: set[str] = field(default_factory=set)

    def cordoned_at(self, node: str, rv: int) -> bool | None:
        """Whether ``node`` was cordoned at etcd revision ``rv`` (None: not known yet,
        the node watch has not reached that revision)."""
        history = self.cordons.get(node) or []
        if not history or history[-1][0] < rv:
            return None  # a later node event may still have come before rv
        before = [cordoned for version, cordoned in history if version <= rv]
        return before[-1] if before else None

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(self._watch(NODE, None, self.nodes, ""))
            group.create_task(self._watch(POD, WORKLOAD_NS, self.pods, f"app={APP}"))

    async def _watch(
        self, kind: Kind, namespace: str | None, store: dict[str, Any], selector: str
    ) -> None:
        call = self.rest.lister(kind, namespace)
        resp = await call(label_selector=selector)
        while resp.status == 429:  # the watch cache is (re)initializing: ask again
            await asyncio.sleep(0.5)
            resp = await call(label_selector=selector)
        assert resp.status == 200, await resp.read()
        body = json.loads(await resp.read())
        store.update({o["metadata"]["name"]: o for o in body["items"]})
        rv = body["metadata"]["resourceVersion"]
        self.listed.add(kind.kind)
        if kind is NODE:
            for o in body["items"]:
                cordoned = bool(o.get("spec", {}).get("unschedulable"))
                self.cordons[o["metadata"]["name"]] = [(int(rv), cordoned)]
        async for kind_of_event, obj in watch_from(call, rv, kind.plural, label_selector=selector):
            name = obj["metadata"]["name"]
            if kind_of_event == "DELETED":
                store.pop(name, None)
            else:
                store[name] = obj
            version = obj["metadata"]["resourceVersion"]
            if kind is NODE:
                self.cordons.setdefault(name, []).append(
                    (int(version), bool(obj.get("spec", {}).get("unschedulable")))
                )
            self.check(f"{kind_of_event} {kind.kind} {name} rv={version}", int(version))

    def check(self, what: str, rv: int = 0) -> None:
        self.observations += 1
        gpu = [n for n in self.nodes.values() if _labels(n).get(NFD_GPU_LABEL) == "true"]
        in_progress, unavailable = _budget_use(gpu)
        self.peak_in_progress = max(self.peak_in_progress, len(in_progress))
        self.peak_unavailable = max(self.peak_unavailable, len(unavailable))
        if len(in_progress) > MAX_PARALLEL:
            self.violations.append(f"{what}: {len(in_progress)} in progress {in_progress}")
        if len(unavailable) > BUDGET:
            self.violations.append(f"{what}: {len(unavailable)} unavailable {unavailable}")
        if self.guard_pods:
            healthy = sorted(
                p["metadata"]["name"]
                for p in self.pods.values()
                if _ready(p) and not p["metadata"].get("deletionTimestamp")
            )
            self.lowest_healthy = min(self.lowest_healthy, len(healthy))
            if len(healthy) < MIN_AVAILABLE:
                self.violations.append(
                    f"{what}: {len(healthy)} healthy pods < minAvailable {MIN_AVAILABLE}"
                )


# --------------------------------------------------------------- operator
@dataclass
class OperatorProcess:
    """`gpuop run` as a process of its own, so a test can SIGKILL it. Ports 0: free
    ones picked at each start (a scraped operator keeps fixed ones)."""

    kubeconfig: Path
    logs: Path
    namespace: str = OPERATOR_NS
    workers: int = 4
    metrics_port: int = 0
    probe_port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    def start(self) -> None:
        self.starts += 1
        log = (self.logs / f"operator-{self.starts:02d}.log").open("wb")
        env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG",)}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpuop",
                "--log-format=json",
                "run",
                f"--kubeconfig={self.kubeconfig}",
                f"--namespace={self.namespace}",
                f"--workers={self.workers}",
                f"--metrics-port={self.metrics_port or _free_port()}",
                f"--probe-port={self.probe_port or _free_port()}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        log.close()

    def kill(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, lines: int = 15) -> str:
        path = self.logs / f"operator-{self.starts:02d}.log"
        if not path.exists():  # a failure before the first start must still say itself
            return "(no operator log: the operator was not started)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


# ------------------------------------------------------------------ helpers
async def _driver_hashes(rest: Rest) -> dict[str, str]:
    pods = await rest.list(POD, OPERATOR_NS, label_selector="app=nvidia-driver-daemonset")
    return {
        p["spec"]["nodeName"]: p["metadata"]["labels"]["controller-revision-hash"]
        for p in pods
        if not p["metadata"].get("deletionTimestamp") and p["spec"].get("nodeName")
    }


async def _gpu_nodes(rest: Rest) -> dict[str, dict[str, Any]]:
    return {
        n["metadata"]["name"]: n
        for n in await rest.list(NODE)
        if _labels(n).get(NFD_GPU_LABEL) == "true"
    }


async def _available(rest: Rest) -> bool:
    got = await rest.get(DEPLOYMENT, APP, WORKLOAD_NS)
    status = (got or {}).get("status") or {}
    return bool(status.get("availableReplicas") == REPLICAS == status.get("updatedReplicas"))


async def test_sigkilled_operator_upgrades_every_node_within_budget_and_pdb(
    chaos_cluster: ClusterInfo, chaos_rest: Rest, tmp_path: Path
) -> None:
    rest = chaos_rest
    seed = int(os.environ.get("GPUOP_CHAOS_SEED") or random.SystemRandom().randrange(2**32))
    rng = random.Random(seed)
    print(f"chaos seed: {seed} (replay with GPUOP_CHAOS_SEED={seed})")
    operator = OperatorProcess(chaos_cluster.kubeconfig, tmp_path)
    watcher = Watcher(rest)
    watching: asyncio.Task[None] | None = None
    try:
        await rest.apply(_policy("595.91.07"))
        operator.start()

        async def policy_ready() -> bool:
            got = await rest.get(POLICY, "cluster-policy")
            return ((got or {}).get("status") or {}).get("state") == "ready"

        await eventually(policy_ready, ROLLOUT_TIMEOUT, interval=0.5, what="initial rollout")
        before = await _driver_hashes(rest)
        assert len(before) == GPU_NODES, before

        deployment, pdb = _workload()
        await rest.apply(deployment)
        await client.PolicyV1Api(rest.api).create_namespaced_pod_disruption_budget(WORKLOAD_NS, pdb)
        await eventually(lambda: _available(rest), 120, interval=0.5, what="workload available")

        watching = asyncio.create_task(watcher.run())
        await eventually(lambda: _seen(watcher), 30, interval=0.5, what="watcher synced")
        watcher.guard_pods = True
        watcher.check("baseline")

        # Each kill must land mid-upgrade: should one finish between two kills, the
        # next driver version starts another (all under the same watcher).
        versions = iter(DRIVER_VERSIONS)
        await rest.apply(_policy(next(versions)))
        rounds = 1
        # (seconds since the first change, upgrade round, nodes upgraded in it) per kill
        kills: list[tuple[float, int, int]] = []
        began = time.monotonic()
        while len(kills) < KILLS:
            # Up to 3 s: some kills land while it starts and syncs, most mid-step.
            await asyncio.sleep(rng.uniform(0.3, 3.0))
            if watching.done():
                watching.result()
            assert operator.alive(), f"operator exited by itself:\n{operator.tail()}"
            done, upgraded, _ = await _upgrade_progress(rest, before)
            if done:
                before = await _driver_hashes(rest)
                await rest.apply(_policy(next(versions)))
                rounds += 1
                continue
            operator.kill()
            kills.append((round(time.monotonic() - began, 1), rounds, upgraded))
            operator.start()

        async def finished() -> tuple[bool, str] | None:
            if watching is not None and watching.done():
                watching.result()
            done, _, detail = await _upgrade_progress(rest, before)
            return (done, detail) if done else None

        try:
            await eventually(
                finished, UPGRADE_TIMEOUT, interval=1.0, what="upgrade after the kills"
            )
        except AssertionError as err:
            raise AssertionError(
                f"{err}\nseed {seed}; kills {kills}; violations {watcher.violations[:5]}\n"
                f"PDB status: {await _pdb_status(rest)}\n{operator.tail()}"
            ) from err
        await eventually(
            lambda: _available(rest), 60, interval=0.5, what="workload available at the end"
        )
        assert operator.alive(), operator.tail()

        if watcher.violations:
            raise AssertionError(
                f"seed {seed}, (s, round, nodes upgraded) at kills {kills}; "
                f"{len(watcher.violations)} violations, first:\n"
                + "\n".join(watcher.violations[:8])
            )
        assert watcher.peak_in_progress >= 1
        nodes = await _gpu_nodes(rest)
        assert all(_labels(n)[STATE_LABEL] == "upgrade-done" for n in nodes.values())
        assert not [n for n, obj in nodes.items() if obj["spec"].get("unschedulable")]
        print(
            f"chaos: seed {seed}, {rounds} upgrade round(s), (s, round, nodes upgraded) at "
            f"kills {kills}, {watcher.observations} observations, "
            f"peak in progress {watcher.peak_in_progress}, peak unavailable "
            f"{watcher.peak_unavailable}, lowest healthy {watcher.lowest_healthy}"
        )
    finally:
        operator.stop()
        if watching is not None:
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watching


async def _pdb_status(rest: Rest) -> object:
    pdb = await client.PolicyV1Api(rest.api).read_namespaced_pod_disruption_budget_status(
        APP, WORKLOAD_NS
    )
    return pdb.status


async def _seen(watcher: Watcher) -> bool:
    gpu = [n for n in watcher.nodes.values() if _labels(n).get(NFD_GPU_LABEL) == "true"]
    return len(gpu) == GPU_NODES and len(watcher.pods) >= REPLICAS


async def _upgrade_progress(rest: Rest, before: dict[str, str]) -> tuple[bool, int, str]:
    """Whether every GPU node runs a new driver pod and is upgrade-done and uncordoned;
    how many nodes are (new driver, upgrade-done); the states for messages."""
    nodes = await _gpu_nodes(rest)
    hashes = await _driver_hashes(rest)
    states = {name: _labels(n).get(STATE_LABEL, "") for name, n in nodes.items()}
    cordoned = sorted(name for name, n in nodes.items() if n["spec"].get("unschedulable"))
    upgraded = sum(
        1 for n in nodes if states[n] == "upgrade-done" and hashes.get(n) not in (None, before[n])
    )
    done = upgraded == len(nodes) and not cordoned
    failed = sorted(n for n, s in states.items() if s == "upgrade-failed")
    assert not failed, f"upgrade failed on {failed}: {states}"
    return done, upgraded, f"states={states} cordoned={cordoned}"


# ------------------------------------------------- NVIDIADriver upgrade and moves
NVD = by_kind("nvidia.com/v1alpha1", "NVIDIADriver")
POOL_LABEL = "nvidia.com/chaos-pool"  # nvidia.com/: a label the operator's cache keeps
NVD_PARALLEL = 2
NVD_UNAVAILABLE = 2
DEFAULT_VERSIONS = ("580.105.08", "580.126.09", "580.65.06", "580.82.07", "580.95.05")
#: Nodes that move to the pool resource in each round (and back in the next).
MOVERS = 3
DRIVER_COMPONENT = "app.kubernetes.io/component=nvidia-driver"


def _nvd(name: str, version: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "NVIDIADriver",
        "metadata": {"name": name},
        "spec": {
            "version": version,
            "upgradePolicy": {
                "autoUpgrade": True,
                "maxParallelUpgrades": NVD_PARALLEL,
                "maxUnavailable": NVD_UNAVAILABLE,
                "podDeletion": {"timeoutSeconds": 0},
                "drain": {"enable": True, "force": True, "timeoutSeconds": 0},
            },
            **spec,
        },
    }


def _target(node: dict[str, Any]) -> str:
    """The resource whose budget the node counts in: the one it moves to, or its owner."""
    labels = _labels(node)
    return labels.get(NEXT_OWNER_LABEL) or labels.get(crd.OWNER_LABEL) or ""


@dataclass
class DriverWatcher(Watcher):
    """Nodes and driver pods; at every event: each resource's budget, every cordoned
    node recorded as the upgrade machine's, never two driver pods on one node, and
    (once ``armed``) a driver pod comes or goes only on a cordoned node."""

    peak_driver_pods: int = 0
    armed: bool = False
    #: Driver pod -> its node, as of the last check.
    _where: dict[str, str] = field(default_factory=dict)
    #: Driver pods that came or went while armed: (what, pod, node, revision), judged
    #: by :meth:`judge_placements` against the node's history, not the watch order.
    placements: list[tuple[str, str, str, int]] = field(default_factory=list)

    def judge_placements(self) -> list[str]:
        """Each driver pod that came or went on a node uncordoned at that revision; the
        node watch is read up to the pod's revision first (the two watches are separate
        streams: a cordon may reach us after the pod event that followed it)."""
        found = []
        for what, pod, node, rv in self.placements:
            cordoned = self.cordoned_at(node, rv)
            if cordoned is None:
                found.append(f"{what}: node {node} not known at that revision")
            elif not cordoned:
                found.append(f"{what}: driver pod {pod} on uncordoned {node}")
        return found

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(self._watch(NODE, None, self.nodes, ""))
            group.create_task(self._watch(POD, OPERATOR_NS, self.pods, DRIVER_COMPONENT))

    def check(self, what: str, rv: int = 0) -> None:
        self.observations += 1
        gpu = [n for n in self.nodes.values() if _labels(n).get(NFD_GPU_LABEL) == "true"]
        placed = {
            name: str(p["spec"]["nodeName"])
            for name, p in self.pods.items()
            if p.get("spec", {}).get("nodeName")
        }
        changed = {n: placed[n] for n in placed.keys() - self._where.keys()}
        changed.update({n: self._where[n] for n in self._where.keys() - placed.keys()})
        for name, node_name in sorted(changed.items()):
            if self.armed and node_name in self.nodes:
                came = "came" if name in placed else "went"
                self.placements.append((f"{what} ({came})", name, node_name, rv))
        self._where = placed
        groups: dict[str, list[dict[str, Any]]] = {}
        for node in gpu:
            groups.setdefault(_target(node), []).append(node)
        for owner, nodes in groups.items():
            in_progress, unavailable = _budget_use(nodes)
            self.peak_in_progress = max(self.peak_in_progress, len(in_progress))
            self.peak_unavailable = max(self.peak_unavailable, len(unavailable))
            if len(in_progress) > NVD_PARALLEL:
                self.violations.append(f"{what}: {owner}: {len(in_progress)} in progress")
            if len(unavailable) > NVD_UNAVAILABLE:
                self.violations.append(f"{what}: {owner}: {unavailable} unavailable")
        for node in gpu:
            if not node.get("spec", {}).get("unschedulable"):
                continue
            state = _labels(node).get(STATE_LABEL, "")
            since = (node["metadata"].get("annotations") or {}).get(STATE_SINCE_ANNOTATION)
            ours = state == UpgradeState.UPGRADE_FAILED.value or _in_progress(node)
            if not ours or since is None:
                name = node["metadata"]["name"]
                self.violations.append(f"{what}: {name} cordoned with no record ({state!r})")
        per_node: dict[str, int] = {}
        for pod in self.pods.values():
            node_name = pod.get("spec", {}).get("nodeName")
            if node_name:
                per_node[node_name] = per_node.get(node_name, 0) + 1
        most = max(per_node.values(), default=0)
        self.peak_driver_pods = max(self.peak_driver_pods, most)
        if most > 1:
            crowded = sorted(n for n, c in per_node.items() if c > 1)
            self.violations.append(f"{what}: two driver pods on {crowded}")


async def _nvd_driver_pods(rest: Rest) -> dict[str, tuple[str, str]]:
    """node -> (owning resource, image) of the live NVIDIADriver driver pods."""
    pods = await rest.list(POD, OPERATOR_NS, label_selector=DRIVER_COMPONENT)
    daemonsets = {
        d["metadata"]["name"]: d
        for d in await rest.list(by_kind("apps/v1", "DaemonSet"), OPERATOR_NS)
    }
    result = {}
    for pod in pods:
        if pod["metadata"].get("deletionTimestamp") or not pod["spec"].get("nodeName"):
            continue
        ds = daemonsets.get(pod["metadata"]["ownerReferences"][0]["name"]) or {}
        refs = (ds.get("metadata") or {}).get("ownerReferences") or [{}]
        owner = refs[0].get("name", "") if refs[0].get("kind") == "NVIDIADriver" else ""
        result[pod["spec"]["nodeName"]] = (owner, pod["spec"]["containers"][0]["image"])
    return result


async def _nvd_progress(rest: Rest, pool: set[str], versions: dict[str, str]) -> tuple[bool, str]:
    """Whether every GPU node runs its resource's driver at that resource's version, is
    upgrade-done, uncordoned and carries no move; what is left, for messages."""
    nodes = await _gpu_nodes(rest)
    pods = await _nvd_driver_pods(rest)
    left = []
    for name, node in nodes.items():
        owner = "pool" if name in pool else "default"
        labels = _labels(node)
        want = (owner, f"{versions[owner]}-ubuntu22.04")
        got = pods.get(name)
        if labels.get(STATE_LABEL) == "upgrade-failed":
            raise AssertionError(f"upgrade failed on {name}: {node['metadata']['annotations']}")
        if (
            got is None
            or got[0] != want[0]
            or not got[1].endswith(want[1])
            or labels.get(crd.OWNER_LABEL) != owner
            or NEXT_OWNER_LABEL in labels
            or labels.get(STATE_LABEL) != "upgrade-done"
            or node["spec"].get("unschedulable")
        ):
            left.append(f"{name}: {got} {labels.get(crd.OWNER_LABEL)}/{labels.get(STATE_LABEL)}")
    return not left, "; ".join(left)


async def test_sigkilled_operator_upgrades_and_moves_nvidiadriver_nodes_within_budgets(
    chaos_cluster: ClusterInfo, chaos_rest: Rest, tmp_path: Path
) -> None:
    """Ten SIGKILLs while one NVIDIADriver upgrades its nodes and nodes move between it
    and a second one: every hand-over keeps each resource's budget, every cordon is on
    record, and a node never has two driver pods."""
    rest = chaos_rest
    seed = int(os.environ.get("GPUOP_CHAOS_SEED") or random.SystemRandom().randrange(2**32))
    rng = random.Random(seed)
    print(f"chaos seed: {seed} (replay with GPUOP_CHAOS_SEED={seed})")
    # The ClusterPolicy test's workload would hold every drain for minutes.
    await rest.delete(DEPLOYMENT, APP, WORKLOAD_NS)
    with contextlib.suppress(Exception):
        await client.PolicyV1Api(rest.api).delete_namespaced_pod_disruption_budget(APP, WORKLOAD_NS)
    names = sorted(await _gpu_nodes(rest))
    pool = set(names[:MOVERS])
    for name in names:
        value = "pool" if name in pool else None
        await rest.merge_patch(NODE, name, {"metadata": {"labels": {POOL_LABEL: value}}})
    versions = {"default": "580.95.05", "pool": "590.48.01"}
    policy = _policy("595.91.07")
    policy["spec"]["driver"]["useNvidiaDriverCRD"] = True
    operator = OperatorProcess(chaos_cluster.kubeconfig, tmp_path)
    watcher = DriverWatcher(rest)
    watching: asyncio.Task[None] | None = None
    try:
        await rest.apply(policy)
        await rest.apply(_nvd("default", versions["default"], default=True))
        await rest.apply(_nvd("pool", versions["pool"], nodeSelector={POOL_LABEL: "pool"}))
        operator.start()

        async def settled() -> bool:
            return (await _nvd_progress(rest, pool, versions))[0]

        await eventually(settled, ROLLOUT_TIMEOUT, interval=0.5, what="initial rollout")
        watching = asyncio.create_task(watcher.run())

        async def seen() -> bool:
            gpu = [n for n in watcher.nodes.values() if _labels(n).get(NFD_GPU_LABEL) == "true"]
            return len(gpu) == GPU_NODES and len(watcher.pods) >= GPU_NODES

        await eventually(seen, 30, interval=0.5, what="watcher synced")
        watcher.check("baseline")
        watcher.armed = True

        rounds = 0

        async def next_round() -> None:
            """The default resource's next version, and the next nodes moving: into the
            pool resource, or back to the default one."""
            nonlocal rounds
            rounds += 1
            versions["default"] = DEFAULT_VERSIONS[rounds % len(DEFAULT_VERSIONS)]
            await rest.merge_patch(NVD, "default", {"spec": {"version": versions["default"]}})
            start = MOVERS * (rounds % (GPU_NODES // MOVERS))
            movers = names[start : start + MOVERS]
            for name in movers:
                joining = name not in pool
                (pool.add if joining else pool.discard)(name)
                patch = {POOL_LABEL: "pool" if joining else None}
                await rest.merge_patch(NODE, name, {"metadata": {"labels": patch}})

        await next_round()
        kills: list[tuple[float, int]] = []
        began = time.monotonic()
        while len(kills) < KILLS:
            await asyncio.sleep(rng.uniform(0.3, 3.0))
            if watching.done():
                watching.result()
            assert operator.alive(), f"operator exited by itself:\n{operator.tail()}"
            if (await _nvd_progress(rest, pool, versions))[0]:
                await next_round()
                continue
            operator.kill()
            kills.append((round(time.monotonic() - began, 1), rounds))
            operator.start()

        async def finished() -> bool:
            if watching is not None and watching.done():
                watching.result()
            return (await _nvd_progress(rest, pool, versions))[0]

        try:
            await eventually(finished, UPGRADE_TIMEOUT, interval=1.0, what="after the kills")
        except AssertionError as err:
            _, left = await _nvd_progress(rest, pool, versions)
            raise AssertionError(
                f"{err}\nseed {seed}; kills {kills}; left {left}; "
                f"violations {watcher.violations[:5]}\n{operator.tail()}"
            ) from err
        assert operator.alive(), operator.tail()
        # One event per GPU node after everything else, so that the node watch has read
        # past every driver pod event before the placements are judged.
        marks = {}
        for name in names:
            patch = {"metadata": {"annotations": {"chaos.gpuop.io/judged": str(rounds)}}}
            marks[name] = int(
                (await rest.merge_patch(NODE, name, patch))["metadata"]["resourceVersion"]
            )

        async def caught_up() -> bool:
            return all(
                (watcher.cordons.get(n) or [(0, False)])[-1][0] >= v for n, v in marks.items()
            )

        await eventually(caught_up, 30, interval=0.2, what="node watch past the last event")
        watcher.violations.extend(watcher.judge_placements())
        if watcher.violations:
            raise AssertionError(
                f"seed {seed}, (s, round) at kills {kills}; {len(watcher.violations)} "
                "violations, first:\n" + "\n".join(watcher.violations[:8])
            )
        assert watcher.peak_in_progress >= 1
        assert watcher.peak_driver_pods == 1
        print(
            f"chaos (NVIDIADriver): seed {seed}, {rounds} round(s), (s, round) at kills "
            f"{kills}, {watcher.observations} observations, peak in progress "
            f"{watcher.peak_in_progress}, peak unavailable {watcher.peak_unavailable}"
        )
    finally:
        operator.stop()
        if watching is not None:
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watching


def test_placements_are_judged_by_the_node_at_the_pods_revision() -> None:
    """The two watches deliver in their own order: a cordon read after the pod event that
    followed it is no violation, a pod bound after the uncordon is one."""
    watcher = DriverWatcher(rest=cast(Rest, None))
    watcher.cordons["n"] = [(10, False), (12, True), (20, False)]
    watcher.placements = [
        ("cordon read late", "p1", "n", 13),
        ("while cordoned", "p2", "n", 19),
        ("after the uncordon", "p3", "n", 21),
        ("before the cordon", "p4", "n", 11),
    ]
    watcher.cordons["n"].append((25, False))
    found = watcher.judge_placements()
    assert found == [
        "after the uncordon: driver pod p3 on uncordoned n",
        "before the cordon: driver pod p4 on uncordoned n",
    ]
    watcher.placements = [("past the node watch", "p5", "n", 30)]
    assert watcher.judge_placements() == ["past the node watch: node n not known at that revision"]
