"""What driver pods and owner labels wake, and that the fleet-wide answers stay current.

A pod event is routed once, by the operator's router (`_routes.route_pod`, here as
`Operator._on_pod` calls it); NVIDIADrivers only follows its driver pods.

The ClusterPolicy's own driver pods coming and going is rollout progress, counted by
the operator's paced cluster pass; only an NVIDIADriver's pod changes whether the
ClusterPolicy's driver must wait, so only that queues the cluster pass at once.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from components.driver import COMPONENT_POD_LABEL
from crd import OWNER_LABEL
from gpuop.kube.informer import Informer, ResourceSpec, key_of
from gpuop.operator.controller.base.keys import CLUSTER_KEY, NVD_KEY, UPGRADES_KEY, node_key
from gpuop.operator.controller.passes.nvidiadriver import NVIDIADrivers
from gpuop.operator.controller.views.driver_owners import DriverOwners
from gpuop.operator.controller.views.node_views import trim_node
from gpuop.operator.controller.views.pod_records import PodRecord, trim_pod
from gpuop.operator.controller.views.routes import Wake, route_pod
from tests import factories

Obj = dict[str, Any]


class _Queue:
    def __init__(self) -> None:
        self.added: list[str] = []

    def add(self, key: str) -> None:
        self.added.append(key)


async def _never(**_: Any) -> None:
    raise AssertionError("not called")


class _NodePasses:
    """The fleet pass's news: whether a node waits for a slot, and what woke it."""

    def __init__(self, queue: _Queue) -> None:
        self.queued = False
        self._queue = queue

    def upgrades_queued(self) -> bool:
        return self.queued

    def fleet_soon(self) -> None:
        self._queue.add(UPGRADES_KEY)


def _controller(waiting_for_slot: bool = False) -> tuple[NVIDIADrivers, _Queue, Informer]:
    queue = _Queue()
    nodes = Informer(ResourceSpec("nodes", _never, transform=trim_node), lambda *_: None)
    rest = SimpleNamespace(lister=lambda *_a, **_k: _never)
    op = SimpleNamespace(rest=rest, config=SimpleNamespace(namespace="gpu-operator"))
    op.queue = queue
    op.nodes = nodes
    op.node_passes = _NodePasses(queue)
    op.node_passes.queued = waiting_for_slot
    drivers = Informer(ResourceSpec("nvidiadrivers", _never), lambda *_: None)
    owners = DriverOwners(drivers, nodes, SimpleNamespace(), lambda: None)  # type: ignore[arg-type]
    nvd = NVIDIADrivers(
        op,  # type: ignore[arg-type]
        SimpleNamespace(),  # type: ignore[arg-type]
        owners,
        on_listed=lambda: None,
        wake=lambda w: w.apply(queue.add, op.node_passes.fleet_soon, lambda: None),
    )
    return nvd, queue, nodes


def _on_pod(nvd: NVIDIADrivers, event: str, old: PodRecord | None, new: PodRecord | None) -> Wake:
    """What `Operator._on_pod` does with one event, against the fakes above."""
    passes = nvd.op.node_passes
    driver = nvd.follow_pod(old, new)
    wake = route_pod(event, old, new, driver=driver, upgrades_queued=passes.upgrades_queued)
    wake.apply(nvd.op.queue.add, passes.fleet_soon, lambda: None)
    return wake


def _pod(
    app: str, node: str = "n0", component: str = "nvidia-driver", app_label: str = "app"
) -> PodRecord:
    labels = {app_label: app, COMPONENT_POD_LABEL: component}
    return trim_pod(
        {
            "metadata": {"name": f"{app}-x", "namespace": "gpu-operator", "labels": labels},
            "spec": {"nodeName": node},
        }
    )


def _node(name: str, owner: str | None = None) -> Obj:
    labels = {"nvidia.com/gpu.present": "true"}
    if owner:
        labels[OWNER_LABEL] = owner
    return factories.node(name, labels)


def test_the_policys_own_driver_pods_do_not_queue_the_cluster_pass() -> None:
    nvd, queue, _ = _controller()

    _on_pod(nvd, "ADDED", None, _pod("nvidia-driver-daemonset"))
    _on_pod(nvd, "DELETED", _pod("nvidia-driver-daemonset"), None)

    assert CLUSTER_KEY not in queue.added
    assert queue.added.count(node_key("n0")) == 2
    assert NVD_KEY in queue.added  # the hand-over still looks


