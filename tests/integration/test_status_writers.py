"""Status writers on a real API server: a condition another writer adds between our
read and our write survives the write.

The cluster pass reads the ClusterPolicy from its cache; remediation (another key) sets
RemediationPaused before the cluster pass writes its status. The write carries the
resourceVersion it read, gets a conflict, reads the policy again and merges only its
own condition types onto it.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

import crd
from gpuop.kube.informer import Informer, ResourceSpec
from gpuop.kube.rest import Rest
from gpuop.operator.controller.views.objects import parse_status
from gpuop.operator.controller.writers.policy_status import PolicyStatusWriter
from gpuop.operator.controller.writers.status_write import condition_change, write_policy_conditions
from gpuop.operator.events import EventRecorder
from tests.integration.harness import POLICY

pytestmark = pytest.mark.integration

NAME = "cluster-policy"
PAUSED = {
    "type": "RemediationPaused",
    "status": "True",
    "reason": "CircuitBreakerOpen",
    "message": "3 of 10 GPU nodes unhealthy",
    "lastTransitionTime": "2026-01-01T00:00:00Z",
}


def _types(raw: dict[str, object]) -> list[str]:
    status = raw.get("status") or {}
    assert isinstance(status, dict)
    return [c["type"] for c in status.get("conditions") or []]


async def _fresh_policy(rest: Rest) -> dict[str, object]:
    for existing in await rest.list(POLICY):
        await rest.delete(POLICY, existing["metadata"]["name"])
    await rest.apply(crd.sample_policy())
    raw = await rest.get(POLICY, NAME)
    assert raw is not None
    return raw


async def test_the_cluster_pass_keeps_a_condition_added_between_read_and_write(
    rest: Rest,
) -> None:
    stale = await _fresh_policy(rest)  # what the cluster pass's cache holds
    # Another key (remediation) pauses meanwhile: a separate status write.
    await rest.merge_patch(POLICY, NAME, {"status": {"conditions": [PAUSED]}}, subresource="status")
    policies = Informer(ResourceSpec("policies", rest.lister(POLICY)), lambda *_: None)
    writer = PolicyStatusWriter(rest, policies, EventRecorder(rest), lambda _: None)
    now = datetime.now(UTC)

    await writer.write(
        stale, crd.ready_status("gpu-operator", generation=1, now=now, previous=parse_status(stale))
    )

    stored = await rest.get(POLICY, NAME)
    assert stored is not None
    assert stored["status"]["state"] == "ready"
    assert "RemediationPaused" in _types(stored)
    assert {"Ready", "Error"} <= set(_types(stored))


async def test_a_condition_writer_keeps_the_state_written_after_its_read(rest: Rest) -> None:
    stale = await _fresh_policy(rest)  # what the gate's cache holds
    policies = Informer(ResourceSpec("policies", rest.lister(POLICY)), lambda *_: None)
    writer = PolicyStatusWriter(rest, policies, EventRecorder(rest), lambda _: None)
    now = datetime.now(UTC)
    await writer.write(
        stale, crd.ready_status("gpu-operator", generation=1, now=now, previous=None)
    )
    change = condition_change(stale, "DriverUpgradeGate", ("True", "Halted", "halted"), now)
    assert change is not None

    await write_policy_conditions(rest, policies, stale, change.wanted, owned="DriverUpgradeGate")

    stored = await rest.get(POLICY, NAME)
    assert stored is not None
    assert stored["status"]["state"] == "ready"
    assert set(_types(stored)) == {"Ready", "Error", "DriverUpgradeGate"}
