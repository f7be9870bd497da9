"""Driver upgrades with NVIDIA's node images played (`gpuop.devcluster.node_images`): the
driver manager in every driver pod pauses the node's operands, and without the hand-off
annotation (`statemachine.driver_handoff`) cordons, evicts and uncordons the node itself.

A watcher over every node event holds, for the whole module:
- no node we cordoned for an upgrade is uncordoned before its upgrade reached
  ``uncordon-required``/``upgrade-done`` (or failed);
- an administrator's cordon and remediation's cordon are never lifted;
- every ``paused-for-driver-upgrade`` label comes back;
- the operator writes no deploy label once the fleet is labelled (so never one the
  driver manager paused).

``GPUOP_TEST_NO_HANDOFF=1`` turns the annotation write off, to show these tests fail
without it (what the simulator plays: docs/node-images.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from kubernetes_asyncio import client

import crd
from components.keys import DEPLOY_LABEL_PREFIX, PAUSED_PREFIX
from gpuop.devcluster import ClusterInfo
from gpuop.devcluster._health import mark_gpu_health, verdict_for
from gpuop.kube.client import api_client as make_api_client
from gpuop.kube.informer import Informer, Obj, ResourceSpec
from gpuop.kube.kinds import KINDS, by_kind
from gpuop.kube.rest import Rest
from gpuop.operator.install import ensure_namespace, install_crd
from statemachine.cordon import CORDONED_BY_ANNOTATION
from statemachine.driver_handoff import HANDOFF_ANNOTATION
from statemachine.upgrade_keys import IN_PROGRESS_STATES, SKIP_LABEL, STATE_LABEL, UpgradeState
from tests.integration.harness import NAMESPACE, NODE, POLICY, Running, eventually, own_cluster
from tests.integration.test_nvidiadriver import _nvd

pytestmark = pytest.mark.integration

POD = by_kind("v1", "Pod")
NVD = by_kind("nvidia.com/v1alpha1", "NVIDIADriver")
GPU_NODES = 12
GPUS = [f"gpu-node-{i:04d}" for i in range(GPU_NODES)]
PRODUCT = "nvidia.com/gpu.product"
H100 = "NVIDIA-H100-80GB-HBM3"
HOLDING = frozenset(s.value for s in IN_PROGRESS_STATES if s is not UpgradeState.UNCORDON_REQUIRED)
"""Upgrade states in which the node must stay cordoned."""
RELEASED = frozenset({"uncordon-required", "upgrade-done", "upgrade-failed"})
NO_HANDOFF = os.environ.get("GPUOP_TEST_NO_HANDOFF") == "1"
POOL_LABEL = "gpuop-test.example/pool"
"""Moves a node to another NVIDIADriver: a label outside the prefixes the node cache
keeps, as a cloud node-pool label is (the cache widens to what selectors read)."""


@pytest.fixture(scope="module")
def fleet() -> Iterator[ClusterInfo]:
    with own_cluster("-images", gpu_nodes=GPU_NODES, node_images=True) as info:
        yield info


@pytest.fixture(scope="module")
async def api(fleet: ClusterInfo) -> AsyncIterator[client.ApiClient]:
    async with make_api_client(fleet.kubeconfig, user_agent="gpuop-tests") as api:
        rest = Rest(api, KINDS)
        await install_crd(rest)
        await ensure_namespace(rest, NAMESPACE)
        yield api


@pytest.fixture(autouse=True)
def _handoff(monkeypatch: pytest.MonkeyPatch) -> None:
    if NO_HANDOFF:
        monkeypatch.setattr("gpuop.operator.controller.passes.node.handoff_wanted", lambda *_: None)


class FleetWatch:
    """Every node event of the cluster, checked against the rules above."""

    def __init__(self, rest: Rest) -> None:
        self.nodes: dict[str, Obj] = {}
        self.violations: list[str] = []
        self.held: set[str] = set()
        """Nodes whose cordon is an administrator's or remediation's: never lifted."""
        self.paused: set[tuple[str, str]] = set()
        self.states: dict[str, list[str]] = {}
        self.informer = Informer(ResourceSpec("test-fleet-nodes", rest.lister(NODE)), self._on)

    async def run(self) -> None:
        await self.informer.run()

    def _on(self, event: str, old: Obj | None, new: Obj | None) -> None:
        if new is None:
            return
        name = new["metadata"]["name"]
        before = self.nodes.get(name)
        self.nodes[name] = new
        labels = new["metadata"].get("labels") or {}
        state = labels.get(STATE_LABEL, "")
        history = self.states.setdefault(name, [])
        if not history or history[-1] != state:
            history.append(state)
        for key, value in labels.items():
            if key.startswith(DEPLOY_LABEL_PREFIX) and value.startswith(PAUSED_PREFIX):
                self.paused.add((name, key))
        if before is None or not before["spec"].get("unschedulable"):
            return
        if new["spec"].get("unschedulable"):
            return
        # Uncordoned in this event: by whom may it be?
        was = before["metadata"].get("labels") or {}
        owner = (before["metadata"].get("annotations") or {}).get(CORDONED_BY_ANNOTATION)
        if name in self.held:
            self.violations.append(f"{name}: held cordon (owner {owner or 'admin'}) lifted")
        elif was.get(STATE_LABEL, "") in HOLDING and state not in RELEASED:
            self.violations.append(f"{name}: uncordoned in {state or 'no state'}")

    def paused_now(self) -> list[tuple[str, str]]:
        return [
            (name, key)
            for name, node in self.nodes.items()
            for key, value in (node["metadata"].get("labels") or {}).items()
            if value.startswith(PAUSED_PREFIX)
        ]


@contextlib.asynccontextmanager
async def _watching(rest: Rest) -> AsyncIterator[FleetWatch]:
    watch = FleetWatch(rest)
    task = asyncio.create_task(watch.run())
    try:
        await eventually(lambda: _true(watch.informer.synced.is_set()), timeout=30)
        yield watch
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _true(value: bool) -> bool:
    return value


class DeployWrites:
    """The operator's node patches that touch a deploy label, once armed."""

    def __init__(self, run: Running) -> None:
        self.armed = False
        self.writes: list[tuple[str, dict[str, Any]]] = []
        rest = run.rest
        patch = rest.merge_patch

        async def recording(kind: Any, name: str, body: Any, *args: Any, **kw: Any) -> Any:
            labels = (body.get("metadata") or {}).get("labels") or {}
            deploy = {k: v for k, v in labels.items() if k.startswith(DEPLOY_LABEL_PREFIX)}
            if self.armed and kind == NODE and deploy:
                self.writes.append((name, deploy))
            return await patch(kind, name, body, *args, **kw)

        rest.merge_patch = recording  # type: ignore[method-assign,assignment]


