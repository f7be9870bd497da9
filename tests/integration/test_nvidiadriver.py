"""NVIDIADriver resources against the real control plane: owner labels, one driver
DaemonSet per resource and pool on exactly its nodes, conflicts, CEL rules, and the
hand-over between the ClusterPolicy's driver and the resources, watched pod by pod."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

import crd
from gpuop.devcluster import NFD_GPU_LABEL
from gpuop.kube.informer import Informer, Obj, ResourceSpec
from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Rest
from statemachine.upgrade_keys import IN_PROGRESS_STATES, STATE_LABEL, UpgradeState
from tests.conftest import TEST_GPU_NODES
from tests.integration.harness import NAMESPACE, NODE, POLICY, Running, eventually, policy_state_is

pytestmark = pytest.mark.integration

DS = by_kind("apps/v1", "DaemonSet")
POD = by_kind("v1", "Pod")
NVD = by_kind("nvidia.com/v1alpha1", "NVIDIADriver")
PRODUCT = "nvidia.com/gpu.product"
H100 = "NVIDIA-H100-80GB-HBM3"
POLICY_DS = "nvidia-driver-daemonset"


def _nvd(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "NVIDIADriver",
        "metadata": {"name": name},
        "spec": spec,
    }


class DriverPodWatch:
    """Every driver pod event, and the most driver pods one node ever had at once
    (terminating ones count: they still run on the node)."""

    def __init__(self, rest: Rest) -> None:
        self.on_node: dict[str, str] = {}
        self.most = 0
        self.crowded: list[dict[str, str]] = []
        self.apps_seen: set[str] = set()
        self.informer = Informer(
            ResourceSpec(
                "test-driver-pods",
                rest.lister(POD, NAMESPACE),
                label_selector="app.kubernetes.io/component=nvidia-driver",
            ),
            self._on_pod,
        )

    def _on_pod(self, event: str, old: Obj | None, new: Obj | None) -> None:
        pod = new or old
        assert pod is not None
        name = pod["metadata"]["name"]
        node = (pod.get("spec") or {}).get("nodeName")
        if event == "DELETED":
            self.on_node.pop(name, None)
        elif node:
            self.on_node[name] = node
            self.apps_seen.add(pod["metadata"]["labels"]["app"])
        counts = Counter(self.on_node.values())
        most = max(counts.values(), default=0)
        if most > 1:
            self.crowded.append(dict(self.on_node))
        self.most = max(self.most, most)


class OwnerlessWatch:
    """The most GPU nodes without an owner label at one moment of the node watch, while
    ``armed`` (the nodes named as of that moment)."""

    def __init__(self, rest: Rest) -> None:
        self.owner: dict[str, str | None] = {}
        self.armed = False
        self.most: list[str] = []
        self.informer = Informer(
            ResourceSpec("test-ownerless-nodes", rest.lister(NODE)), self._on_node
        )

    def _on_node(self, event: str, old: Obj | None, new: Obj | None) -> None:
        node = new or old
        assert node is not None
        name = node["metadata"]["name"]
        labels = node["metadata"].get("labels") or {}
        if event == "DELETED" or labels.get("nvidia.com/gpu.present") != "true":
            self.owner.pop(name, None)
        else:
            self.owner[name] = labels.get(crd.OWNER_LABEL)
        ownerless = sorted(n for n, owner in self.owner.items() if owner is None)
        if self.armed and len(ownerless) > len(self.most):
            self.most = ownerless


async def _labels(rest: Rest) -> dict[str, dict[str, str]]:
    return {n["metadata"]["name"]: n["metadata"].get("labels", {}) for n in await rest.list(NODE)}


async def _gpu_nodes(rest: Rest) -> dict[str, dict[str, str]]:
    return {
        name: labels
        for name, labels in (await _labels(rest)).items()
        if labels.get("nvidia.com/gpu.present") == "true"
    }


async def _driver_pods_by_ds(rest: Rest) -> dict[str, set[str]]:
    pods = await rest.list(
        POD, NAMESPACE, label_selector="app.kubernetes.io/component=nvidia-driver"
    )
    result: dict[str, set[str]] = {}
    for pod in pods:
        if pod["metadata"].get("deletionTimestamp") or not pod["spec"].get("nodeName"):
            continue
        owner = pod["metadata"]["ownerReferences"][0]["name"]
        result.setdefault(owner, set()).add(pod["spec"]["nodeName"])
    return result


async def _nvd_state(rest: Rest, name: str) -> tuple[str | None, str | None]:
    got = await rest.get(NVD, name) or {}
    status = got.get("status") or {}
    error = [c for c in status.get("conditions") or [] if c["type"] == "Error"]
    return status.get("state"), (
        error[0]["reason"] if error and error[0]["status"] == "True" else None
    )


async def _use_crd(rest: Rest, on: bool) -> None:
    await rest.merge_patch(
        POLICY, "cluster-policy", {"spec": {"driver": {"useNvidiaDriverCRD": on}}}
    )


async def _cleanup(rest: Rest) -> None:
    for existing in await rest.list(NVD):
        await rest.delete(NVD, existing["metadata"]["name"])
    for name, labels in (await _labels(rest)).items():
        if crd.OWNER_LABEL in labels or STATE_LABEL in labels:
            patch = {crd.OWNER_LABEL: None, STATE_LABEL: None}
            await rest.merge_patch(NODE, name, {"metadata": {"labels": patch}})


async def test_resources_own_their_nodes_and_hand_over_exclusively(
    rest: Rest, api_client: client.ApiClient
) -> None:
    await _cleanup(rest)
    await rest.apply(crd.sample_policy())
    watch = DriverPodWatch(rest)
    watcher = asyncio.create_task(watch.informer.run())
    ownerless = OwnerlessWatch(rest)
    ownerless_watcher = asyncio.create_task(ownerless.informer.run())
    try:
        async with Running(api_client):
            assert await eventually(lambda: policy_state_is(rest, "ready"), timeout=120)
            gpu = await _gpu_nodes(rest)
            assert len(gpu) == TEST_GPU_NODES
            h100 = {n for n, lab in gpu.items() if lab.get(PRODUCT) == H100}
            others = set(gpu) - h100
            assert h100
            assert others

            await rest.apply(_nvd("default", default=True, version="580.95.05"))
            await rest.apply(_nvd("h100", nodeSelector={PRODUCT: H100}, version="590.48.01"))

            async def disabled() -> bool:
                states = [await _nvd_state(rest, n) for n in ("default", "h100")]
                return all(s == "disabled" for s, _ in states)

            assert await eventually(disabled, timeout=60)
            assert not any(crd.OWNER_LABEL in lab for lab in (await _labels(rest)).values())

            # Switch on: the ClusterPolicy's driver leaves, the resources take over.
            await _use_crd(rest, True)

            async def resources_drive() -> dict[str, set[str]] | None:
                by_ds = await _driver_pods_by_ds(rest)
                ready = [await _nvd_state(rest, n) for n in ("default", "h100")]
                if POLICY_DS in by_ds or len(by_ds) != 2 or ready != [("ready", None)] * 2:
                    return None
                return by_ds

            by_ds = await eventually(resources_drive, timeout=120)
            daemonsets = {d["metadata"]["name"]: d for d in await rest.list(DS, NAMESPACE)}
            owner_of = {
                name: daemonsets[name]["metadata"]["ownerReferences"][0]["name"] for name in by_ds
            }
            nodes_of = {owner_of[name]: nodes for name, nodes in by_ds.items()}
            assert nodes_of == {"h100": h100, "default": others}
            for name in by_ds:
                ds = daemonsets[name]
                assert name.startswith("nvidia-gpu-driver-ubuntu22.04-")
                assert ds["spec"]["updateStrategy"]["type"] == "OnDelete"
                assert (
                    ds["spec"]["template"]["spec"]["nodeSelector"][crd.OWNER_LABEL]
                    == (owner_of[name])
                )
            labels = await _labels(rest)
            owners = {n: labels[n].get(crd.OWNER_LABEL) for n in gpu}
            assert owners == {n: ("h100" if n in h100 else "default") for n in gpu}
            assert all(crd.OWNER_LABEL not in lab for n, lab in labels.items() if n not in gpu)
            assert await eventually(lambda: policy_state_is(rest, "ready"), timeout=60)

            # A third resource overlapping the H100 one: nothing moves, both say why.
            await rest.apply(_nvd("overlap", nodeSelector={"nvidia.com/gpu.present": "true"}))

            async def conflicting() -> bool:
                states = [await _nvd_state(rest, n) for n in ("h100", "overlap")]
                return states == [("notReady", crd.REASON_CONFLICTING_NODE_SELECTOR)] * 2

            assert await eventually(conflicting, timeout=60)
            labels = await _labels(rest)
            assert {n: labels[n].get(crd.OWNER_LABEL) for n in gpu} == owners
            assert await _driver_pods_by_ds(rest) == by_ds
            await rest.delete(NVD, "overlap")

            async def h100_ready() -> bool:
                return await _nvd_state(rest, "h100") == ("ready", None)

            assert await eventually(h100_ready, timeout=60)

            # A second default: both fail, nothing moves.
            await rest.apply(_nvd("default-2", default=True))

            async def two_defaults() -> bool:
                states = [await _nvd_state(rest, n) for n in ("default", "default-2")]
                return states == [("notReady", "ReconcileFailed")] * 2

            assert await eventually(two_defaults, timeout=60)
            labels = await _labels(rest)
            assert {n: labels[n].get(crd.OWNER_LABEL) for n in gpu} == owners
            await rest.delete(NVD, "default-2")

            async def default_ready() -> bool:
                return await _nvd_state(rest, "default") == ("ready", None)

            assert await eventually(default_ready, timeout=60)

            # The H100 resource, upgrades off, takes every GPU node: no cordon or drain,
            # but one node at a time (maxUnavailable 1), the next only once the last
            # runs its new driver.
            ownerless.armed = True
            pinned = {"autoUpgrade": False, "maxUnavailable": 1}
            await rest.merge_patch(
                NVD,
                "h100",
                {
                    "spec": {
                        "nodeSelector": {"nvidia.com/gpu.present": "true", PRODUCT: None},
                        "upgradePolicy": pinned,
                    }
                },
            )

            async def h100_drives_all() -> bool:
                by_ds = await _driver_pods_by_ds(rest)
                labels = await _labels(rest)
                return (
                    list(by_ds.values()) == [set(gpu)]
                    and all(labels[n].get(crd.OWNER_LABEL) == "h100" for n in gpu)
                    and await _nvd_state(rest, "h100") == ("ready", None)
                )

            assert await eventually(h100_drives_all, timeout=120)
            ownerless.armed = False
            assert len(ownerless.most) == 1, ownerless.most  # others moved: never two at once

            # Switch off: the resources give their nodes back to the ClusterPolicy.
            await _use_crd(rest, False)

            async def policy_drives() -> bool:
                by_ds = await _driver_pods_by_ds(rest)
                states = [await _nvd_state(rest, n) for n in ("default", "h100")]
                return (
                    set(by_ds) == {POLICY_DS}
                    and by_ds[POLICY_DS] == set(gpu)
                    and all(s == "disabled" for s, _ in states)
                )

            assert await eventually(policy_drives, timeout=120)
            labels = await _labels(rest)
            assert not any(crd.OWNER_LABEL in lab for lab in labels.values())
            assert await eventually(lambda: policy_state_is(rest, "ready"), timeout=60)
    finally:
        for task in (watcher, ownerless_watcher):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await _cleanup(rest)
    # Both drivers really ran, and never two on one node at any observed moment.
    assert POLICY_DS in watch.apps_seen
    assert len(watch.apps_seen) == 3
    assert watch.most == 1, watch.crowded[:3]


async def test_api_server_enforces_the_cel_rules(rest: Rest) -> None:
    await _cleanup(rest)
    try:
        with pytest.raises(ApiException) as err:
            await rest.apply(_nvd("bad-default", default=True, nodeSelector={PRODUCT: H100}))
        assert "default NVIDIADriver must not use nodeSelector" in str(err.value)
        with pytest.raises(ApiException) as err:
            await rest.apply(_nvd("bad-owner", nodeSelector={crd.OWNER_LABEL: "x"}))
        assert "reserved label" in str(err.value)
        await rest.apply(_nvd("typed", driverType="gpu", usePrecompiled=False))
        for field, value in (("driverType", "vgpu"), ("usePrecompiled", True)):
            with pytest.raises(ApiException) as err:
                await rest.merge_patch(NVD, "typed", {"spec": {field: value}})
            assert "immutable" in str(err.value)
    finally:
        await _cleanup(rest)


async def _unsupported_condition(rest: Rest, name: str) -> dict[str, Any] | None:
    got = await rest.get(NVD, name) or {}
    for cond in (got.get("status") or {}).get("conditions") or []:
        if cond["type"] == crd.CONDITION_UNSUPPORTED_FIELDS:
            return dict(cond)
    return None


async def test_a_field_not_acted_on_is_named_in_status_and_an_event(
    rest: Rest, api_client: client.ApiClient
) -> None:
    """Nothing dropped in silence: a set field the operator ignores is named by the
    UnsupportedFields condition and a Warning Event, and the condition goes with it."""
    await _cleanup(rest)
    await rest.apply(crd.sample_policy())
    spec = {"default": True, "version": "580.95.05"}
    try:
        async with Running(api_client):
            # The manager's pull secrets act now (they reach the driver pod); a pull
            # policy Kubernetes does not know is still named (IfNotPresent is used).
            await rest.apply(_nvd("named", **spec, manager={"imagePullPolicy": "Sometimes"}))
            cond = await eventually(
                lambda: _unsupported_condition(rest, "named"), timeout=60, what="condition"
            )
            assert cond["status"] == "True"
            assert cond["reason"] == "FieldsNotActedOn"
            assert "spec.manager.imagePullPolicy (" in cond["message"]

            async def warned() -> list[dict[str, Any]]:
                return [
                    e
                    for e in await rest.list(by_kind("v1", "Event"), "default")
                    if e["involvedObject"].get("kind") == "NVIDIADriver"
                    and e["involvedObject"].get("name") == "named"
                    and e.get("reason") == "FieldsNotActedOn"
                ]

            (event,) = await eventually(warned, timeout=30, what="Warning Event")
            assert event["type"] == "Warning"
            assert event["message"] == cond["message"]

            await rest.apply(_nvd("named", **spec))

            async def cleared() -> bool:
                return await _unsupported_condition(rest, "named") is None

            await eventually(cleared, timeout=60, what="condition removed")
    finally:
        await _cleanup(rest)


class UpgradeWatch:
    """The most nodes of each owner ever in an upgrade slot at once, every state any
    node passed through, and every ClusterPolicy state/message seen."""

    def __init__(self, rest: Rest) -> None:
        self.nodes: dict[str, dict[str, str]] = {}
        self.peak: Counter[str] = Counter()
        self.states: dict[str, set[str]] = {}
        self.policy_messages: list[tuple[str, str]] = []
        self.node_informer = Informer(ResourceSpec("test-nodes", rest.lister(NODE)), self._on_node)
        self.policy_informer = Informer(
            ResourceSpec("test-policies", rest.lister(POLICY)), self._on_policy
        )

    def _on_node(self, event: str, old: Obj | None, new: Obj | None) -> None:
        node = new or old
        assert node is not None
        name = node["metadata"]["name"]
        labels = node["metadata"].get("labels") or {}
        self.nodes[name] = labels
        state = labels.get(STATE_LABEL, "")
        self.states.setdefault(name, set()).add(state)
        busy: Counter[str] = Counter(
            lab.get(crd.OWNER_LABEL, "")
            for lab in self.nodes.values()
            if UpgradeState(lab.get(STATE_LABEL) or "unknown") in IN_PROGRESS_STATES
        )
        for owner, count in busy.items():
            self.peak[owner] = max(self.peak[owner], count)

    def _on_policy(self, event: str, old: Obj | None, new: Obj | None) -> None:
        status = (new or {}).get("status") or {}
        ready = [c for c in status.get("conditions") or [] if c["type"] == "Ready"]
        if ready:
            self.policy_messages.append((status.get("state", ""), ready[0]["message"]))

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(self.node_informer.run())
            group.create_task(self.policy_informer.run())


async def _driver_pods(rest: Rest) -> dict[str, tuple[str, str, str]]:
    """node -> (pod uid, driver image, app) of the live driver pods."""
    pods = await rest.list(
        POD, NAMESPACE, label_selector="app.kubernetes.io/component=nvidia-driver"
    )
    return {
        p["spec"]["nodeName"]: (
            p["metadata"]["uid"],
            p["spec"]["containers"][0]["image"],
            p["metadata"]["labels"]["app"],
        )
        for p in pods
        if not p["metadata"].get("deletionTimestamp") and p["spec"].get("nodeName")
    }


async def _policy_ready(rest: Rest, timeout: float) -> None:
    """Wait for the ClusterPolicy to be ready; on timeout, say what its status holds."""
    try:
        await eventually(lambda: policy_state_is(rest, "ready"), timeout=timeout)
    except AssertionError as err:
        status = (await rest.get(POLICY, "cluster-policy")).get("status")
        nodes = {
            n: (lab.get(STATE_LABEL), lab.get(crd.OWNER_LABEL))
            for n, lab in (await _labels(rest)).items()
        }
        raise AssertionError(f"{err}\nstatus: {status}\nnodes: {nodes}") from err


async def test_version_change_upgrades_only_that_resources_nodes_within_its_budget(
    rest: Rest, api_client: client.ApiClient
) -> None:
    await _cleanup(rest)
    policy = crd.sample_policy()
    policy["spec"]["driver"]["useNvidiaDriverCRD"] = True
    await rest.apply(policy)
    budget = {"autoUpgrade": True, "maxParallelUpgrades": 1, "maxUnavailable": "100%"}
    await rest.apply(_nvd("default", default=True, version="580.95.05", upgradePolicy=budget))
    await rest.apply(
        _nvd("h100", nodeSelector={PRODUCT: H100}, version="590.48.01", upgradePolicy=budget)
    )
    watch = UpgradeWatch(rest)
    watcher = asyncio.create_task(watch.run())
    try:
        async with Running(api_client):
            gpu = await _gpu_nodes(rest)
            h100 = {n for n, lab in gpu.items() if lab.get(PRODUCT) == H100}
            others = set(gpu) - h100

            async def all_running() -> dict[str, tuple[str, str, str]] | None:
                pods = await _driver_pods(rest)
                states = [await _nvd_state(rest, n) for n in ("default", "h100")]
                ok = (
                    set(pods) == set(gpu)
                    and all(app != POLICY_DS for _, _, app in pods.values())
                    and states == [("ready", None)] * 2
                )
                return pods if ok else None

            before = await eventually(all_running, timeout=120)
            assert await eventually(lambda: policy_state_is(rest, "ready"), timeout=60)

            await rest.merge_patch(NVD, "default", {"spec": {"version": "580.105.08"}})

            async def upgraded() -> dict[str, tuple[str, str, str]] | None:
                pods = await _driver_pods(rest)
                done = all(
                    n in pods
                    and pods[n][1].endswith(":580.105.08-ubuntu22.04")
                    and watch.nodes.get(n, {}).get(STATE_LABEL) == "upgrade-done"
                    for n in others
                )
                return pods if done else None

            after = await eventually(upgraded, timeout=180)
            await _policy_ready(rest, 60)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        await _cleanup(rest)
    # Every default node went through the upgrade, one at a time (its budget) ...
    assert watch.peak["default"] == 1
    for node in others:
        assert "pod-restart-required" in watch.states[node]
        assert after[node][0] != before[node][0]
    # ... the H100 node's driver never moved ...
    for node in h100:
        assert after[node] == before[node]
        assert watch.states[node] <= {"", "upgrade-done"}
    assert watch.peak["h100"] == 0
    # ... and the ClusterPolicy said so while it ran.
    assert any(
        state == "notReady" and "NVIDIADriver upgrade" in message
        for state, message in watch.policy_messages
    )


class CordonWatch:
    """Every event of one node: each time it is seen mid-upgrade with its state label
    gone or uncordoned before ``uncordon-required``, that moment is recorded."""

    HOLDING = frozenset(
        s.value for s in IN_PROGRESS_STATES if s is not UpgradeState.UNCORDON_REQUIRED
    )

    def __init__(self, rest: Rest, node: str) -> None:
        self.node = node
        self.states: list[str] = []
        self.violations: list[str] = []
        self._upgrading = False
        self.informer = Informer(
            ResourceSpec(
                "test-cordon-node", rest.lister(NODE), field_selector=f"metadata.name={node}"
            ),
            self._on_node,
        )

    def _on_node(self, event: str, old: Obj | None, new: Obj | None) -> None:
        if new is None:
            return
        state = (new["metadata"].get("labels") or {}).get(STATE_LABEL, "")
        cordoned = bool(new["spec"].get("unschedulable"))
        if not self.states or self.states[-1] != state:
            self.states.append(state)
        if state in self.HOLDING:
            self._upgrading = True
            if not cordoned:
                self.violations.append(f"uncordoned in {state}")
        elif self._upgrading and state not in ("uncordon-required", "upgrade-done"):
            self.violations.append(f"left the upgrade for {state or 'no state'}")
        if state in ("uncordon-required", "upgrade-done"):
            self._upgrading = False


async def test_restart_during_an_nvidiadriver_upgrade_keeps_its_state_and_cordon(
    rest: Rest, api_client: client.ApiClient
) -> None:
    """The node waits for a job pod (waitForCompletion, no timeout) while the operator is
    replaced; the new one must carry the upgrade on, not read the resource's policy as
    absent before its NVIDIADriver cache has listed."""
    await _cleanup(rest)
    policy = crd.sample_policy()
    policy["spec"]["driver"]["useNvidiaDriverCRD"] = True
    await rest.apply(policy)
    job = {"app": "nvd-restart-job"}
    budget = {
        "autoUpgrade": True,
        "maxParallelUpgrades": TEST_GPU_NODES,
        "maxUnavailable": "100%",
        "waitForCompletion": {"podSelector": "app=nvd-restart-job", "timeoutSeconds": 0},
    }
    await rest.apply(_nvd("default", default=True, version="580.95.05", upgradePolicy=budget))
    gpu = sorted(n for n, lab in (await _labels(rest)).items() if lab.get(NFD_GPU_LABEL) == "true")
    busy = gpu[0]
    watch = CordonWatch(rest, busy)
    watcher = asyncio.create_task(watch.informer.run())
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "nvd-restart-job", "namespace": NAMESPACE, "labels": job},
        "spec": {
            "nodeName": busy,
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "job", "image": "cuda-sample"}],
        },
    }
    try:
        async with Running(api_client):

            async def all_running() -> bool:
                pods = await _driver_pods(rest)
                return set(pods) == set(gpu) and await _nvd_state(rest, "default") == (
                    "ready",
                    None,
                )

            assert await eventually(all_running, timeout=120)
            await rest.create(POD, pod, NAMESPACE)
            await rest.merge_patch(NVD, "default", {"spec": {"version": "580.105.08"}})

            async def waiting_for_the_job() -> bool:
                node = await rest.get(NODE, busy) or {}
                labels = node.get("metadata", {}).get("labels") or {}
                return labels.get(STATE_LABEL) == "wait-for-jobs-required" and bool(
                    node["spec"].get("unschedulable")
                )

            assert await eventually(waiting_for_the_job, timeout=120)

        async with Running(api_client) as second:

            async def listed() -> bool:
                return second.operator.nvd.drivers.synced.is_set()

            assert await eventually(listed, timeout=30)
            await rest.delete(POD, "nvd-restart-job", NAMESPACE)

            async def upgraded() -> bool:
                pods = await _driver_pods(rest)
                node = await rest.get(NODE, busy) or {}
                labels = node.get("metadata", {}).get("labels") or {}
                return (
                    busy in pods
                    and pods[busy][1].endswith(":580.105.08-ubuntu22.04")
                    and labels.get(STATE_LABEL) == "upgrade-done"
                    and not node["spec"].get("unschedulable")
                )

            assert await eventually(upgraded, timeout=120)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        with contextlib.suppress(ApiException):
            await rest.delete(POD, "nvd-restart-job", NAMESPACE)
        await _cleanup(rest)
        for name in gpu:
            await rest.merge_patch(NODE, name, {"spec": {"unschedulable": None}})
    assert watch.violations == [], watch.states
    assert "wait-for-jobs-required" in watch.states
    assert watch.states[-1] == "upgrade-done"


MOVE_WORK = "nvd-move-work"


def _work_pod(node: str) -> dict[str, Any]:
    """A bare pod (drain needs ``force`` for it) pinned to ``node``."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{MOVE_WORK}-{node}",
            "namespace": NAMESPACE,
            "labels": {"app": MOVE_WORK},
        },
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "work", "image": "cuda-sample"}],
        },
    }


