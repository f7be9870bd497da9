"""The upgrade machine waits for a new driver pod as long as the driver's own startup
probe allows, never less (issue 31 item 4), on the real control plane.

The policy's startup probe gives a 20 s budget (no initial delay, 10 tries 2 s apart).
A taint the driver does not tolerate keeps the new driver pod from being created; lifting
it 12 s after the node entered `pod-restart-required` gives a pod that turns Ready within
the budget (kwok makes it Ready at once), and the node's upgrade completes. Left in
place, the node fails with the budget in its reason.
"""

from __future__ import annotations

import asyncio
import copy
import time
from typing import Any

import pytest
from kubernetes_asyncio import client

import crd
from gpuop.devcluster import NFD_GPU_LABEL
from gpuop.kube.rest import Rest
from statemachine.upgrade_keys import STATE_LABEL
from tests.integration.harness import NODE, POLICY, Running, eventually, policy_state_is

pytestmark = pytest.mark.integration

PROBE = {"initialDelaySeconds": 0, "periodSeconds": 2, "failureThreshold": 10}
BUDGET_S = 20
BLOCK = {"key": "gpuop.io/test-no-new-pods", "value": "x", "effect": "NoSchedule"}


def _policy(version: str) -> dict[str, Any]:
    policy = copy.deepcopy(crd.sample_policy())
    driver = policy["spec"].setdefault("driver", {})
    driver["version"] = version
    driver["startupProbe"] = PROBE
    driver["upgradePolicy"] = {
        "autoUpgrade": True,
        "maxParallelUpgrades": 1,
        "maxUnavailable": "100%",
        "drain": {"enable": False},
        "podDeletion": {"timeoutSeconds": 60},
    }
    return policy


async def _state(rest: Rest, node: str) -> str | None:
    obj = await rest.get(NODE, node)
    assert obj is not None
    return (obj["metadata"].get("labels") or {}).get(STATE_LABEL)


async def _first_gpu_node(rest: Rest) -> str:
    nodes = [
        n["metadata"]["name"]
        for n in await rest.list(NODE)
        if (n["metadata"].get("labels") or {}).get(NFD_GPU_LABEL) == "true"
    ]
    return sorted(nodes)[0]


async def _set_block(rest: Rest, node: str, blocked: bool) -> None:
    obj = await rest.get(NODE, node)
    assert obj is not None
    taints = [t for t in obj["spec"].get("taints") or [] if t["key"] != BLOCK["key"]]
    if blocked:
        taints.append(BLOCK)
    await rest.merge_patch(NODE, node, {"spec": {"taints": taints or None}})


async def test_a_driver_pod_ready_within_the_probe_budget_passes_and_one_never_ready_fails(
    rest: Rest, api_client: client.ApiClient
) -> None:
    await rest.apply(_policy("595.91.07"))
    node = await _first_gpu_node(rest)
    try:
        async with Running(api_client) as run:
            assert run.operator.upgrades.driver_ready_timeout_seconds is None  # no override
            assert await eventually(lambda: policy_state_is(rest, "ready"), timeout=120)
            await run.settle()

            # Ready at about 12 s of a 20 s budget: the upgrade goes on.
            await _set_block(rest, node, True)
            await rest.apply(_policy("600.10.01"))

            async def restarting() -> bool:
                return await _state(rest, node) == "pod-restart-required"

            await eventually(restarting, timeout=90)
            entered = time.monotonic()
            await asyncio.sleep(12)
            await _set_block(rest, node, False)

            async def done() -> bool:
                return await _state(rest, node) == "upgrade-done"

            await eventually(done, timeout=90)
            assert time.monotonic() - entered > 12

            # Never Ready: the node fails once the budget has passed, and says so.
            await _set_block(rest, node, True)
            await rest.apply(_policy("601.00.01"))
            await eventually(restarting, timeout=90)

            async def failed() -> bool:
                return await _state(rest, node) == "upgrade-failed"

            await eventually(failed, timeout=90)
            obj = await rest.get(NODE, node)
            assert obj is not None
            reason = obj["metadata"]["annotations"]["gpuop.io/driver-upgrade-reason"]
            assert reason.startswith(f"new driver pod not ready after {BUDGET_S}s")

            # The driver can run there again: the node heals and is handed back.
            await _set_block(rest, node, False)

            async def healed() -> bool:
                obj = await rest.get(NODE, node)
                assert obj is not None
                cordoned = bool(obj["spec"].get("unschedulable"))
                return await _state(rest, node) == "upgrade-done" and not cordoned

            await eventually(healed, timeout=120)
    finally:
        await _set_block(rest, node, False)
        await rest.delete(POLICY, "cluster-policy")
