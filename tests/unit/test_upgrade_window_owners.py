"""Maintenance windows per driver owner: an NVIDIADriver's windows go on the NVIDIADriver
(condition, Warning Event), its annotation wakes the fleet pass, and `gpuop upgrade plan`
splits the waves per owner with each owner's own budget and window."""

from __future__ import annotations

import copy
from typing import Any

from crd import NVD_KIND, OWNER_LABEL
from gpuop.operator.controller.base.keys import UPGRADES_KEY
from gpuop.operator.controller.views.routes import route_nvidiadriver, route_policy
from gpuop.operator.controller.writers.upgrade_window import (
    CONDITION_TYPE,
    INVALID_EVENT,
    UpgradeWindows,
)
from gpuop.upgrades_cli._owners import owner_plans, plans_json, render_plans
from gpuop.upgrades_cli._snapshot import Objects, snapshot
from gpuop.upgrades_cli._windows import status_window_lines
from statemachine.maintenance_window import CLOSED, INVALID, WINDOWS_ANNOTATION
from statemachine.upgrade_keys import DRIVER_REVISION_LABEL, UpgradeState
from tests.unit.test_nvidiadriver_rollout_gate import _Events, _gpu, _nvd, _Server
from tests.unit.test_status_owners import _Cache

Obj = dict[str, Any]
REQ = UpgradeState.UPGRADE_REQUIRED
#: A window that is never open when the tests run: 29 February, 00:00 for a minute.
RARE = "0 0 29 2 * 1m"


class _Drivers(_Cache):
    """The NVIDIADriver cache: what the server holds, by name."""

    def __init__(self, server: _Server) -> None:
        super().__init__()
        self.server = server

    def get(self, name: str) -> Obj | None:
        return copy.deepcopy(self.server.obj) if name == "training" else None


async def test_an_nvidiadrivers_invalid_window_holds_its_nodes_and_is_reported_on_it() -> None:
    raw = _nvd({"autoUpgrade": True}, {WINDOWS_ANNOTATION: "0 0 * * * soon"})
    server, policies, events = _Server(raw), _Cache(), _Events()
    windows = UpgradeWindows(server, events, policies, _Drivers(server))  # type: ignore[arg-type]
    nodes = [_gpu("t-0", REQ), _gpu("t-1", UpgradeState.DRAIN_REQUIRED)]
    policy = {"metadata": {"name": "cluster-policy", "annotations": {}}}
    decision = await windows.reconcile(policy, "training", nodes)
    assert decision.reason == INVALID
    assert set(decision.held) == {"t-0"}  # the node under way is never held
    assert set(server.kinds) == {NVD_KIND}  # nothing written to the ClusterPolicy
    (cond,) = [c for c in server.obj["status"]["conditions"] if c["type"] == CONDITION_TYPE]
    assert (cond["status"], cond["reason"]) == ("False", INVALID)
    assert WINDOWS_ANNOTATION in cond["message"]
    assert events.recorded == [(NVD_KIND, INVALID_EVENT, decision.message)]
    # The same pass again: nothing new is written, no second Event.
    writes = len(server.patches)
    await windows.reconcile(policy, "training", nodes)
    assert len(server.patches) == writes
    assert len(events.recorded) == 1
    # The annotation removed: the condition goes with it, nothing is held.
    del server.obj["metadata"]["annotations"][WINDOWS_ANNOTATION]
    cleared = await windows.reconcile(policy, "training", nodes)
    assert not cleared.held
    assert not [
        c for c in server.obj["status"].get("conditions") or [] if c["type"] == CONDITION_TYPE
    ]


def test_a_window_annotation_wakes_the_fleet_pass() -> None:
    old = _nvd({"autoUpgrade": True})
    new = copy.deepcopy(old)
    new["metadata"]["annotations"][WINDOWS_ANNOTATION] = RARE
    assert UPGRADES_KEY in route_nvidiadriver("MODIFIED", old, new).keys
    policy: Obj = {"metadata": {"name": "cluster-policy", "generation": 1, "annotations": {}}}
    changed = copy.deepcopy(policy)
    changed["metadata"]["annotations"][WINDOWS_ANNOTATION] = RARE
    assert UPGRADES_KEY in route_policy("MODIFIED", policy, changed, []).keys
    assert UPGRADES_KEY not in route_policy("MODIFIED", policy, copy.deepcopy(policy), []).keys