class MoveWatch:
    """Driver pods and nodes, checked at every event of either watch: never two driver
    pods on one node (terminating ones count), a node's driver pod only ever goes or
    comes while the node is cordoned (once ``armed``), and no more nodes than the
    budget in an upgrade or cordoned at once."""

    def __init__(self, rest: Rest, budget: int) -> None:
        self.budget = budget
        self.armed = False
        self.pods: dict[str, Obj] = {}
        self.nodes: dict[str, Obj] = {}
        self.violations: list[str] = []
        self.states: dict[str, list[str]] = {}
        self.events = 0
        self.pod_informer = Informer(
            ResourceSpec(
                "test-move-pods",
                rest.lister(POD, NAMESPACE),
                label_selector="app.kubernetes.io/component=nvidia-driver",
            ),
            self._on_pod,
        )
        self.node_informer = Informer(
            ResourceSpec("test-move-nodes", rest.lister(NODE)), self._on_node
        )
        #: Per node, the event number at which its workload pod went (and whether the
        #: node was cordoned then), and at which its first driver pod went.
        self.evicted: dict[str, tuple[int, bool]] = {}
        self.driver_gone: dict[str, int] = {}
        self.work_informer = Informer(
            ResourceSpec(
                "test-move-work", rest.lister(POD, NAMESPACE), label_selector=f"app={MOVE_WORK}"
            ),
            self._on_work,
        )

    def _on_work(self, event: str, old: Obj | None, new: Obj | None) -> None:
        if event == "DELETED" and old is not None:
            node = old["spec"]["nodeName"]
            cordoned = bool(self.nodes.get(node, {}).get("spec", {}).get("unschedulable"))
            self.evicted[node] = (self.events, cordoned)
        self._check()

    def _on_pod(self, event: str, old: Obj | None, new: Obj | None) -> None:
        pod = new or old
        assert pod is not None
        name = pod["metadata"]["name"]
        node = (pod.get("spec") or {}).get("nodeName")
        if event == "DELETED":
            self.pods.pop(name, None)
            if node and self.armed:
                self.driver_gone.setdefault(node, self.events)
        else:
            self.pods[name] = pod
        if node and self.armed and event != "MODIFIED":
            seen = self.nodes.get(node)
            if seen is None or not seen["spec"].get("unschedulable"):
                self.violations.append(f"driver pod {name} {event} on uncordoned {node}")
        self._check()

    def _on_node(self, event: str, old: Obj | None, new: Obj | None) -> None:
        node = new or old
        assert node is not None
        name = node["metadata"]["name"]
        self.nodes[name] = node
        state = (node["metadata"].get("labels") or {}).get(STATE_LABEL, "")
        seen = self.states.setdefault(name, [])
        if not seen or seen[-1] != state:
            seen.append(state)
        self._check()

    def _check(self) -> None:
        self.events += 1
        per_node = Counter(
            p["spec"]["nodeName"] for p in self.pods.values() if p["spec"].get("nodeName")
        )
        crowded = sorted(n for n, count in per_node.items() if count > 1)
        if crowded:
            self.violations.append(f"two driver pods on {crowded}")
        busy = [
            n
            for n, node in self.nodes.items()
            if UpgradeState((node["metadata"].get("labels") or {}).get(STATE_LABEL) or "unknown")
            in IN_PROGRESS_STATES
        ]
        if len(busy) > self.budget:
            self.violations.append(f"{len(busy)} nodes upgrading at once: {sorted(busy)}")
        cordoned = [n for n, node in self.nodes.items() if node["spec"].get("unschedulable")]
        if len(cordoned) > self.budget:
            self.violations.append(f"{len(cordoned)} nodes cordoned at once: {sorted(cordoned)}")

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(self.pod_informer.run())
            group.create_task(self.node_informer.run())
            group.create_task(self.work_informer.run())


