"""Each ClusterPolicy status writer owns its condition types and never drops another's.

The cluster pass writes Ready, Error and UnsupportedFields (and every other status
field); remediation writes RemediationPaused, the rollout gate DriverUpgradeGate. Each
reads the policy from a cache that may be behind: a condition written meanwhile by
another writer must survive its write. The fake server below applies merge patches
with resourceVersion preconditions, as the API server does.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from crd import ready_status
from gpuop.operator.controller.views.objects import parse_status
from gpuop.operator.controller.writers.policy_status import PolicyStatusWriter
from gpuop.operator.controller.writers.status_write import (
    CLUSTER_PASS_CONDITIONS,
    StatusWrite,
    condition_change,
    merge_owned,
    write_policy_conditions,
)
from tests import factories

Obj = dict[str, Any]
NOW = datetime(2026, 1, 1, tzinfo=UTC)
PAUSED = {
    "type": "RemediationPaused",
    "status": "True",
    "reason": "CircuitBreaker",
    "message": "3 of 10 GPU nodes unhealthy",
    "lastTransitionTime": "2026-01-01T00:00:00Z",
}
GATE = {
    "type": "DriverUpgradeGate",
    "status": "True",
    "reason": "Halted",
    "message": "halted",
    "lastTransitionTime": "2026-01-01T00:00:00Z",
}


class _Server:
    """One ClusterPolicy as the API server holds it (merge patch on status, 409 on a
    stale resourceVersion)."""

    def __init__(self, obj: Obj) -> None:
        self.obj = obj
        self.writes: list[Obj] = []

    def other_writer(self, condition: Obj) -> None:
        """Another key adds (or replaces) its condition, as a separate request."""
        status = self.obj.setdefault("status", {})
        others = [c for c in status.get("conditions") or [] if c["type"] != condition["type"]]
        status["conditions"] = [*others, condition]
        self._bump()

    def _bump(self) -> None:
        meta = self.obj["metadata"]
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)

    async def merge_patch(self, kind: Any, name: str, patch: Obj, **kw: Any) -> Obj:
        assert kw.get("subresource") == "status"
        wanted_rv = (patch.get("metadata") or {}).get("resourceVersion")
        if wanted_rv is not None and wanted_rv != self.obj["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        self.writes.append(patch)
        status = self.obj.setdefault("status", {})
        for key, value in (patch.get("status") or {}).items():
            if value is None:
                status.pop(key, None)
            else:
                status[key] = value  # a merge patch replaces lists whole
        self._bump()
        return copy.deepcopy(self.obj)

    async def get(self, kind: Any, name: str, namespace: str | None = None) -> Obj:
        return copy.deepcopy(self.obj)


class _Cache:
    def __init__(self) -> None:
        self.seen: list[Obj] = []

    def observe(self, raw: Obj) -> None:
        self.seen.append(raw)


class _Events:
    async def record(self, *_: Any, **__: Any) -> None:
        return None


def _policy() -> Obj:
    return factories.policy()


def _types(obj: Obj) -> list[str]:
    return [c["type"] for c in (obj.get("status") or {}).get("conditions") or []]


async def test_the_cluster_pass_keeps_a_condition_written_after_its_read() -> None:
    server = _Server(_policy())
    stale = copy.deepcopy(server.obj)  # what the cluster pass read from its cache
    server.other_writer(PAUSED)  # remediation pauses meanwhile
    writer = PolicyStatusWriter(server, _Cache(), _Events(), lambda _: None)  # type: ignore[arg-type]

    await writer.write(
        stale, ready_status("gpu-operator", generation=1, now=NOW, previous=parse_status(stale))
    )

    assert server.obj["status"]["state"] == "ready"
    assert "RemediationPaused" in _types(server.obj)
    assert {"Ready", "Error"} <= set(_types(server.obj))


async def test_the_cluster_pass_does_not_bring_back_a_removed_condition() -> None:
    """A stale copy of another writer's condition is not ours to write back."""
    policy = _policy()
    policy["status"] = {"conditions": [GATE]}
    server = _Server(policy)
    stale = copy.deepcopy(server.obj)
    server.obj["status"]["conditions"] = []  # the gate removed its condition meanwhile
    server._bump()
    writer = PolicyStatusWriter(server, _Cache(), _Events(), lambda _: None)  # type: ignore[arg-type]

    await writer.write(
        stale, ready_status("gpu-operator", generation=1, now=NOW, previous=parse_status(stale))
    )

    assert "DriverUpgradeGate" not in _types(server.obj)
    assert "Ready" in _types(server.obj)


async def test_a_condition_writer_keeps_the_cluster_pass_fields_and_conditions() -> None:
    server = _Server(_policy())
    stale = copy.deepcopy(server.obj)
    writer = PolicyStatusWriter(server, _Cache(), _Events(), lambda _: None)  # type: ignore[arg-type]
    await writer.write(
        copy.deepcopy(server.obj), ready_status("gpu-operator", generation=1, now=NOW)
    )
    # The gate read the policy before the cluster pass wrote; its write comes after.
    change = condition_change(stale, "DriverUpgradeGate", ("True", "Halted", "halted"), NOW)
    assert change is not None

    await write_policy_conditions(server, _Cache(), stale, change.wanted, owned="DriverUpgradeGate")  # type: ignore[arg-type]

    assert server.obj["status"]["state"] == "ready"
    assert set(_types(server.obj)) == {"Ready", "Error", "DriverUpgradeGate"}


def test_merge_owned_replaces_only_the_owned_types_in_place() -> None:
    stored = [
        {"type": "Ready", "status": "False"},
        PAUSED,
        {"type": "Error", "status": "True"},
        GATE,
    ]
    ours = [{"type": "Ready", "status": "True"}, {"type": "UnsupportedFields", "status": "True"}]
    merged = merge_owned(stored, ours, CLUSTER_PASS_CONDITIONS)
    assert merged == [
        {"type": "Ready", "status": "True"},
        PAUSED,
        GATE,
        {"type": "UnsupportedFields", "status": "True"},
    ]


def test_a_status_write_refuses_conditions_it_does_not_own() -> None:
    with pytest.raises(ValueError, match="RemediationPaused"):
        StatusWrite(owned=frozenset({"DriverUpgradeGate"}), conditions=(PAUSED,))


def test_a_condition_write_takes_every_other_field_from_the_stored_status() -> None:
    write = StatusWrite(owned=frozenset({"DriverUpgradeGate"}), conditions=(GATE,))
    stored = {"state": "ready", "conditions": [PAUSED, {**GATE, "status": "False"}]}
    assert write.status_for(stored) == {"state": "ready", "conditions": [PAUSED, GATE]}