def test_driver_pods_wake_the_fleet_pass_only_while_a_node_waits_for_a_slot() -> None:
    for waiting in (False, True):
        nvd, queue, _ = _controller(waiting_for_slot=waiting)
        _on_pod(nvd, "ADDED", None, _pod("nvidia-driver-daemonset"))
        _on_pod(nvd, "ADDED", None, _pod("nvidia-gpu-driver-ubuntu22.04-abc", node="n1"))
        assert (UPGRADES_KEY in queue.added) is waiting


def test_an_nvidiadriver_pod_queues_the_cluster_pass_at_once() -> None:
    nvd, queue, _ = _controller()

    _on_pod(nvd, "ADDED", None, _pod("nvidia-gpu-driver-ubuntu22.04-abc"))

    assert CLUSTER_KEY in queue.added


def test_owned_nodes_and_foreign_pods_follow_their_caches() -> None:
    nvd, _, nodes = _controller()
    for node in (_node("n0"), _node("n1")):
        nodes._put(key_of(node), trim_node(node))
    assert nvd.owners.owned_nodes() == frozenset()
    assert not nvd.holds_policy_driver()

    owned = trim_node(_node("n1", owner="mine"))
    nodes._put(key_of(owned), owned)
    assert nvd.owners.owned_nodes() == frozenset({"n1"})
    assert nvd.holds_policy_driver()

    nodes._put(key_of(owned), trim_node(_node("n1")))
    assert not nvd.holds_policy_driver()

    pod = _pod("nvidia-gpu-driver-ubuntu22.04-abc")
    _on_pod(nvd, "ADDED", None, pod)
    assert nvd.holds_policy_driver()
    _on_pod(nvd, "DELETED", pod, None)
    assert not nvd.holds_policy_driver()


def test_only_driver_pods_are_followed() -> None:
    """The operand pods cache hands every pod over; the others are not followed (their
    wakes are the router's) and leave the driver pods' version (what the memoised
    answers hang on) alone."""
    nvd, queue, _ = _controller()
    validator = _pod("nvidia-operator-validator", component="gpu-operator")
    assert not nvd.follow_pod(None, validator)
    assert queue.added == []
    assert nvd.driver_pods.version == 0
    assert nvd.driver_pods.values() == []

    driver = _pod("nvidia-driver-daemonset")
    assert nvd.follow_pod(None, driver)
    assert nvd.driver_pods.values() == [driver]
    assert nvd.follow_pod(driver, None)
    assert nvd.driver_pods.values() == []
    assert nvd.driver_pods.version == 2
    assert queue.added == []  # following queues nothing: the router does


def test_a_driver_pod_event_is_routed_once() -> None:
    """The ClusterPolicy's driver pod is both a watched app and a driver pod: its node is
    queued once, and the fleet pass woken once, not once per unit that reads it."""
    nvd, queue, _ = _controller(waiting_for_slot=True)
    wake = _on_pod(nvd, "ADDED", None, _pod("nvidia-driver-daemonset"))
    assert wake.keys.count(node_key("n0")) == 1
    assert wake.fleet
    assert queue.added.count(node_key("n0")) == 1
    assert queue.added.count(UPGRADES_KEY) == 1


def test_a_validator_pod_wakes_its_node_only() -> None:
    nvd, _, _ = _controller(waiting_for_slot=True)
    validator = _pod("nvidia-operator-validator", component="gpu-operator")
    wake = _on_pod(nvd, "ADDED", None, validator)
    assert wake == Wake((node_key("n0"),), fleet=False, progress=True)


def test_a_vm_manager_pod_wakes_its_node_whose_hand_over_may_wait_for_it() -> None:
    nvd, _, _ = _controller(waiting_for_slot=True)
    for app, component in (
        ("nvidia-vfio-manager", "vfio-manager"),
        ("nvidia-vgpu-manager-daemonset", "vgpu-manager"),
    ):
        label = "name" if app == "nvidia-vfio-manager" else "app"
        pod = _pod(app, component=component, app_label=label)
        wake = _on_pod(nvd, "DELETED", pod, None)
        assert wake == Wake((node_key("n0"),), fleet=False, progress=True), app
    sandbox_plugin = _pod("nvidia-sandbox-device-plugin-daemonset", component="x")
    assert _on_pod(nvd, "DELETED", sandbox_plugin, None).keys == ()