async def test_nodes_move_between_nvidiadrivers_one_at_a_time_cordoned_and_drained(
    rest: Rest, api_client: client.ApiClient
) -> None:
    """A new, more specific resource takes every GPU node from the default one: each
    node is handed over through the upgrade machine under the new owner's budget (one
    at a time, cordoned, drained), the old driver pod gone before the new one comes."""
    await _cleanup(rest)
    policy = crd.sample_policy()
    policy["spec"]["driver"]["useNvidiaDriverCRD"] = True
    await rest.apply(policy)
    one = {"autoUpgrade": True, "maxParallelUpgrades": 1, "maxUnavailable": 1}
    await rest.apply(_nvd("default", default=True, version="580.95.05", upgradePolicy=one))
    watch = MoveWatch(rest, budget=1)
    watcher = asyncio.create_task(watch.run())
    gpu: set[str] = set()
    h100: set[str] = set()
    try:
        async with Running(api_client):
            gpu = {
                n for n, lab in (await _labels(rest)).items() if lab.get(NFD_GPU_LABEL) == "true"
            }

            async def driven_by(
                name: str, others: set[str] = frozenset(), other: str = ""
            ) -> dict[str, tuple[str, str, str]] | None:
                """Every GPU node on ``name``'s driver (``others`` on ``other``'s), done."""
                pods = await _driver_pods(rest)
                labels = await _labels(rest)
                ok = (
                    set(pods) == gpu
                    and all(
                        labels[n].get(crd.OWNER_LABEL) == (other if n in others else name)
                        for n in gpu
                    )
                    and all(labels[n].get(STATE_LABEL) == "upgrade-done" for n in gpu)
                    and [await _nvd_state(rest, r) for r in {name, other} - {""}]
                    == [("ready", None)] * len({name, other} - {""})
                    and all(not watch.nodes[n]["spec"].get("unschedulable") for n in gpu)
                )
                return pods if ok else None

            before = await eventually(lambda: driven_by("default"), timeout=120)
            for node in gpu:
                await rest.create(POD, _work_pod(node), NAMESPACE)

            async def working() -> bool:
                pods = await rest.list(POD, NAMESPACE, label_selector=f"app={MOVE_WORK}")
                return sum(p["status"].get("phase") == "Running" for p in pods) == len(gpu)

            assert await eventually(working, timeout=60)
            watch.armed = True
            drain = {**one, "drain": {"enable": True, "force": True, "timeoutSeconds": 0}}
            await rest.apply(
                _nvd(
                    "every-gpu",
                    nodeSelector={"nvidia.com/gpu.present": "true"},
                    version="590.48.01",
                    upgradePolicy=drain,
                )
            )
            after = await eventually(lambda: driven_by("every-gpu"), timeout=240)
            labels = await _labels(rest)
            assert watch.violations == [], watch.violations[:5]

            # Narrowed to the H100 nodes: the others move back, by the same rules.
            h100 = {n for n in gpu if labels[n].get(PRODUCT) == H100}
            assert h100
            assert gpu - h100
            await rest.merge_patch(NVD, "every-gpu", {"spec": {"nodeSelector": {PRODUCT: H100}}})
            back = await eventually(lambda: driven_by("default", h100, "every-gpu"), timeout=240)
            watch.armed = False
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        await _cleanup(rest)
        for name in gpu:
            await rest.merge_patch(NODE, name, {"spec": {"unschedulable": None}})
            with contextlib.suppress(ApiException):
                await rest.delete(POD, f"{MOVE_WORK}-{name}", NAMESPACE)
    assert watch.violations == [], watch.violations[:5]
    for node in gpu:
        assert after[node][0] != before[node][0]
        assert after[node][1].endswith(":590.48.01-ubuntu22.04")
        assert "cordon-required" in watch.states[node], watch.states[node]
        # drained (by the new owner's policy) while cordoned, before the driver left
        at, cordoned = watch.evicted[node]
        assert cordoned
        assert at < watch.driver_gone[node]
        assert not any(k.startswith("nvidia.com/gpu-operator.driver.next") for k in labels[node])
        if node in h100:
            assert back[node] == after[node]  # its driver never moved again
        else:
            assert back[node][1].endswith(":580.95.05-ubuntu22.04")
            assert watch.states[node].count("cordon-required") == 2, watch.states[node]


