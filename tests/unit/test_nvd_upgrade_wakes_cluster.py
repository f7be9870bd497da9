"""An NVIDIADriver node's upgrade state is read by the ClusterPolicy's readiness
(`ClusterReconciler._driver_handover`), and the node pass's own state write wakes no
watch event (`Informer.observe`): the node pass itself tells the cluster pass when its
writes moved what that pass reads of the node (`_routes.gpu_facts`)."""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any, cast

import pytest

from crd import OWNER_LABEL
from gpuop.kube.informer import Informer, ResourceSpec
from gpuop.operator.controller.passes.node import NodeReconciler
from gpuop.operator.controller.views.node_views import trim_node
from statemachine import Action, UpgradePolicyView
from statemachine.upgrade_keys import STATE_LABEL, UpgradeState


class _Queue:
    def add(self, key: str) -> None: ...
    def add_after(self, key: str, delay: float) -> None: ...
    def forget(self, key: str) -> None: ...


class _Workloads:
    async def report_workload(self, node: Any, spec: Any) -> None: ...

    async def hold(self, node: Any, changes: Any, target: str) -> tuple[dict[str, Any], None]:
        return {}, None


class _Owners:
    def has_listed(self) -> bool:
        return True

    def upgrade_policies(self) -> dict[str, UpgradePolicyView]:
        return {"default": UpgradePolicyView(auto_upgrade=True)}

    def driver_app(self, node: str) -> str:
        return "nvidia-gpu-driver-ubuntu22.04-x"

    def base_spec(self) -> None:
        return None  # the node pass reads it only without a ClusterPolicy


class _Upgrades:
    """The upgrade step, writing the node's next state as the real one does: into the
    cache through ``observe`` (so no watch event follows)."""

    def __init__(self, changed: bool, nodes: Informer) -> None:
        self.changed = changed
        self.nodes = nodes

    def newest_driver_revision(self, app: str) -> str:
        return "rev-2"

    async def step(self, node: Any, policy: Any, newest: Any, app: str) -> Any:
        if self.changed:
            written = copy.deepcopy(node)
            written["metadata"]["labels"][STATE_LABEL] = UpgradeState.UPGRADE_DONE.value
            written["metadata"]["resourceVersion"] = "2"
            self.nodes.observe(written)
        return SimpleNamespace(
            requeue_after=None,
            target=UpgradeState.UPGRADE_DONE,
            has_patch=self.changed,
            action=Action.NONE,
            changed_state=self.changed,
        )


def _passes(owner: str | None, changed: bool) -> tuple[NodeReconciler, list[str]]:
    nodes = Informer(ResourceSpec("nodes", cast(Any, None), transform=trim_node), lambda *_: None)
    node_labels = {"nvidia.com/gpu.present": "true", STATE_LABEL: "uncordon-required"}
    if owner:
        node_labels[OWNER_LABEL] = owner
    nodes.observe(
        {"metadata": {"name": "n0", "resourceVersion": "1", "labels": node_labels}, "spec": {}}
    )
    told: list[str] = []
    passes = NodeReconciler(
        rest=cast(Any, None),
        nodes=nodes,
        queue=cast(Any, _Queue()),
        active_policy=lambda: (None, None, []),
        upgrades=cast(Any, _Upgrades(changed, nodes)),
        gate=cast(Any, None),
        owners=cast(Any, _Owners()),
        workloads=cast(Any, _Workloads()),
        progress=lambda: told.append("cluster"),
    )
    return passes, told


@pytest.mark.parametrize(
    ("owner", "changed", "told"),
    [
        ("default", True, ["cluster"]),  # an NVIDIADriver node moved: the policy may be ready
        ("default", False, []),  # nothing moved: nothing to count again
        (None, True, []),  # the ClusterPolicy's own driver: its readiness does not read it
    ],
)
async def test_an_nvidiadriver_nodes_state_change_wakes_the_cluster_pass(
    owner: str | None, changed: bool, told: list[str]
) -> None:
    passes, woken = _passes(owner, changed)
    await passes.reconcile_node("n0")
    assert woken == told
