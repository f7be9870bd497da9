"""Settle time by the operator's clock (issue 43, item 6).

The node agent stamps ``lastTransitionTime`` of GPUHealthy with the GPU node's clock. A
node a year ahead must not stay quarantined for a year, nor one a year behind be
released at once: a quarantined node is released ``settleSeconds`` after the operator
first saw its GPUs healthy, and that sighting is recorded on the node so a restarted
operator resumes the wait instead of starting it over (or skipping it).
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest.mock import AsyncMock, MagicMock

import pytest

import crd
from gpuop.kube.informer import Obj
from gpuop.operator.controller.passes import remediation as _remediation
from gpuop.operator.controller.passes.remediation import Remediation
from gpuop.operator.controller.views.node_views import trim_node
from statemachine.remediation import QUARANTINED_ANNOTATION, TAINT_KEY

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
YEAR = timedelta(days=365)
SETTLE = 60


def _stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    """RFC 7386 JSON merge patch, in place."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


class _Nodes:
    """The node cache: trimmed nodes by name, as the operator's informer keeps them."""

    def __init__(self) -> None:
        self.items: dict[str, Obj] = {}

    def values(self) -> list[Obj]:
        return list(self.items.values())

    def get(self, name: str) -> Obj | None:
        return self.items.get(name)

    def observe(self, node: Obj) -> None:
        self.items[node["metadata"]["name"]] = trim_node(node)


class _Cluster:
    """The API server's nodes: what survives an operator restart."""

    def __init__(self, node: dict[str, Any]) -> None:
        self.nodes = {node["metadata"]["name"]: node}

    async def merge_patch(self, kind: Any, name: str, patch: dict[str, Any]) -> Obj:
        node = self.nodes[name]
        patch = copy.deepcopy(patch)
        patch.get("metadata", {}).pop("resourceVersion", None)
        _merge(node, patch)
        node["metadata"]["resourceVersion"] = str(int(node["metadata"]["resourceVersion"]) + 1)
        return copy.deepcopy(node)


