"""Automatic rollback after a halt (`upgradePolicy.rollbackOnHalt`) on the real control
plane: a new driver fails its canary, the rollout halts, and the canary goes back to the
revision the rest of the fleet still runs, through the upgrade machine; the policy,
an Event and a metric say so, and the resume annotation retries the new driver."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from kubernetes_asyncio import client

import crd
from gpuop.kube.informer import Informer, Obj, ResourceSpec
from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Rest
from gpuop.operator.controller.views.objects import nvd_owner
from statemachine.rollback import ROLLBACK_ANNOTATION
from statemachine.upgrade_keys import STATE_LABEL
from tests.integration.harness import NAMESPACE, NODE, POLICY, Running, eventually, policy_state_is
from tests.integration.test_nvidiadriver import NVD, _nvd, _nvd_state
from tests.integration.test_nvidiadriver import _cleanup as nvd_cleanup
from tests.integration.test_upgrade import _driver_hashes, _events, _now, _policy
from tests.integration.test_upgrade_ops import _gate_condition, _gpu, _states

pytestmark = pytest.mark.integration

DS = by_kind("apps/v1", "DaemonSet")
POD = by_kind("v1", "Pod")
REVISION = by_kind("apps/v1", "ControllerRevision")
OLD, NEW = "595.91.07", "600.10.01"
BLOCKED = {"key": "gpuop.io/test-no-new-pods", "value": "x", "effect": "NoSchedule"}
EXTRA: dict[str, Any] = {
    "haltAfterFailures": 1,
    "canary": {"nodes": 1},
    "rollbackOnHalt": True,
    "drain": {"enable": False},
}


class NodeStates:
    """Every upgrade state each node passed through, in order."""

    def __init__(self, rest: Rest) -> None:
        self.states: dict[str, list[str]] = {}
        self.informer = Informer(ResourceSpec("test-rb-nodes", rest.lister(NODE)), self._on)

    def _on(self, event: str, old: Obj | None, new: Obj | None) -> None:
        node = new or old
        assert node is not None
        state = (node["metadata"].get("labels") or {}).get(STATE_LABEL, "")
        seen = self.states.setdefault(node["metadata"]["name"], [])
        if not seen or seen[-1] != state:
            seen.append(state)


async def _block_new_pods(rest: Rest, gpu: list[str], taints: dict[str, list[Any]]) -> None:
    """Taint every GPU node so that no new driver pod starts; ``taints``: what each had."""
    for name in gpu:
        node = await rest.get(NODE, name)
        assert node is not None
        taints[name] = node["spec"].get("taints") or []
        await rest.merge_patch(NODE, name, {"spec": {"taints": [*taints[name], BLOCKED]}})


async def _restore_taints(rest: Rest, taints: dict[str, list[Any]]) -> None:
    for name, previous in taints.items():
        await rest.merge_patch(NODE, name, {"spec": {"taints": previous or None}})


async def _driver_image(rest: Rest) -> str:
    ds = await rest.get(DS, "nvidia-driver-daemonset", NAMESPACE)
    assert ds is not None
    containers = ds["spec"]["template"]["spec"]["containers"]
    return str(next(c["image"] for c in containers if c["name"] == "nvidia-driver-ctr"))


async def _rollback_record(rest: Rest) -> str | None:
    policy = await rest.get(POLICY, "cluster-policy") or {}
    return ((policy.get("metadata") or {}).get("annotations") or {}).get(ROLLBACK_ANNOTATION)


async def test_a_halted_canary_goes_back_to_the_validated_driver(
    rest: Rest, api_client: client.ApiClient
) -> None:
    await rest.apply(_policy(OLD, max_parallel=1, max_unavailable="100%", **EXTRA))
    gpu = await _gpu(rest)
    taints: dict[str, list[Any]] = {}
    watch = NodeStates(rest)
    watcher = asyncio.create_task(watch.informer.run())
    try:
        async with Running(api_client) as run:
            run.operator.upgrades.driver_ready_timeout_seconds = 10
            await eventually(lambda: policy_state_is(rest, "ready"), timeout=90, what="ready")
            await run.settle()
            before = await _driver_hashes(rest)
            assert set(before) == set(gpu)
            # The new driver's pods cannot start anywhere (a taint they do not tolerate).
            await _block_new_pods(rest, gpu, taints)
            since = _now()
            await rest.apply(_policy(NEW, max_parallel=1, max_unavailable="100%", **EXTRA))

            # The canary fails, the rollout halts, and the driver goes back.
            async def rolled_back() -> bool:
                cond = await _gate_condition(rest)
                return cond.get("reason") == "RolledBack" and OLD in await _driver_image(rest)

            await eventually(rolled_back, timeout=120, what="rolled back")
            failed = [n for n, s in (await _states(rest, gpu)).items() if s == "upgrade-failed"]
            assert len(failed) <= 1, failed
            # The cause goes with the bad driver: pods of the old one may start again.
            await _restore_taints(rest, taints)

            seen: dict[str, object] = {}

            async def back_and_done() -> dict[str, str] | None:
                states = await _states(rest, gpu)
                hashes = await _driver_hashes(rest)
                seen.update(states=states, hashes=hashes, before=before)
                ok = set(states.values()) == {"upgrade-done"} and hashes == before
                return hashes if ok else None

            try:
                what = "every node back on the old driver"
                await eventually(back_and_done, timeout=240, what=what)
            except AssertionError as err:  # say where each node stood
                seen["gate"] = await _gate_condition(rest)
                raise AssertionError(f"{err}; last seen: {seen}") from None
            for name in gpu:
                node = await rest.get(NODE, name)
                assert node is not None
                assert not node["spec"].get("unschedulable"), name
            cond = await _gate_condition(rest)
            assert cond.get("reason") == "RolledBack", cond
            assert "rolled back after a halt" in cond.get("message", "")
            assert run.operator.metrics.upgrade_rolled_back._value.get() == 1
            assert "cluster-policy" in await _events(rest, "DriverUpgradeRolledBack", since)
            assert "cluster-policy" in await _events(rest, "DriverUpgradeHalted", since)
            canary = [n for n, seen in watch.states.items() if "pod-restart-required" in seen]
            assert len(canary) == 1, watch.states  # only the canary ever had its driver moved

            # Resuming retries the new driver: the rollback record goes, the template too.
            await rest.merge_patch(
                POLICY,
                "cluster-policy",
                {"metadata": {"annotations": {"gpuop.io/driver-upgrade-resume": "true"}}},
            )

            async def retried() -> bool:
                return await _rollback_record(rest) is None and NEW in await _driver_image(rest)

            await eventually(retried, timeout=60, what="the new driver retried")

            async def new_everywhere() -> bool:
                states = await _states(rest, gpu)
                hashes = await _driver_hashes(rest)
                return set(states.values()) == {"upgrade-done"} and not (
                    set(hashes.values()) & set(before.values())
                )

            # ... and, its cause gone, it runs everywhere: no node is left mid-upgrade.
            await eventually(new_everywhere, timeout=240, what="the new driver everywhere")
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        await _restore_taints(rest, taints)
    await rest.delete(POLICY, "cluster-policy")


async def _nvd_hashes(rest: Rest) -> dict[str, str]:
    """node -> controller-revision-hash of its live NVIDIADriver driver pod."""
    pods = await rest.list(
        POD, NAMESPACE, label_selector="app.kubernetes.io/component=nvidia-driver"
    )
    return {
        p["spec"]["nodeName"]: p["metadata"]["labels"]["controller-revision-hash"]
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
        and p["spec"].get("nodeName")
        # the NVIDIADriver's pods, not a ClusterPolicy driver pod still leaving
        and p["metadata"]["labels"].get("app") != "nvidia-driver-daemonset"
    }


async def _nvd_condition(rest: Rest) -> dict[str, Any]:
    got = await rest.get(NVD, "default") or {}
    conds = (got.get("status") or {}).get("conditions") or []
    return next((dict(c) for c in conds if c["type"] == "DriverUpgradeGate"), {})


async def _nvd_images(rest: Rest) -> set[str]:
    images = set()
    for ds in await rest.list(DS, NAMESPACE):
        if nvd_owner(ds) != "default":
            continue
        for c in ds["spec"]["template"]["spec"]["containers"]:
            if c["name"] == "nvidia-driver-ctr":
                images.add(c["image"])
    return images


async def test_an_nvidiadriver_halt_rolls_its_own_pools_back(
    rest: Rest, api_client: client.ApiClient
) -> None:
    await nvd_cleanup(rest)
    policy = crd.sample_policy()
    policy["spec"]["driver"]["useNvidiaDriverCRD"] = True
    await rest.apply(policy)
    gated = {
        "autoUpgrade": True,
        "maxParallelUpgrades": 1,
        "maxUnavailable": "100%",
        "drain": {"enable": False},
        **{k: v for k, v in EXTRA.items() if k != "drain"},
    }
    await rest.apply(_nvd("default", default=True, version="580.95.05", upgradePolicy=gated))
    gpu = await _gpu(rest)
    taints: dict[str, list[Any]] = {}
    try:
        async with Running(api_client) as run:
            run.operator.upgrades.driver_ready_timeout_seconds = 10

            async def all_running() -> dict[str, str] | None:
                hashes = await _nvd_hashes(rest)
                ready = await _nvd_state(rest, "default") == ("ready", None)
                return hashes if ready and set(hashes) == set(gpu) else None

            before = await eventually(all_running, timeout=120, what="NVIDIADriver pods")
            await run.settle()
            await _block_new_pods(rest, gpu, taints)
            since = _now()
            await rest.merge_patch(NVD, "default", {"spec": {"version": "580.105.08"}})

            async def rolled_back() -> bool:
                cond = await _nvd_condition(rest)
                images = await _nvd_images(rest)
                return cond.get("reason") == "RolledBack" and all(
                    ":580.95.05-" in i for i in images
                )

            await eventually(rolled_back, timeout=120, what="the NVIDIADriver rolled back")
            await _restore_taints(rest, taints)

            async def back_and_done() -> bool:
                states = await _states(rest, gpu)
                return (
                    set(states.values()) == {"upgrade-done"} and await _nvd_hashes(rest) == before
                )

            try:
                await eventually(back_and_done, timeout=240, what="NVIDIADriver nodes back")
            except AssertionError as err:
                revisions = [
                    (r["metadata"]["name"], r.get("revision"))
                    for r in await rest.list(REVISION, NAMESPACE)
                ]
                raise AssertionError(
                    f"{err}; states {await _states(rest, gpu)}, before {before},"
                    f" now {await _nvd_hashes(rest)}, revisions {revisions}"
                ) from None
            events = await rest.list(by_kind("v1", "Event"), "default")
            assert any(
                e.get("reason") == "DriverUpgradeRolledBack"
                and e["involvedObject"]["kind"] == "NVIDIADriver"
                and (e.get("lastTimestamp") or e.get("eventTime") or "") >= since
                for e in events
            ), [e.get("reason") for e in events]
            # the ClusterPolicy's own rollout carries no rollback
            assert await _rollback_record(rest) is None
    finally:
        await _restore_taints(rest, taints)
        await nvd_cleanup(rest)
