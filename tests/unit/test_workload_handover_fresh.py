"""The hand-over never grants a GPU claim on what the caches alone say: the patch that
removes one claimant's label never sets another's, and a claim the pods cache would
grant is confirmed against the API server's pods (found by the VM hand-over chaos test,
``tests/integration/test_chaos_workload.py``: a driver pod bound a moment before a switch
to vm-passthrough was not in the cache yet, and the VFIO manager's label went on in the
same patch that took the driver's off)."""

from __future__ import annotations

from typing import Any, cast

from gpuop.operator.controller.writers.workload_handover import WorkloadHandovers
from statemachine.workload_handover import CLAIMING, DRIVER_LEAVING, VM_MANAGER_LEAVING
from tests.unit.test_workload_events import NVD_DRIVER, _node, _pod_cache, hold

DRIVER_LABEL = "nvidia.com/gpu.deploy.driver"
VFIO_LABEL = "nvidia.com/gpu.deploy.vfio-manager"
NODE = "gpu-node-0001"


def _pod(name: str, labels: dict[str, str], node: str = NODE, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "gpu-operator", "uid": name, "labels": labels},
        "spec": {"nodeName": node, **spec} if node else spec,
        "status": {"phase": "Running" if node else "Pending"},
    }


class _Rest:
    def __init__(self, unbound: list[dict[str, Any]]) -> None:
        self.unbound = unbound
        self.lists: list[tuple[str | None, dict[str, str]]] = []

    async def list(self, kind: Any, namespace: str | None = None, **selectors: str) -> Any:
        self.lists.append((namespace, selectors))
        assert selectors == {"field_selector": "spec.nodeName="}
        return self.unbound


class _Emptying:
    """What the API server has: pods bound to the node, and unbound ones."""

    namespace = "gpu-operator"

    def __init__(self, bound: list[dict[str, Any]], unbound: list[dict[str, Any]]) -> None:
        self.bound = bound
        self.rest = _Rest(unbound)
        self.reads = 0

    async def node_pods(self, node: str, label_selector: str = "") -> list[dict[str, Any]]:
        self.reads += 1
        return [p for p in self.bound if p["spec"].get("nodeName") == node]


def _handovers(emptying: _Emptying) -> WorkloadHandovers:
    return WorkloadHandovers(_pod_cache(), cast(Any, emptying))


SWITCH = {DRIVER_LABEL: None, VFIO_LABEL: "true"}
"""container -> vm-passthrough: the driver's label off, the VFIO manager's on."""


def _labelled(workload: str, **labels: str) -> dict[str, Any]:
    node = _node(workload)
    node["metadata"]["labels"].update(labels)
    return node


async def test_the_patch_that_removes_the_drivers_label_never_grants_the_vfio_claim() -> None:
    emptying = _Emptying([], [])
    node = _labelled("vm-passthrough", **{DRIVER_LABEL: "true"})
    patch, step = await hold(_handovers(emptying), emptying, node, SWITCH)
    assert step is not None
    assert step.state == DRIVER_LEAVING
    assert patch == {DRIVER_LABEL: None}
    assert emptying.reads == 0  # the label alone holds it: nothing to ask


async def test_a_driver_pod_the_cache_has_not_shown_holds_the_claim() -> None:
    emptying = _Emptying([_pod("driver", NVD_DRIVER)], [])
    patch, step = await hold(_handovers(emptying), emptying, _node("vm-passthrough"), SWITCH)
    assert step is not None
    assert step.state == DRIVER_LEAVING
    assert VFIO_LABEL not in patch


async def test_an_unbound_driver_pod_meant_for_the_node_holds_the_claim() -> None:
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
                ]
            }
        }
    }
    elsewhere = _pod("other", NVD_DRIVER, node="", affinity={"nodeAffinity": {}})
    meant = _pod("driver", NVD_DRIVER, node="", affinity=affinity)
    for unbound, state in (([elsewhere], CLAIMING), ([elsewhere, meant], DRIVER_LEAVING)):
        emptying = _Emptying([], unbound)
        patch, step = await hold(_handovers(emptying), emptying, _node("vm-passthrough"), SWITCH)
        assert step is not None
        assert step.state == state
        assert (VFIO_LABEL in patch) == (state == CLAIMING)
        assert emptying.rest.lists == [("gpu-operator", {"field_selector": "spec.nodeName="})]


async def test_back_to_containers_waits_for_a_vfio_manager_only_the_api_server_shows() -> None:
    vfio = _pod("vfio", {"name": "nvidia-vfio-manager", "app.kubernetes.io/component": "x"})
    changes = {VFIO_LABEL: None, DRIVER_LABEL: "true"}
    for bound, state in (([], CLAIMING), ([vfio], VM_MANAGER_LEAVING)):
        emptying = _Emptying(bound, [])
        patch, step = await hold(_handovers(emptying), emptying, _node("container"), changes)
        assert step is not None
        assert step.state == state
        assert (DRIVER_LABEL in patch) == (state == CLAIMING)
    # Its label still on the node holds the driver's claim without asking.
    emptying = _Emptying([], [])
    node = _labelled("container", **{VFIO_LABEL: "true"})
    _, step = await hold(_handovers(emptying), emptying, node, changes)
    assert step is not None
    assert (step.state, emptying.reads) == (VM_MANAGER_LEAVING, 0)
