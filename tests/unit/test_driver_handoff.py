"""The driver manager's hand-off annotation (`statemachine.driver_handoff`): the value
upstream's node-labelling controller writes, per policy and per NVIDIADriver owner, and
the node pass writing it in the same patch as the node's labels."""

from __future__ import annotations

import copy
from typing import Any, cast

import pytest

import crd
from crd import OWNER_LABEL
from gpuop.kube.informer import Informer, ResourceSpec
from gpuop.operator.controller.passes.node import NodeReconciler
from gpuop.operator.controller.views.node_views import trim_node
from gpuop.operator.controller.views.routes import route_nvidiadriver
from statemachine import UpgradePolicyView
from statemachine.driver_handoff import (
    HANDOFF_ANNOTATION,
    handoff_patch,
    handoff_wanted,
)
from statemachine.driver_owner import NEXT_OWNER_LABEL
from statemachine.node_plan import DriverFacts
from tests.factories import node
from tests.unit.test_nvd_upgrade_wakes_cluster import _Queue, _Workloads

GPU = {"nvidia.com/gpu.present": "true"}


def _spec(**changes: Any) -> crd.ClusterPolicySpec:
    raw = crd.sample_policy()
    for path, value in changes.items():
        holder = raw["spec"]
        *parents, leaf = path.split("__")
        for key in parents:
            holder = holder.setdefault(key, {})
        holder[leaf] = value
    return crd.ClusterPolicy.model_validate(raw).spec


@pytest.mark.parametrize(
    ("spec", "wanted"),
    [
        (_spec(), True),  # the chart default: auto-upgrade on
        (_spec(driver__upgradePolicy={"autoUpgrade": False}), False),
        (_spec(driver__enabled=False), False),  # host drivers: nothing to hand off
        (_spec(sandboxWorkloads={"enabled": True}), False),  # upstream: off with sandboxes
    ],
)
def test_clusterpolicy_nodes_follow_the_policy(spec: crd.ClusterPolicySpec, wanted: bool) -> None:
    assert handoff_wanted(GPU, spec, None) is wanted


def test_a_node_not_labelled_gpu_present_is_left_alone() -> None:
    assert handoff_wanted({}, _spec(), None) is None
    assert handoff_wanted({"nvidia.com/gpu.present": "false"}, _spec(), None) is None


def test_no_active_policy_removes_it() -> None:
    assert handoff_wanted(GPU, None, None) is False


def test_nvidiadriver_nodes_follow_their_owner_and_unknown_is_never_off() -> None:
    spec = _spec(driver__useNvidiaDriverCRD=True)
    policies = {"training": True, "pinned": False}
    assert handoff_wanted({**GPU, OWNER_LABEL: "training"}, spec, policies) is True
    assert handoff_wanted({**GPU, OWNER_LABEL: "pinned"}, spec, policies) is False
    # A node moving to another owner reads the owner whose driver pod starts next.
    moving = {**GPU, OWNER_LABEL: "training", NEXT_OWNER_LABEL: "pinned"}
    assert handoff_wanted(moving, spec, policies) is False
    # Owned by none, or the NVIDIADriver cache has not listed: not ours to say yet.
    assert handoff_wanted(GPU, spec, policies) is None
    assert handoff_wanted({**GPU, OWNER_LABEL: "training"}, spec, None) is None
    assert handoff_wanted({**GPU, OWNER_LABEL: "gone"}, spec, policies) is None


def test_nvidiadriver_policy_with_sandboxes_reads_the_clusterpolicy() -> None:
    spec = _spec(driver__useNvidiaDriverCRD=True, sandboxWorkloads={"enabled": True})
    assert handoff_wanted({**GPU, OWNER_LABEL: "training"}, spec, {"training": True}) is False


@pytest.mark.parametrize(
    ("annotations", "wanted", "patch"),
    [
        ({}, True, {HANDOFF_ANNOTATION: "true"}),
        ({HANDOFF_ANNOTATION: "false"}, True, {HANDOFF_ANNOTATION: "true"}),
        ({HANDOFF_ANNOTATION: "true"}, True, {}),
        ({HANDOFF_ANNOTATION: "true"}, False, {HANDOFF_ANNOTATION: None}),
        ({HANDOFF_ANNOTATION: "false"}, False, {HANDOFF_ANNOTATION: None}),
        ({}, False, {}),
        ({HANDOFF_ANNOTATION: "true"}, None, {}),
    ],
)
def test_patch(annotations: dict[str, str], wanted: bool | None, patch: dict[str, Any]) -> None:
    assert handoff_patch(annotations, wanted) == patch


# ------------------------------------------------------------------ the node pass


class _Owners:
    def __init__(self, policies: dict[str, UpgradePolicyView] | None) -> None:
        self.policies = policies

    def has_listed(self) -> bool:
        return self.policies is not None

    def upgrade_policies(self) -> dict[str, UpgradePolicyView] | None:
        return self.policies

    def driver_app(self, node: str) -> str:
        return ""

    def base_spec(self) -> None:
        return None


class _Emptying:
    async def node_pods(self, node: str, label_selector: str = "") -> list[Any]:
        return []


