"""An operand object the API server refuses (issue 14, item 7): the policy passes our
validation, the rendered DaemonSet does not pass the server's. The status must say
notReady with the server's words, an admin gets a Warning Event, the other objects
are still applied, and the refused object is not sent again on every event."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from kubernetes_asyncio import client

import crd
from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Rest
from tests.integration.harness import NAMESPACE, POLICY, Running, eventually, policy_state_is

pytestmark = pytest.mark.integration

DS = by_kind("apps/v1", "DaemonSet")
SERVICE = by_kind("v1", "Service")
EXPORTER = "nvidia-dcgm-exporter"


def _refused_policy() -> dict[str, Any]:
    """Valid for us (``valueFrom`` is passed through), invalid for the API server."""
    policy = copy.deepcopy(crd.sample_policy())
    policy["spec"]["dcgmExporter"]["env"] = [
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.noSuchField"}}}
    ]
    model, problems = crd.parse_policy(policy)
    assert model is not None  # the premise of this test: we accept it
    assert not problems, problems
    return policy


async def _refusal_condition(rest: Rest) -> dict[str, Any] | None:
    status = ((await rest.get(POLICY, "cluster-policy")) or {}).get("status") or {}
    for cond in status.get("conditions") or []:
        if cond["type"] == "Error" and cond["status"] == "True":
            return cond if cond["reason"] == "ReconcileFailed" else None
    return None


async def _warnings(rest: Rest) -> list[str]:
    events = await rest.list(by_kind("v1", "Event"), "default")
    return [
        e["message"]
        for e in events
        if e["involvedObject"]["kind"] == "ClusterPolicy"
        and e["type"] == "Warning"
        and e["reason"] == "ReconcileFailed"
    ]


async def test_refused_object_becomes_status_event_and_metric_without_retry_loop(
    rest: Rest, api_client: client.ApiClient
) -> None:
    await rest.apply(_refused_policy())
    run = Running(api_client)
    # Timer retries far away: every send of the refused object below is event-driven.
    run.operator.applier.refusal_retry_base = 3600.0
    async with run:
        error = await eventually(lambda: _refusal_condition(rest), timeout=150)
        message = error["message"]
        assert f"DaemonSet {NAMESPACE}/{EXPORTER} refused by the API server (422)" in message
        assert "valueFrom.fieldRef.fieldPath" in message  # the server's own words
        assert await policy_state_is(rest, "notReady")
        assert run.operator.metrics.reconciliation_status._value.get() == -2
        # The object after the refused one in the same component was still applied.
        assert await rest.get(SERVICE, EXPORTER, NAMESPACE) is not None
        assert await rest.get(DS, EXPORTER, NAMESPACE) is None
        assert any(EXPORTER in m for m in await eventually(lambda: _warnings(rest)))

        # No retry loop: passes for other reasons do not send it again, and write nothing.
        queue = run.operator.queue

        async def drained() -> bool:
            # Nothing queued, running or due soon: progress passes (pods turning Ready
            # are counted after a short coalescing delay) have written what they had to.
            return queue.quiet_within(10)

        await eventually(drained)
        sent = run.rest.counts[("APPLY", "daemonsets")]
        writes = run.rest.writes

        for _ in range(5):
            queue.add("cluster")
            await eventually(drained)
        assert run.rest.counts[("APPLY", "daemonsets")] == sent
        assert run.rest.writes == writes, run.rest.write_counts()

        # Fixing the policy sends the changed object at once and clears the error.
        await rest.apply(crd.sample_policy())
        assert await eventually(lambda: policy_state_is(rest, "ready"), timeout=120)
        assert await _refusal_condition(rest) is None
        assert run.operator.metrics.reconciliation_status._value.get() == 1

        # The issue's case: a ready policy edited into one the server refuses no
        # longer keeps saying ready.
        before = len(await _warnings(rest))
        await rest.apply(_refused_policy())
        await eventually(lambda: _refusal_condition(rest), timeout=60)
        assert await policy_state_is(rest, "notReady")

        async def one_more_warning() -> bool:
            return len(await _warnings(rest)) > before

        assert await eventually(one_more_warning)
    await rest.apply(crd.sample_policy())


#: The issue's examples: (spec section, field, value, what the error names).
_ISSUE_EXAMPLES = [
    ("operator", "runtimeClass", "NVIDIA_Runtime", "NVIDIA_Runtime"),
    ("daemonsets", "priorityClassName", "gpu critical", "priorityClassName"),
    ("driver", "env", [{"name": "A=B", "value": "x"}], "A=B"),
]


async def test_the_issues_examples_end_not_ready_with_an_error_never_ready(
    rest: Rest, api_client: client.ApiClient
) -> None:
    """Whichever side refuses them (our validation or the API server), each ends as
    notReady with a true Error condition naming the culprit."""
    async with Running(api_client):
        for section, key, value, culprit in _ISSUE_EXAMPLES:
            policy = copy.deepcopy(crd.sample_policy())
            policy["spec"].setdefault(section, {})[key] = value
            await rest.apply(policy)

            async def error_naming_it(culprit: str = culprit) -> dict[str, Any] | None:
                status = ((await rest.get(POLICY, "cluster-policy")) or {}).get("status") or {}
                for cond in status.get("conditions") or []:
                    if (
                        cond["type"] == "Error"
                        and cond["status"] == "True"
                        and culprit in cond["message"]
                    ):
                        return cond
                return None

            error = await eventually(error_naming_it, timeout=90)
            assert error["reason"] in ("ReconcileFailed", "InvalidSpec"), error
            assert await policy_state_is(rest, "notReady")
    await rest.apply(crd.sample_policy())