def _policy(version: str, **driver: Any) -> dict[str, Any]:
    policy = copy.deepcopy(crd.sample_policy())
    spec = policy["spec"]
    spec["driver"]["version"] = version
    spec["driver"]["upgradePolicy"] = {
        "autoUpgrade": True,
        "maxParallelUpgrades": 4,
        "maxUnavailable": "50%",
        "drain": {"enable": True, "force": True, "timeoutSeconds": 120},
        "podDeletion": {"force": True, "timeoutSeconds": 120},
    }
    spec["driver"].update(driver)
    return policy


async def _cleanup(rest: Rest, api: client.ApiClient) -> None:
    for kind in (NVD, POLICY):
        for existing in await rest.list(kind):
            await rest.delete(kind, existing["metadata"]["name"])

    async def no_driver_pods() -> bool:
        pods = await rest.list(POD, NAMESPACE)
        return not any(
            (p["metadata"].get("labels") or {}).get("app.kubernetes.io/component")
            == "nvidia-driver"
            for p in pods
        )

    await eventually(no_driver_pods, timeout=120)
    for name in GPUS:
        await mark_gpu_health(api, name, verdict_for("True", None, None))
        node = await rest.get(NODE, name)
        assert node is not None
        labels = node["metadata"].get("labels") or {}
        annotations = node["metadata"].get("annotations") or {}
        await rest.merge_patch(
            NODE,
            name,
            {
                "metadata": {
                    "labels": {
                        k: None
                        for k in labels
                        if k.startswith("nvidia.com/gpu-driver-upgrade")
                        or k.startswith(DEPLOY_LABEL_PREFIX)
                    },
                    "annotations": {
                        k: None
                        for k in annotations
                        if k.startswith(("nvidia.com/gpu-driver-upgrade", "gpuop.io/"))
                    },
                },
                "spec": {"taints": None, "unschedulable": None},
            },
        )