class _Upgrades:
    namespace = "gpu-operator"
    driver_ready_timeout_seconds = None
    emptying = _Emptying()

    def node_facts(self, name: str, app: str) -> tuple[DriverFacts, None, dict[str, str]]:
        return DriverFacts(app), None, {}

    def remember(self, name: str, step: Any) -> None:
        raise AssertionError("no upgrade step in these passes")


class _Rest:
    def __init__(self, node: dict[str, Any]) -> None:
        self.raw: dict[str, Any] = node
        self.patches: list[dict[str, Any]] = []

    async def merge_patch(self, kind: Any, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        self.patches.append(copy.deepcopy(patch))
        node: dict[str, Any] = copy.deepcopy(self.raw)
        for part in ("labels", "annotations"):
            values = node["metadata"].setdefault(part, {})
            for key, value in (patch["metadata"].get(part) or {}).items():
                if value is None:
                    values.pop(key, None)
                else:
                    values[key] = value
        self.raw = node
        return node


def _node(labels: dict[str, str], annotations: dict[str, str]) -> dict[str, Any]:
    return node(labels=labels, annotations=annotations, gpu=True)


def _pass(
    spec: crd.ClusterPolicySpec,
    node: dict[str, Any],
    policies: dict[str, UpgradePolicyView] | None = None,
) -> tuple[NodeReconciler, _Rest]:
    nodes = Informer(ResourceSpec("nodes", cast(Any, None), transform=trim_node), lambda *_: None)
    nodes.observe(node)
    rest = _Rest(node)
    model = crd.ClusterPolicy(metadata={"name": "cluster-policy"}, spec=spec)
    passes = NodeReconciler(
        rest=cast(Any, rest),
        nodes=nodes,
        queue=cast(Any, _Queue()),
        active_policy=lambda: ({"metadata": {}}, model, []),
        upgrades=cast(Any, _Upgrades()),
        gate=cast(Any, None),
        owners=cast(Any, _Owners(policies)),
        workloads=cast(Any, _Workloads()),
    )
    return passes, rest


async def test_a_new_gpu_node_gets_its_labels_and_the_annotation_in_one_patch() -> None:
    passes, rest = _pass(_spec(driver__enabled=False), _node({}, {}))
    await passes.reconcile_node("n0")
    first = rest.patches[0]["metadata"]
    assert first["labels"]["nvidia.com/gpu.present"] == "true"
    # Host drivers: no hand-off to write, none written.
    assert "annotations" not in first

    passes, rest = _pass(_spec(), _node({}, {}))
    await passes.reconcile_node("n0")
    first = rest.patches[0]["metadata"]
    assert first["labels"]["nvidia.com/gpu.deploy.driver"] == "true"
    assert first["annotations"][HANDOFF_ANNOTATION] == "true"


async def test_auto_upgrade_turned_off_removes_it_and_a_settled_node_writes_nothing() -> None:
    spec = _spec(driver__upgradePolicy={"autoUpgrade": False})
    passes, rest = _pass(spec, _node({}, {HANDOFF_ANNOTATION: "true"}))
    await passes.reconcile_node("n0")
    assert rest.patches[0]["metadata"]["annotations"] == {HANDOFF_ANNOTATION: None}
    settled = rest.raw
    passes, rest = _pass(spec, settled)
    await passes.reconcile_node("n0")
    assert rest.patches == []


async def test_an_nvidiadriver_node_waits_for_the_cache_then_follows_its_owner() -> None:
    spec = _spec(driver__useNvidiaDriverCRD=True)
    owned = {"nvidia.com/gpu.present": "true", OWNER_LABEL: "pinned"}
    passes, rest = _pass(spec, _node(owned, {HANDOFF_ANNOTATION: "true"}), policies=None)
    await passes.reconcile_node("n0")
    assert all("annotations" not in p["metadata"] for p in rest.patches)
    pinned = {"pinned": UpgradePolicyView(auto_upgrade=False)}
    passes, rest = _pass(spec, _node(owned, {HANDOFF_ANNOTATION: "true"}), policies=pinned)
    await passes.reconcile_node("n0")
    assert rest.patches[0]["metadata"]["annotations"] == {HANDOFF_ANNOTATION: None}


def test_an_nvidiadriver_change_wakes_the_nodes_it_owns_or_takes() -> None:
    nodes = [
        ("a", {"metadata": {"labels": {OWNER_LABEL: "training"}}}),
        ("b", {"metadata": {"labels": {OWNER_LABEL: "x", NEXT_OWNER_LABEL: "training"}}}),
        ("c", {"metadata": {"labels": {OWNER_LABEL: "other"}}}),
    ]
    old = {"metadata": {"name": "training", "generation": 1}}
    new = {"metadata": {"name": "training", "generation": 2}}
    keys = route_nvidiadriver("MODIFIED", old, new, nodes).keys
    assert {"node/a", "node/b"} <= set(keys)
    assert "node/c" not in keys
    # A status write alone wakes nothing.
    assert route_nvidiadriver("MODIFIED", old, copy.deepcopy(old), nodes).keys == ()
