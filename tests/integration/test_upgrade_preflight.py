"""The upgrade pre-flight against a real OCI registry on loopback (issue 47 item 1).

The registry client answers present, missing, refused and unreachable as the
distribution registry gives them, anonymously and through token auth. With the operator:
a driver version whose tag is not in the registry holds the pool (no node cordoned or
started, the tag named on the DaemonSet, in an Event and in ``gpuop upgrade status``);
once the tag is pushed the held pool is asked again and the upgrade runs. The registry
wants tokens here, so the pool's pull Secret is what lets the operator ask.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client

import crd
from components.image_ref import Credential
from gpuop.devcluster import NFD_GPU_LABEL, ClusterInfo
from gpuop.kube.backoff import Backoff
from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Rest
from gpuop.operator.controller import OperatorConfig
from gpuop.operator.controller.writers.preflight import SECRET
from gpuop.operator.controller.writers.registry import RegistryClient
from statemachine.preflight import RECORD_ANNOTATION, Found, Mode, recorded_hold
from statemachine.upgrade_keys import STATE_LABEL
from tests.integration.harness import NAMESPACE, NODE, POLICY, Running, eventually, policy_state_is
from tests.integration.oci_registry import (
    Registry,
    TokenService,
    dockerconfig_secret,
    free_port,
    push,
    registry,
    token_service,
)
from tests.integration.test_upgrade_ops import _cli

pytestmark = pytest.mark.integration

DAEMONSET = by_kind("apps/v1", "DaemonSet")
EVENT = by_kind("v1", "Event")
DRIVER_DS = "nvidia-driver-daemonset"
PULLER = ("puller", "pull-secret-password")


@pytest.fixture(scope="module")
async def tokens() -> AsyncIterator[TokenService]:
    async with token_service({PULLER[0]: PULLER[1]}) as service:
        yield service


@pytest.fixture(scope="module")
async def anonymous(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Registry]:
    with registry(tmp_path_factory.mktemp("anonymous")) as reg:
        yield reg


@pytest.fixture(scope="module")
async def guarded(
    tmp_path_factory: pytest.TempPathFactory, tokens: TokenService
) -> AsyncIterator[Registry]:
    with registry(tmp_path_factory.mktemp("token"), tokens) as reg:
        yield reg


async def test_registry_answers_present_missing_refused_unreachable(
    anonymous: Registry, guarded: Registry, tokens: TokenService
) -> None:
    await push(anonymous, f"{anonymous.host}/nvidia/driver:1.0-ubuntu22.04")
    await push(guarded, f"{guarded.host}/nvidia/driver:1.0-ubuntu22.04")
    good = Credential(*PULLER)
    dead = f"127.0.0.1:{free_port()}"
    asks: dict[str, Credential | None] = {
        f"{anonymous.host}/nvidia/driver:1.0-ubuntu22.04": None,
        f"{anonymous.host}/nvidia/driver:2.0-ubuntu22.04": None,
        f"{anonymous.host}/nvidia/other:1.0": None,
        f"{dead}/nvidia/driver:1.0": None,
    }
    answers = await RegistryClient(timeout_s=5).check_all(asks)
    assert {i: a.found for i, a in answers.items()} == {
        f"{anonymous.host}/nvidia/driver:1.0-ubuntu22.04": Found.PRESENT,
        f"{anonymous.host}/nvidia/driver:2.0-ubuntu22.04": Found.MISSING,
        f"{anonymous.host}/nvidia/other:1.0": Found.MISSING,
        f"{dead}/nvidia/driver:1.0": Found.UNREACHABLE,
    }
    tokens.asked.clear()
    present = f"{guarded.host}/nvidia/driver:1.0-ubuntu22.04"
    missing = f"{guarded.host}/nvidia/driver:2.0-ubuntu22.04"
    with_token = await RegistryClient(timeout_s=5).check_all({present: good, missing: good})
    assert with_token[present].found is Found.PRESENT
    assert with_token[missing].found is Found.MISSING
    # The token service was asked with the pull credentials, for pull only.
    assert (PULLER[0], "repository:nvidia/driver:pull") in tokens.asked
    wrong = Credential(PULLER[0], "wrong")
    refused = await RegistryClient(timeout_s=5).check_all({present: wrong})
    assert refused[present].found is Found.DENIED
    anonymous_ask = await RegistryClient(timeout_s=5).check_all({present: None})
    assert anonymous_ask[present].found is Found.DENIED


def _policy(reg: Registry, version: str) -> dict[str, Any]:
    policy = copy.deepcopy(crd.sample_policy())
    driver = policy["spec"].setdefault("driver", {})
    driver["repository"] = f"{reg.host}/nvidia"
    driver["version"] = version
    driver["imagePullSecrets"] = ["regcred"]
    driver.setdefault("manager", {})["repository"] = f"{reg.host}/nvidia/cloud-native"
    driver["upgradePolicy"] = {
        "autoUpgrade": True,
        "maxParallelUpgrades": 0,
        "maxUnavailable": "100%",
        "drain": {"enable": False},
        "podDeletion": {"timeoutSeconds": 30},
    }
    return policy


async def _gpu_nodes(rest: Rest) -> dict[str, dict[str, Any]]:
    return {
        n["metadata"]["name"]: n
        for n in await rest.list(NODE)
        if (n["metadata"].get("labels") or {}).get(NFD_GPU_LABEL) == "true"
    }


def _state(node: dict[str, Any]) -> str:
    return str((node["metadata"].get("labels") or {}).get(STATE_LABEL, ""))


async def _all_done(rest: Rest) -> bool:
    nodes = await _gpu_nodes(rest)
    return bool(nodes) and all(_state(n) == "upgrade-done" for n in nodes.values())


async def _hold_naming(rest: Rest, tag: str) -> str:
    """The pre-flight hold recorded for the driver DaemonSet's current template, once
    it names ``tag`` (an older template's hold may still be current a moment)."""
    got = await rest.get(DAEMONSET, DRIVER_DS, NAMESPACE)
    assert got is not None
    meta = got["metadata"]
    hold = recorded_hold(meta.get("annotations") or {}, int(meta["generation"]))
    return hold if tag in hold else ""


def _images(ds: dict[str, Any]) -> list[str]:
    spec = ds["spec"]["template"]["spec"]
    return [c["image"] for key in ("initContainers", "containers") for c in spec.get(key) or ()]


async def test_missing_tag_holds_the_pool_and_a_pushed_tag_proceeds(
    rest: Rest, api_client: client.ApiClient, guarded: Registry, local_cluster: ClusterInfo
) -> None:
    await rest.create(SECRET, dockerconfig_secret("regcred", guarded.host, *PULLER), NAMESPACE)
    config = OperatorConfig(
        namespace=NAMESPACE,
        workers=4,
        operator_image=f"{guarded.host}/gpuop/gpuop:test",
        upgrade_preflight=Mode.HOLD,
    )
    try:
        await rest.apply(_policy(guarded, "595.91.07"))
        async with Running(api_client, config) as run:
            preflight = run.operator.node_passes.preflight
            assert preflight is not None
            preflight.retry = Backoff(base=1.0, cap=2.0, jitter=0.0)
            await eventually(lambda: policy_state_is(rest, "ready"), timeout=90)
            await run.settle()
            ds = await rest.get(DAEMONSET, DRIVER_DS, NAMESPACE)
            assert ds is not None
            for image in _images(ds):  # the installed driver's images are all there
                await push(guarded, image)
            # (Nodes a previous test left on another driver move onto this one first.)
            await eventually(lambda: _all_done(rest), timeout=90, what="installed driver")
            await run.settle()
            # An idle operator asks the registry nothing.
            asked_before = preflight.requests
            await run.settle()
            assert preflight.requests == asked_before

            await rest.apply(_policy(guarded, "600.10.01"))

            hold = await eventually(
                lambda: _hold_naming(rest, "600.10.01"), timeout=60, what="pre-flight hold"
            )
            ds = await rest.get(DAEMONSET, DRIVER_DS, NAMESPACE)
            assert ds is not None
            missing = [i for i in _images(ds) if ":600.10.01" in i]
            assert missing
            assert all(i in hold for i in missing), hold
            assert "not found" in hold
            # Every GPU node waits: none cordoned, none started; the wave is held.
            await asyncio.sleep(2)  # passes a retry of the held pool (1-2 s backoff)
            gpu = await _gpu_nodes(rest)
            assert {_state(n) for n in gpu.values()} == {"upgrade-required"}, gpu
            assert not any(n["spec"].get("unschedulable") for n in gpu.values())
            events = await rest.list(EVENT, NAMESPACE)
            reasons = [
                e["message"] for e in events if e.get("reason") == "DriverUpgradePreflightHeld"
            ]
            assert any(missing[0] in m for m in reasons), reasons
            # `gpuop upgrade status` and `plan` name the tag: per waiting node, and the pool.
            _, text = await _cli(local_cluster, "status", "-o", "json")
            report = json.loads(text)
            assert report["preflight"] == {DRIVER_DS: hold}
            assert all(missing[0] in (r["waits_for"] or "") for r in report["nodes"]), report
            _, text = await _cli(local_cluster, "plan", capture="plan-preflight")
            assert f"upgrade pre-flight ({DRIVER_DS}): {hold}" in text, text
            await _cli(local_cluster, "status", capture="status-preflight")

            # The mirror catches up: the held pool is asked again and the upgrade runs.
            for image in missing:
                await push(guarded, image)

            await eventually(lambda: _all_done(rest), timeout=90, what="upgrade after the push")
            ds = await rest.get(DAEMONSET, DRIVER_DS, NAMESPACE)
            assert ds is not None
            assert RECORD_ANNOTATION not in (ds["metadata"].get("annotations") or {})
            assert run.operator.queue.stats.failed == 0
    finally:
        await rest.apply(crd.sample_policy())
        await rest.delete(POLICY, "cluster-policy")
        await rest.delete(SECRET, "regcred", NAMESPACE)


async def test_an_unreachable_registry_holds_unless_the_operator_fails_open(
    rest: Rest, api_client: client.ApiClient
) -> None:
    dead = Registry(f"127.0.0.1:{free_port()}")  # nothing listens there

    def config(mode: Mode) -> OperatorConfig:
        image = f"{dead.host}/gpuop/gpuop:test"
        return OperatorConfig(
            namespace=NAMESPACE, workers=4, operator_image=image, upgrade_preflight=mode
        )

    try:
        await rest.apply(_policy(dead, "595.91.07"))
        async with Running(api_client, config(Mode.HOLD)) as run:
            await eventually(lambda: policy_state_is(rest, "ready"), timeout=90)
            await run.settle()
            await rest.apply(_policy(dead, "600.10.01"))
            why = await eventually(
                lambda: _hold_naming(rest, "600.10.01"), timeout=60, what="pre-flight hold"
            )
            assert "registry unreachable" in why
            assert f"{dead.host}/nvidia/driver:600.10.01" in why
            gpu = await _gpu_nodes(rest)
            assert {_state(n) for n in gpu.values()} == {"upgrade-required"}, gpu
            assert not any(n["spec"].get("unschedulable") for n in gpu.values())
        # The same cluster under an operator that fails open: the wave proceeds.
        async with Running(api_client, config(Mode.PROCEED)) as run:
            await eventually(lambda: _all_done(rest), timeout=90, what="upgrade, failing open")
            assert await _hold_naming(rest, "") == ""
            events = await rest.list(EVENT, NAMESPACE)
            passed = [
                e["message"] for e in events if e.get("reason") == "DriverUpgradePreflightPassed"
            ]
            assert any("unchecked (registry unreachable)" in m for m in passed), passed
    finally:
        await rest.apply(crd.sample_policy())
        await rest.delete(POLICY, "cluster-policy")