async def test_an_nvidiadriver_rollout_starts_with_its_own_canary(
    rest: Rest, api_client: client.ApiClient
) -> None:
    """canary and haltAfterFailures on an NVIDIADriver: kept by the API server, and its
    rollout's record and DriverUpgradeGate condition are on the NVIDIADriver itself."""
    await _cleanup(rest)
    policy = crd.sample_policy()
    policy["spec"]["driver"]["useNvidiaDriverCRD"] = True
    await rest.apply(policy)
    gated = {
        "autoUpgrade": True,
        "maxParallelUpgrades": 0,
        "maxUnavailable": "100%",
        "canary": {"nodes": 1, "soakSeconds": 3600},
        "haltAfterFailures": 1,
    }
    stored = await rest.apply(
        _nvd("default", default=True, version="580.95.05", upgradePolicy=gated)
    )
    assert stored["spec"]["upgradePolicy"]["canary"] == {"nodes": 1, "soakSeconds": 3600}
    assert stored["spec"]["upgradePolicy"]["haltAfterFailures"] == 1
    try:
        async with Running(api_client):
            gpu = await _gpu_nodes(rest)

            async def all_running() -> bool:
                pods = await _driver_pods_by_ds(rest)
                state = await _nvd_state(rest, "default")
                return bool(set().union(*pods.values()) >= set(gpu) and state == ("ready", None))

            assert await eventually(all_running, timeout=120)
            await rest.merge_patch(NVD, "default", {"spec": {"version": "580.105.08"}})

            async def gate() -> tuple[Any, dict[str, Any]] | None:
                got = await rest.get(NVD, "default") or {}
                raw = (got["metadata"].get("annotations") or {}).get("gpuop.io/driver-rollout")
                conds = (got.get("status") or {}).get("conditions") or []
                cond = next((c for c in conds if c["type"] == "DriverUpgradeGate"), None)
                if not raw or cond is None or cond["reason"] != "CanarySoaking":
                    return None
                return raw, cond

            found = await eventually(gate, timeout=240)
            assert found is not None
            record = json.loads(found[0])
            assert len(record["canary"]) == 1  # one node first, the rest soak-held
            labels = await _labels(rest)
            held = [n for n in gpu if n not in record["canary"]]
            assert all(labels[n].get(STATE_LABEL) != "upgrade-done" for n in held)
            cp = await rest.get(POLICY, "cluster-policy") or {}
            assert "gpuop.io/driver-rollout" not in (cp["metadata"].get("annotations") or {})
    finally:
        await _cleanup(rest)