def _quarantined_node(transition: datetime) -> dict[str, Any]:
    """Quarantined earlier; its agent now reports the GPUs healthy since ``transition``."""
    return {
        "metadata": {
            "name": "gpu-a",
            "resourceVersion": "1",
            "labels": {"feature.node.kubernetes.io/pci-10de.present": "true"},
            "annotations": {QUARANTINED_ANNOTATION: "XidCritical: GPU 0: XID 79"},
        },
        "spec": {"taints": [{"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}]},
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True"},
                {
                    "type": "GPUHealthy",
                    "status": "True",
                    "reason": "Healthy",
                    "message": "",
                    "lastTransitionTime": _stamp(transition),
                },
            ]
        },
    }


def _policy(*, dry_run: bool = False) -> tuple[Obj, crd.ClusterPolicy]:
    spec = crd.ClusterPolicySpec.model_validate(
        {
            "healthRemediation": {
                "enabled": True,
                "dryRun": dry_run,
                "maxUnhealthy": 1,
                "settleSeconds": SETTLE,
            }
        }
    )
    model = crd.ClusterPolicy(metadata={"name": "cluster-policy"}, spec=spec)
    return {"metadata": {"name": "cluster-policy", "annotations": {}}}, model


class _Operator:
    """One operator process: its memory is lost on `restart`, the cluster is not."""

    def __init__(self, cluster: _Cluster, *, dry_run: bool = False) -> None:
        self.cluster = cluster
        self.dry_run = dry_run
        self.events = MagicMock()
        self.restart()

    def restart(self) -> None:
        nodes = _Nodes()
        for node in self.cluster.nodes.values():
            nodes.observe(copy.deepcopy(node))
        raw, model = _policy(dry_run=self.dry_run)
        self.events = MagicMock()
        self.events.record = AsyncMock()
        self.remediation = Remediation(
            self.cluster,  # type: ignore[arg-type]
            MagicMock(),
            self.events,
            nodes,
            MagicMock(),
            lambda: (raw, model, ()),  # type: ignore[arg-type,return-value]
            AsyncMock(),
        )

    async def pass_at(self, now: datetime, monkeypatch: pytest.MonkeyPatch) -> float | None:
        class _Clock(datetime):
            @classmethod
            def now(cls, tz: Any = None) -> _Clock:
                return cls.fromtimestamp(now.timestamp(), tz)

        monkeypatch.setattr(_remediation, "datetime", _Clock)
        return await self.remediation.reconcile()

    def quarantined(self) -> bool:
        node = self.cluster.nodes["gpu-a"]
        return QUARANTINED_ANNOTATION in (node["metadata"].get("annotations") or {})


async def test_a_node_a_year_ahead_is_released_settle_seconds_after_it_was_seen_healthy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster = _Cluster(_quarantined_node(transition=T0 + YEAR))
    operator = _Operator(cluster)
    delay = await operator.pass_at(T0, monkeypatch)
    assert operator.quarantined()
    assert delay is not None
    assert delay <= SETTLE + 2  # wakes at the end of the settle time, not in a year
    await operator.pass_at(T0 + timedelta(seconds=SETTLE - 1), monkeypatch)
    assert operator.quarantined()
    await operator.pass_at(T0 + timedelta(seconds=SETTLE), monkeypatch)
    assert not operator.quarantined()
    node = cluster.nodes["gpu-a"]
    assert not any(t["key"] == TAINT_KEY for t in node["spec"].get("taints") or [])
    assert not any(k.startswith("gpuop.io/gpu-health") for k in node["metadata"]["annotations"])


async def test_a_node_a_year_behind_is_not_released_early(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster = _Cluster(_quarantined_node(transition=T0 - YEAR))
    operator = _Operator(cluster)
    await operator.pass_at(T0, monkeypatch)
    assert operator.quarantined()
    await operator.pass_at(T0 + timedelta(seconds=SETTLE - 1), monkeypatch)
    assert operator.quarantined()
    await operator.pass_at(T0 + timedelta(seconds=SETTLE), monkeypatch)
    assert not operator.quarantined()


@pytest.mark.parametrize("skew", [YEAR, -YEAR, timedelta(0)], ids=["ahead", "behind", "in-sync"])
async def test_a_restarted_operator_resumes_the_wait_from_the_cluster(
    skew: timedelta, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen healthy at T0, restarted at T0+30: released at T0+settle, not later, not sooner."""
    cluster = _Cluster(_quarantined_node(transition=T0 + skew))
    operator = _Operator(cluster)
    await operator.pass_at(T0, monkeypatch)
    operator.restart()
    delay = await operator.pass_at(T0 + timedelta(seconds=30), monkeypatch)
    assert operator.quarantined()
    assert delay is not None
    assert SETTLE - 30 <= delay <= SETTLE - 30 + 2
    operator.restart()
    await operator.pass_at(T0 + timedelta(seconds=SETTLE), monkeypatch)
    assert not operator.quarantined()


async def test_a_new_transition_starts_the_wait_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPUs failed and recovered between two passes: the new lastTransitionTime says
    so, and the record of the earlier healthy spell no longer counts."""
    cluster = _Cluster(_quarantined_node(transition=T0 + YEAR))
    operator = _Operator(cluster)
    await operator.pass_at(T0, monkeypatch)
    health = cluster.nodes["gpu-a"]["status"]["conditions"][1]
    health["lastTransitionTime"] = _stamp(T0 + YEAR + timedelta(seconds=40))
    operator.restart()
    await operator.pass_at(T0 + timedelta(seconds=40), monkeypatch)
    await operator.pass_at(T0 + timedelta(seconds=SETTLE), monkeypatch)
    assert operator.quarantined()
    await operator.pass_at(T0 + timedelta(seconds=40 + SETTLE), monkeypatch)
    assert not operator.quarantined()


async def test_dry_run_records_nothing_and_tells_the_release_after_settling(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster = _Cluster(_quarantined_node(transition=T0 + YEAR))
    before = copy.deepcopy(cluster.nodes)
    operator = _Operator(cluster, dry_run=True)
    await operator.pass_at(T0, monkeypatch)
    await operator.pass_at(T0 + timedelta(seconds=SETTLE - 1), monkeypatch)
    assert not operator.events.record.await_count
    await operator.pass_at(T0 + timedelta(seconds=SETTLE), monkeypatch)
    assert [c.args[1] for c in operator.events.record.await_args_list] == ["GPUHealthyDryRun"]
    assert cluster.nodes == before