async def _gpu_work(rest: Rest, namespace: str, node: str) -> None:
    """A GPU workload pod on ``node`` (bare: the policy's force lets the drain take it)."""
    await rest.create(
        POD,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"trainer-{node}", "labels": {"app": "trainer"}},
            "spec": {
                "nodeName": node,
                "containers": [
                    {"name": "c", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
                ],
            },
        },
        namespace,
    )


async def _driver_images(rest: Rest) -> dict[str, str]:
    """Each node's Ready driver pod's image."""
    result = {}
    for pod in await rest.list(POD, NAMESPACE):
        labels = pod["metadata"].get("labels") or {}
        if labels.get("app.kubernetes.io/component") != "nvidia-driver":
            continue
        if pod["metadata"].get("deletionTimestamp") or not pod["spec"].get("nodeName"):
            continue
        ready = any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in (pod.get("status") or {}).get("conditions") or []
        )
        if ready:
            result[pod["spec"]["nodeName"]] = pod["spec"]["containers"][0]["image"]
    return result


def _all_on(images: dict[str, str], nodes: list[str], version: str) -> bool:
    return all(images.get(n, "").split(":")[-1].startswith(version) for n in nodes)


async def _settled_fleet(
    rest: Rest, watch: FleetWatch, nodes: list[str], version: str, timeout: float
) -> None:
    """Every node of ``nodes`` runs ``version``, Ready, upgrade-done, nothing paused."""

    async def done() -> bool:
        images = await _driver_images(rest)
        states = [(watch.nodes[n]["metadata"].get("labels") or {}).get(STATE_LABEL) for n in nodes]
        return (
            _all_on(images, nodes, version)
            and all(s == "upgrade-done" for s in states)
            and not watch.paused_now()
        )

    await eventually(done, timeout=timeout)


def _check(watch: FleetWatch, writes: DeployWrites) -> None:
    assert watch.violations == [], watch.violations[:10]
    assert watch.paused_now() == [], watch.paused_now()
    assert writes.writes == [], writes.writes[:5]


async def test_a_fleet_upgrade_keeps_every_cordon_until_validated(
    api: client.ApiClient, fleet: ClusterInfo
) -> None:
    """12 nodes, GPU workloads on four: each node is cordoned, drained, its driver
    restarted (the driver manager pauses its operands and, handed off, leaves the cordon
    alone), validated and only then uncordoned by us."""
    rest = Rest(api, KINDS)
    await _cleanup(rest, api)
    work = f"work-{uuid.uuid4().hex[:6]}"
    await ensure_namespace(rest, work)
    try:
        async with _watching(rest) as watch, Running(api) as run:
            writes = DeployWrites(run)
            await rest.apply(_policy("580.95.05"))
            await _settled_fleet(rest, watch, GPUS, "580.95.05", timeout=180)
            assert (
                all(
                    (watch.nodes[n]["metadata"].get("annotations") or {}).get(HANDOFF_ANNOTATION)
                    == "true"
                    for n in GPUS
                )
                or NO_HANDOFF
            )
            for node in GPUS[:4]:
                await _gpu_work(rest, work, node)
            await run.settle()
            writes.armed = True
            await rest.apply(_policy("590.48.01"))
            await _settled_fleet(rest, watch, GPUS, "590.48.01", timeout=420)
            await run.settle()
            _check(watch, writes)
            # Every node went through the upgrade and the driver manager's pause.
            for node in GPUS:
                assert "pod-restart-required" in watch.states[node], watch.states[node]
                assert any(n == node for n, _ in watch.paused), node
            assert not any(watch.nodes[n]["spec"].get("unschedulable") for n in GPUS)
            for node in GPUS[:4]:
                assert await rest.get(POD, f"trainer-{node}", work) is None
    finally:
        await rest.delete(by_kind("v1", "Namespace"), work)
        await _cleanup(rest, api)


