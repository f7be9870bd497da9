"""An NVIDIADriver node's upgrade state is read by the ClusterPolicy's readiness
(`ClusterReconciler._driver_handover`), and the node pass's own state write wakes no
watch event (`Informer.observe`): the node pass's result tells the cluster pass when
its writes moved what that pass reads of the node (`_routes.gpu_facts`), as the router
does for a watch event."""

from __future__ import annotations

import copy
from typing import Any, cast

import pytest

from crd import OWNER_LABEL
from gpuop.kube.informer import Informer, ResourceSpec
from gpuop.operator.controller.passes.node import NodeReconciler
from gpuop.operator.controller.views.node_views import trim_node
from statemachine import UpgradePolicyView
from statemachine.node_plan import DriverFacts, UpgradeWrite
from statemachine.upgrade_keys import STATE_LABEL
from statemachine.upgrade_views import DriverPodView


class _Queue:
    def add(self, key: str) -> None: ...
    def add_after(self, key: str, delay: float) -> None: ...
    def forget(self, key: str) -> None: ...


class _Workloads:
    """No claimant pods, nothing said yet."""

    def said(self, node: str) -> tuple[None, None]:
        return None, None

    def claimants_on(self, node: str) -> frozenset[str]:
        return frozenset()

    async def claimants_now(self, node: str, pods: Any) -> frozenset[str]:
        return frozenset()

    def remember(self, node: str, invalid: Any, step: Any) -> None: ...

    def claim_settle_s(self, node: str) -> float:
        return 0.0

    def patched(self, node: str, labels: Any) -> None: ...

    def forget(self, node: str) -> None: ...


class _Owners:
    def has_listed(self) -> bool:
        return True

    def upgrade_policies(self) -> dict[str, UpgradePolicyView]:
        return {"default": UpgradePolicyView(auto_upgrade=True)}

    def driver_app(self, node: str) -> str:
        return "nvidia-gpu-driver-ubuntu22.04-x"

    def base_spec(self) -> None:
        return None  # the node pass reads it only without a ClusterPolicy


class _Emptying:
    def forget(self, node: str) -> None: ...


class _Events:
    async def record(self, *_: Any) -> None: ...


class _Upgrades:
    """The caches' driver facts: the newest revision runs, its validators are ready."""

    namespace = "gpu-operator"
    driver_ready_timeout_seconds = None
    events = _Events()

    def __init__(self) -> None:
        self.steps: list[UpgradeWrite] = []
        self.emptying = _Emptying()

    def node_facts(self, name: str, app: str) -> tuple[DriverFacts, None, dict[str, str]]:
        pod = DriverPodView("uid", "rev-2", running=True, ready=True)
        facts = DriverFacts(app, newest_revision="rev-2", driver_pod=pod, validators_ready=True)
        return facts, None, {}

    def remember(self, name: str, step: UpgradeWrite) -> None:
        self.steps.append(step)

    def forget_node(self, name: str) -> None: ...


class _GPUClusters:
    """Not listed yet: no label changes (the pass goes on to the upgrade step)."""

    def knows_whether_one_exists(self) -> bool:
        return False


class _Rest:
    """The API writes the patch's labels (the rest does not matter here)."""

    def __init__(self, node: dict[str, Any]) -> None:
        self.node = node

    async def merge_patch(self, kind: Any, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        written = copy.deepcopy(self.node)
        for key, value in ((patch.get("metadata") or {}).get("labels") or {}).items():
            if value is None:
                written["metadata"]["labels"].pop(key, None)
            else:
                written["metadata"]["labels"][key] = value
        written["metadata"]["resourceVersion"] = "2"
        return written


def _passes(owner: str | None, state: str) -> tuple[NodeReconciler, _Upgrades]:
    nodes = Informer(ResourceSpec("nodes", cast(Any, None), transform=trim_node), lambda *_: None)
    node_labels = {"nvidia.com/gpu.present": "true", STATE_LABEL: state}
    if owner:
        node_labels[OWNER_LABEL] = owner
    node = {
        "metadata": {"name": "n0", "resourceVersion": "1", "labels": node_labels},
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    nodes.observe(node)
    upgrades = _Upgrades()
    passes = NodeReconciler(
        rest=cast(Any, _Rest(node)),
        nodes=nodes,
        queue=cast(Any, _Queue()),
        active_policy=lambda: (None, None, []),
        upgrades=cast(Any, upgrades),
        gate=cast(Any, None),
        owners=cast(Any, _Owners()),
        workloads=cast(Any, _Workloads()),
    )
    passes.gpuclusters = cast(Any, _GPUClusters())
    return passes, upgrades


@pytest.mark.parametrize(
    ("owner", "state", "told"),
    [
        # An NVIDIADriver node moved (upgrade-done): the policy may be ready.
        ("default", "uncordon-required", True),
        # Its step wrote only its clock (an annotation): nothing to count again.
        ("default", "upgrade-done", False),
        # The ClusterPolicy's own driver (here cleaned up): its readiness does not read it.
        (None, "uncordon-required", False),
    ],
)
async def test_an_nvidiadriver_nodes_state_change_wakes_the_cluster_pass(
    owner: str | None, state: str, told: bool
) -> None:
    passes, upgrades = _passes(owner, state)
    result = await passes.reconcile_node("n0")
    (step,) = upgrades.steps
    assert step.patch  # every case writes the node
    assert result.progress is told