def _objects() -> Objects:
    """Two ClusterPolicy nodes (one at a time) and three of NVIDIADriver `training`
    (no limit, a closed window), every node queued for the new driver."""
    nvd = _nvd({"autoUpgrade": True, "maxParallelUpgrades": 0, "maxUnavailable": "100%"})
    nvd["metadata"]["annotations"][WINDOWS_ANNOTATION] = RARE
    ds = {
        "metadata": {
            "name": "nvidia-gpu-driver-training",
            "uid": "ds-uid",
            "ownerReferences": [{"kind": NVD_KIND, "name": "training", "controller": True}],
        },
        "spec": {"template": {"spec": {"nodeSelector": {}}}},
    }
    revision = {
        "metadata": {
            "ownerReferences": [{"uid": "ds-uid"}],
            "labels": {DRIVER_REVISION_LABEL: "new"},
        },
        "revision": 2,
    }
    nodes = [_gpu(f"cp-{i}", REQ) for i in range(2)] + [_gpu(f"t-{i}", REQ) for i in range(3)]
    pods = []
    for node in nodes:
        name = node["metadata"]["name"]
        app = "nvidia-driver-daemonset"
        if name.startswith("t-"):
            node["metadata"]["labels"][OWNER_LABEL] = "training"
            app = "nvidia-gpu-driver-training"
        pods.append(
            {
                "metadata": {
                    "name": f"driver-{name}",
                    "namespace": "gpu-operator",
                    "labels": {"app": app, DRIVER_REVISION_LABEL: "old"},
                },
                "spec": {"nodeName": name},
            }
        )
    policy = {
        "metadata": {"name": "cluster-policy"},
        "spec": {"driver": {"upgradePolicy": {"autoUpgrade": True, "maxParallelUpgrades": 1}}},
    }
    return Objects(
        nodes=nodes,
        pods=pods,
        daemonsets=[ds],
        revisions=[revision],
        policies=[policy],
        drivers=[nvd],
    )


def test_the_plan_has_waves_per_owner_under_each_owners_budget_and_window() -> None:
    snap = snapshot(_objects(), "gpu-operator", now=1000.0)
    plans = owner_plans(snap, proposed=False)
    assert [p.title for p in plans] == ["ClusterPolicy cluster-policy", "NVIDIADriver training"]
    cp, training = plans
    assert [[n.name for n in w] for w in cp.plan.waves] == [["cp-0"], ["cp-1"]]  # one at a time
    assert [[n.name for n in w] for w in training.plan.waves] == [["t-0", "t-1", "t-2"]]
    assert cp.window is None
    assert training.window is not None
    assert training.window["state"] == CLOSED
    # The closed window holds the NVIDIADriver's waiting nodes only, as the operator does.
    assert set(snap.held) == {"t-0", "t-1", "t-2"}
    text = render_plans(plans, "")
    assert "NVIDIADriver training:\n  3 node(s) to upgrade in 1 wave(s)" in text
    assert "maintenance window (NVIDIADriver training): outside the maintenance windows" in text
    data = plans_json(plans)
    assert data["waves"] == [["cp-0"], ["cp-1"]]
    assert data["nvidiaDrivers"]["training"]["waves"] == [["t-0", "t-1", "t-2"]]
    assert data["nvidiaDrivers"]["training"]["window"]["nextOpensAt"].endswith("T00:00:00+00:00")
    (line,) = status_window_lines(snap.windows, snap.policy_name)
    assert line.startswith("maintenance window (NVIDIADriver training): outside")


def test_a_proposal_changes_only_the_clusterpolicys_nodes() -> None:
    snap = snapshot(_objects(), "gpu-operator", ["driver.version=600.10.01"], now=1000.0)
    cp, training = owner_plans(snap, proposed=True)
    assert len(cp.plan.waves) == 2
    assert [[n.name for n in w] for w in training.plan.waves] == [["t-0", "t-1", "t-2"]]
    assert not any(n.restart_only for w in cp.plan.waves for n in w)


def test_without_nvidiadrivers_the_plan_reads_as_before() -> None:
    objects = _objects()
    objects.drivers, objects.daemonsets = [], []
    for node in objects.nodes:
        node["metadata"]["labels"].pop(OWNER_LABEL, None)
    for pod in objects.pods:
        pod["metadata"]["labels"]["app"] = "nvidia-driver-daemonset"
    snap = snapshot(objects, "gpu-operator", ["driver.version=600.10.01"], now=1000.0)
    plans = owner_plans(snap, proposed=True)
    assert len(plans) == 1
    text = render_plans(plans, "driver.version=600.10.01")
    assert text.startswith("proposed: driver.version=600.10.01\n5 node(s) to upgrade in 5 wave(s)")
    assert "NVIDIADriver" not in text