async def test_an_administrators_cordon_survives_a_driver_upgrade(
    api: client.ApiClient, fleet: ClusterInfo
) -> None:
    """One node cordoned by an administrator (no record) is upgraded with the rest: the
    driver manager's restart on it never lifts that cordon, nor do we."""
    rest = Rest(api, KINDS)
    await _cleanup(rest, api)
    admin = GPUS[5]
    others = [n for n in GPUS if n != admin]
    try:
        async with _watching(rest) as watch, Running(api) as run:
            writes = DeployWrites(run)
            await rest.apply(_policy("580.95.05"))
            await _settled_fleet(rest, watch, GPUS, "580.95.05", timeout=180)
            await run.settle()
            # Only the administrator's node upgrades: the rest are skipped.
            for node in others:
                await rest.merge_patch(NODE, node, {"metadata": {"labels": {SKIP_LABEL: "true"}}})
            await rest.merge_patch(NODE, admin, {"spec": {"unschedulable": True}})
            watch.held.add(admin)
            writes.armed = True
            await rest.apply(_policy("590.48.01"))
            await _settled_fleet(rest, watch, [admin], "590.48.01", timeout=240)
            await run.settle()
            _check(watch, writes)
            assert "pod-restart-required" in watch.states[admin], watch.states[admin]
            assert watch.nodes[admin]["spec"].get("unschedulable") is True
            annotations = watch.nodes[admin]["metadata"].get("annotations") or {}
            assert CORDONED_BY_ANNOTATION not in annotations
    finally:
        await _cleanup(rest, api)


async def test_a_quarantined_node_stays_cordoned_through_a_driver_restart(
    api: client.ApiClient, fleet: ClusterInfo
) -> None:
    """GPU-health remediation quarantines a node (cordon recorded as its own); a driver
    change then restarts that node's driver pod: the driver manager must not put the node
    back into service, and the cordon stays remediation's."""
    rest = Rest(api, KINDS)
    await _cleanup(rest, api)
    sick = GPUS[7]
    others = [n for n in GPUS if n != sick]
    try:
        async with _watching(rest) as watch, Running(api) as run:
            writes = DeployWrites(run)
            policy = _policy("580.95.05")
            policy["spec"]["healthRemediation"] = {"enabled": True, "action": "cordon"}
            await rest.apply(policy)
            await _settled_fleet(rest, watch, GPUS, "580.95.05", timeout=180)
            for node in others:
                await rest.merge_patch(NODE, node, {"metadata": {"labels": {SKIP_LABEL: "true"}}})
            message = f"GPU 0 (GPU-{uuid.uuid4()}): XID 79 (GPU has fallen off the bus)"
            await mark_gpu_health(api, sick, verdict_for("False", "XidCritical", message))

            async def quarantined() -> bool:
                node = watch.nodes[sick]
                owner = (node["metadata"].get("annotations") or {}).get(CORDONED_BY_ANNOTATION)
                return bool(node["spec"].get("unschedulable")) and owner == "health-remediation"

            await eventually(quarantined, timeout=60)
            watch.held.add(sick)
            await run.settle()
            writes.armed = True
            upgraded = _policy("590.48.01")
            upgraded["spec"]["healthRemediation"] = policy["spec"]["healthRemediation"]
            await rest.apply(upgraded)

            async def restarted() -> bool:
                return _all_on(await _driver_images(rest), [sick], "590.48.01")

            # Our upgrade may hold a quarantined node; a driver restart there (a crash, a
            # kubelet restart) runs the new revision all the same.
            await asyncio.sleep(5)
            if not await restarted():
                for pod in await rest.list(POD, NAMESPACE):
                    labels = pod["metadata"].get("labels") or {}
                    if (
                        labels.get("app.kubernetes.io/component") == "nvidia-driver"
                        and pod["spec"].get("nodeName") == sick
                    ):
                        await rest.delete(POD, pod["metadata"]["name"], NAMESPACE)
            await eventually(restarted, timeout=180)

            async def unpaused() -> bool:
                return not watch.paused_now()

            await eventually(unpaused, timeout=60)
            await run.settle()
            _check(watch, writes)
            assert any(n == sick for n, _ in watch.paused), "the driver manager never ran"
            held = watch.nodes[sick]
            assert held["spec"].get("unschedulable") is True
            owner = (held["metadata"].get("annotations") or {}).get(CORDONED_BY_ANNOTATION)
            assert owner == "health-remediation"
    finally:
        await _cleanup(rest, api)


