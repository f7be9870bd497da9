"""The controller's units without a cluster: the ClusterPolicy status as a pure function
of what a pass observed, the version memo, and applying/pruning over read-only caches."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest

import crd
from components.hashing import with_hash
from gpuop.kube.compact import shared
from gpuop.kube.informer import Informer, ResourceSpec
from gpuop.operator.controller.base.memo import VersionMemo
from gpuop.operator.controller.views.cluster_status import (
    NFD_MISSING_MESSAGE,
    ClusterObservation,
    cluster_status,
    invalid_status,
)
from gpuop.operator.controller.views.refusals import Refusal
from gpuop.operator.controller.views.rollout_view import RolloutView
from gpuop.operator.controller.writers.apply import Applier, object_key, owned_by, owner_reference
from gpuop.operator.metrics import STATUS_ERROR, STATUS_NOT_READY, STATUS_READY
from statemachine.node_rollout import ComponentCounts
from statemachine.rollout import ROLLOUT_ORDER, ComponentStatus, plan_rollout

NOW = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
Obj = dict[str, Any]


def _observe(
    not_ready: dict[str, str] | None = None,
    refused: list[Refusal] | None = None,
    has_nfd: bool = True,
    view: RolloutView | None = None,
) -> ClusterObservation:
    not_ready = not_ready or {}
    snapshot = {
        n: ComponentStatus(enabled=True, ready=n not in not_ready, message=not_ready.get(n, ""))
        for n in ROLLOUT_ORDER
    }
    actual = {n: (n not in not_ready, not_ready.get(n, "")) for n in ROLLOUT_ORDER}
    return ClusterObservation(
        namespace="gpu-operator",
        model=crd.default_policy(),
        generation=3,
        previous=None,
        plan=plan_rollout(snapshot),
        snapshot=snapshot,
        actual=actual,
        view=view or RolloutView(counts={}, not_done=[], stuck=[], next_due=None),
        refused=refused or [],
        has_nfd=has_nfd,
    )


def _ready(status: crd.ClusterPolicyStatus) -> crd.Condition:
    found = crd.find_condition(status.conditions, "Ready")
    assert found is not None
    return found


def test_every_component_ready_is_a_ready_status() -> None:
    status, outcome = cluster_status(_observe(), NOW)
    assert outcome == STATUS_READY
    assert status.state == "ready"
    assert _ready(status).status == "True"
    assert status.rollout_state == plan_rollout(_observe().snapshot).state
    assert [c.name for c in status.components or []] == list(ROLLOUT_ORDER)
    assert crd.find_condition(status.conditions, crd.CONDITION_UNSUPPORTED_FIELDS) is None


def test_the_first_component_not_ready_is_named_after_the_stuck_nodes() -> None:
    name = ROLLOUT_ORDER[2]
    view = RolloutView(
        counts={name: ComponentCounts(ready=1, not_ready=1)},
        not_done=["n2"],
        stuck=[],
        next_due=None,
        message="1 node stuck",
    )
    status, outcome = cluster_status(_observe({name: "0/1 pods ready"}, view=view), NOW)
    assert outcome == STATUS_NOT_READY
    assert _ready(status).reason == crd.REASON_OPERAND_NOT_READY
    assert _ready(status).message == f"1 node stuck; {name} is not ready: 0/1 pods ready"
    component = next(c for c in status.components or [] if c.name == name)
    assert (component.state, component.nodes_ready, component.nodes_not_ready) == (
        "notReady",
        1,
        1,
    )


def test_refusals_outrank_missing_nfd_labels_which_outrank_readiness() -> None:
    refusal = Refusal("DaemonSet", "gpu-operator", "x", 422, "invalid", "h", 1, 0.0)
    status, outcome = cluster_status(_observe(refused=[refusal], has_nfd=False), NOW)
    assert outcome == STATUS_ERROR
    assert _ready(status).reason == crd.REASON_RECONCILE_FAILED
    assert "DaemonSet gpu-operator/x refused by the API server (422)" in _ready(status).message
    status, outcome = cluster_status(_observe(has_nfd=False), NOW)
    assert outcome == STATUS_NOT_READY
    assert (_ready(status).reason, _ready(status).message) == (
        crd.REASON_NFD_LABELS_MISSING,
        NFD_MISSING_MESSAGE,
    )


def test_the_status_is_a_function_of_what_was_observed_and_when() -> None:
    seen = _observe({ROLLOUT_ORDER[0]: "applying"})
    assert cluster_status(seen, NOW) == cluster_status(seen, NOW)


def test_an_invalid_policy_lists_every_problem() -> None:
    status = invalid_status("ns", None, ["spec.a: bad", "spec.b: worse"], 2, None, NOW)
    assert status.state == "notReady"
    assert _ready(status).message == "invalid ClusterPolicy: spec.a: bad; spec.b: worse"
    error = crd.find_condition(status.conditions, "Error")
    assert error is not None
    assert error.status == "True"


def test_version_memo_computes_once_per_version() -> None:
    memo: VersionMemo[str, int] = VersionMemo()
    calls: list[str] = []

    def compute(version: str) -> int:
        calls.append(version)
        return len(calls)

    assert memo.get("a", "1", lambda: compute("1")) == 1
    assert memo.get("a", "1", lambda: compute("1")) == 1
    assert memo.get("b", "1", lambda: compute("1")) == 2  # keys are separate
    assert memo.get("a", "2", lambda: compute("2")) == 3

    async def probe() -> int:
        calls.append("probe")
        return 7

    assert asyncio.run(memo.aget("c", "1", probe)) == 7
    assert asyncio.run(memo.aget("c", "1", probe)) == 7
    assert calls.count("probe") == 1


class _Rest:
    def __init__(self) -> None:
        self.deleted: list[tuple[str, str]] = []
        self.applied: list[Obj] = []

    async def delete(self, kind: Any, name: str, namespace: str | None = None) -> None:
        self.deleted.append((kind.kind, name))

    async def apply(self, obj: Obj) -> Obj:
        self.applied.append(obj)
        return obj


def _cache(*objs: Obj) -> Informer:
    async def never(**_: Any) -> None:
        raise AssertionError("not listed in a unit test")

    informer = Informer(ResourceSpec("daemonsets", never), lambda *_: None)
    for obj in objs:
        # As a LIST leaves them (no kind) and read-only throughout, as pooled leaves are.
        informer.store[f"ns/{obj['metadata']['name']}"] = shared(obj)
    return informer


def _daemonset(name: str) -> Obj:
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": "ns", "labels": {"app": name}},
        "spec": {"template": {"spec": {}}},
    }


def test_pruning_and_applying_never_change_a_cached_object() -> None:
    keep, stale = _daemonset("keep"), _daemonset("stale")
    cached = [{k: v for k, v in o.items() if k != "kind"} for o in (keep, stale)]
    informer = _cache(*cached)
    rest = _Rest()
    applier = Applier(rest, {"DaemonSet": informer}, lambda _: None)  # type: ignore[arg-type]
    policy_meta = {"name": "cluster-policy", "uid": "u1"}
    owner = owner_reference("nvidia.com/v1", "ClusterPolicy", policy_meta)
    desired = [with_hash(owned_by(keep, owner))]

    async def run() -> None:
        assert await applier.apply_all(desired) == []
        await applier.prune(desired)

    asyncio.run(run())  # a write to a read-only object would raise TypeError here
    assert rest.deleted == [("DaemonSet", "stale")]
    assert [o["metadata"]["name"] for o in rest.applied] == ["keep"]
    assert desired[0]["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "nvidia.com/v1",
            "kind": "ClusterPolicy",
            "name": "cluster-policy",
            "uid": "u1",
            "controller": True,
            "blockOwnerDeletion": False,
        }
    ]
    assert "kind" not in informer.get("ns/keep")  # type: ignore[operator]
    assert object_key(cached[0], "DaemonSet") == object_key(keep) == ("DaemonSet", "ns/keep")


def test_applied_hash_is_forgotten_when_its_object_is_deleted() -> None:
    ds = _daemonset("x")
    rest = _Rest()
    applier = Applier(rest, {"DaemonSet": _cache()}, lambda _: None)  # type: ignore[arg-type]
    obj = with_hash(ds)
    asyncio.run(applier.apply(obj))
    assert not applier.needs_apply(obj)  # applied; its watch event not here yet
    applier.deleted(object_key({"metadata": ds["metadata"]}, "DaemonSet"))
    assert applier.needs_apply(obj)


def test_cached_objects_refuse_mutation() -> None:
    """What the test above relies on: a pooled object raises on any change."""
    cached = shared(_daemonset("x"))
    with pytest.raises(TypeError):
        cached.setdefault("kind", "DaemonSet")
    with pytest.raises(TypeError):
        cached["metadata"].pop("labels")
    with pytest.raises(TypeError):
        cached["metadata"]["labels"].update(app="y")


def test_objects_that_run_pods_are_applied_after_everything_they_need() -> None:
    from kubernetes_asyncio.client.exceptions import ApiException

    class Recording(_Rest):
        async def apply(self, obj: Obj) -> Obj:
            await asyncio.sleep(0.01 if obj["kind"] == "ServiceAccount" else 0)
            if obj["metadata"]["name"].startswith("bad"):
                raise ApiException(status=422, reason="Invalid")
            return await super().apply(obj)

    def obj(kind: str, name: str) -> Obj:
        return with_hash(
            {"apiVersion": "v1", "kind": kind, "metadata": {"name": name, "namespace": "ns"}}
        )

    objs = [
        obj("DaemonSet", "bad-ds"),
        obj("RoleBinding", "rb"),
        obj("ServiceAccount", "sa"),
        obj("DaemonSet", "ds"),
        obj("ConfigMap", "bad-cm"),
        obj("Role", "role"),
    ]
    rest = Recording()
    kinds = ("DaemonSet", "ServiceAccount", "ConfigMap", "Role", "RoleBinding")
    applier = Applier(rest, {k: _cache() for k in kinds}, lambda _: None)  # type: ignore[arg-type]
    refused = asyncio.run(applier.apply_all(objs))
    applied = [o["kind"] for o in rest.applied]
    assert sorted(applied[:2]) == ["Role", "ServiceAccount"]
    assert applied[2:] == ["RoleBinding", "DaemonSet"]
    assert [r.name for r in refused] == ["bad-ds", "bad-cm"]  # in the order given