async def test_nvidiadriver_upgrade_and_move_keep_their_cordons(
    api: client.ApiClient, fleet: ClusterInfo
) -> None:
    """NVIDIADriver nodes follow their owner's autoUpgrade in the annotation; an owner's
    version change upgrades its nodes, and a node moving to another owner is cordoned,
    drained and handed over; no cordon of ours is lifted early on either."""
    rest = Rest(api, KINDS)
    await _cleanup(rest, api)
    budget = {
        "autoUpgrade": True,
        "maxParallelUpgrades": 3,
        "maxUnavailable": "50%",
        "drain": {"enable": True, "force": True, "timeoutSeconds": 120},
    }
    try:
        async with _watching(rest) as watch, Running(api) as run:
            writes = DeployWrites(run)
            policy = crd.sample_policy()
            policy["spec"]["driver"]["useNvidiaDriverCRD"] = True
            await rest.apply(policy)
            await rest.apply(
                _nvd("default", default=True, version="580.95.05", upgradePolicy=budget)
            )
            pinned = {**budget, "autoUpgrade": False}
            await rest.apply(
                _nvd(
                    "h100", nodeSelector={PRODUCT: H100}, version="580.95.05", upgradePolicy=pinned
                )
            )
            labels = {n: (watch.nodes[n]["metadata"].get("labels") or {}) for n in GPUS}
            h100 = [n for n in GPUS if labels[n].get(PRODUCT) == H100]
            rest_of = [n for n in GPUS if n not in h100]
            assert h100
            assert rest_of

            async def running() -> bool:
                images = await _driver_images(rest)
                return _all_on(images, GPUS, "580.95.05") and all(
                    (watch.nodes[n]["metadata"].get("labels") or {}).get(STATE_LABEL)
                    == "upgrade-done"
                    for n in rest_of
                )

            await eventually(running, timeout=180)
            await run.settle()
            if not NO_HANDOFF:
                for node in GPUS:
                    annotations = watch.nodes[node]["metadata"].get("annotations") or {}
                    want = None if node in h100 else "true"
                    assert annotations.get(HANDOFF_ANNOTATION) == want, node
            writes.armed = True
            await rest.merge_patch(NVD, "default", {"spec": {"version": "590.48.01"}})
            await _settled_fleet(rest, watch, rest_of, "590.48.01", timeout=360)
            # A node moves from the default owner to a new one (auto-upgrading).
            mover = rest_of[0]
            await rest.merge_patch(NODE, mover, {"metadata": {"labels": {POOL_LABEL: "moved"}}})
            await rest.apply(
                _nvd(
                    "moved",
                    nodeSelector={POOL_LABEL: "moved"},
                    version="595.91.07",
                    upgradePolicy=budget,
                )
            )
            await _settled_fleet(rest, watch, [mover], "595.91.07", timeout=240)
            await run.settle()
            _check(watch, writes)
            assert "cordon-required" in watch.states[mover], watch.states[mover]
            owner = (watch.nodes[mover]["metadata"].get("labels") or {}).get(crd.OWNER_LABEL)
            assert owner == "moved"
    finally:
        for node in GPUS:
            await rest.merge_patch(NODE, node, {"metadata": {"labels": {POOL_LABEL: None}}})
        await _cleanup(rest, api)
