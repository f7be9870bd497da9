"""The operator routes each watch event once (`_routes`): every cache's handler, the
NVIDIADriver and GPUCluster units' own included, ends in one routing function, and each
key it wakes is queued once, however many units read the event."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace
from typing import Any

from components.driver import COMPONENT_POD_LABEL
from components.keys import NFD_GPU_LABELS
from crd import OWNER_LABEL
from gpuop.kube.informer import Informer, key_of
from gpuop.operator.controller import Operator, OperatorConfig
from gpuop.operator.controller.base.keys import (
    CLUSTER_KEY,
    GC_KEY,
    NVD_KEY,
    REMEDIATION_KEY,
    UPGRADES_KEY,
    node_key,
)
from gpuop.operator.controller.views.node_views import trim_node
from gpuop.operator.controller.views.pod_records import trim_pod
from gpuop.operator.controller.views.routes import route_node
from gpuop.operator.controller.writers.rollout_gate import RECORD_ANNOTATION
from gpuop.operator.metrics import OperatorMetrics
from statemachine.driver_owner import NEXT_OWNER_LABEL
from statemachine.upgrade_keys import SKIP_LABEL, STATE_LABEL

Obj = dict[str, Any]
FLEET = "upgrades (coalesced)"
PACED = "cluster (paced)"


async def _never(**_: Any) -> None:
    raise AssertionError("not listed in this test")


def _operator(*nodes: Obj) -> tuple[Operator, Counter[str]]:
    """An operator whose queue counts what each event wakes."""
    rest = SimpleNamespace(lister=lambda *_a, **_k: _never, observer=None)
    op = Operator(rest, OperatorConfig(namespace="gpu-operator"), OperatorMetrics())  # type: ignore[arg-type]
    woken: Counter[str] = Counter()
    op.queue.add = lambda key: woken.update([key])  # type: ignore[method-assign]
    op.queue.add_after = lambda key, _delay: woken.update(  # type: ignore[method-assign]
        [PACED if key == CLUSTER_KEY else f"{key} (after)"]
    )
    op.node_passes.upgrades_queued = lambda: True  # type: ignore[method-assign]
    op.node_passes.fleet_soon = lambda: woken.update([FLEET])  # type: ignore[method-assign]
    for node in nodes:
        op.nodes._put(key_of(node), node)
    return op, woken


def _node(name: str, gpu: bool = True) -> Obj:
    """A node as the cache holds it (trimmed)."""
    labels = {NFD_GPU_LABELS[0]: "true"} if gpu else {}
    raw = {"metadata": {"name": name, "resourceVersion": "1", "labels": labels}, "spec": {}}
    return trim_node(raw)


def _fire(informer: Informer[Any], event: str, old: Any, new: Any) -> None:
    """One watch event, as the cache hands it to the handler it was built with."""
    informer.handler(event, old, new)


def test_a_driver_pod_event_is_routed_once_by_the_operator() -> None:
    op, woken = _operator()
    labels = {"app": "nvidia-driver-daemonset", COMPONENT_POD_LABEL: "nvidia-driver"}
    pod = {
        "metadata": {"name": "driver-x", "namespace": "gpu-operator", "labels": labels},
        "spec": {"nodeName": "n0"},
    }

    _fire(op.pods, "ADDED", None, trim_pod(pod))

    assert woken[node_key("n0")] == 1
    assert woken[NVD_KEY] == 1
    assert woken[FLEET] == 1


def _driver_pod(app: str, ready: bool) -> Any:
    labels = {"app": app, COMPONENT_POD_LABEL: "nvidia-driver"}
    condition = {"type": "Ready", "status": "True" if ready else "False"}
    pod = {
        "metadata": {"name": f"{app}-x", "namespace": "gpu-operator", "labels": labels},
        "spec": {"nodeName": "n0"},
        "status": {"phase": "Running", "conditions": [condition]},
    }
    return trim_pod(pod)


def _node_in(state: str, cordoned: bool = False) -> Obj:
    """GPU node ``n0`` in upgrade state ``state``."""
    raw = _node("n0")
    return {
        **raw,
        "metadata": {
            **raw["metadata"],
            "labels": {**raw["metadata"]["labels"], STATE_LABEL: state},
        },
        "spec": {"unschedulable": True} if cordoned else {},
    }


def test_a_driver_pod_wakes_its_node_at_rest_only_for_what_the_step_reads_there() -> None:
    """At rest the upgrade step reads whether a driver pod is there, which, and its
    revision: a rollout's driver pods turning Ready wake no node pass. Mid-upgrade, or
    cordoned, its readiness is read. Pods NVIDIA's operator left (its ``app``, no
    component label) count as driver pods."""

    def pod(ready: bool, revision: str = "r1", deleting: bool = False, ours: bool = True) -> Any:
        labels = {"app": "nvidia-driver-daemonset", "controller-revision-hash": revision}
        if ours:
            labels[COMPONENT_POD_LABEL] = "nvidia-driver"
        meta: Obj = {"name": "driver-x", "namespace": "gpu-operator", "labels": labels}
        if deleting:
            meta["deletionTimestamp"] = "2026-11-28T00:00:00Z"
        condition = {"type": "Ready", "status": "True" if ready else "False"}
        status = {"phase": "Running", "conditions": [condition]}
        return trim_pod({"metadata": meta, "spec": {"nodeName": "n0"}, "status": status})

    cases = [
        ("upgrade-done", False, pod(False), pod(True), 0),
        ("upgrade-done", False, pod(False, ours=False), pod(True, ours=False), 0),
        ("upgrade-done", False, pod(True), pod(True, revision="r2"), 1),
        ("upgrade-done", False, pod(True), pod(True, deleting=True), 1),
        ("upgrade-done", True, pod(False), pod(True), 1),
        ("pod-restart-required", False, pod(False), pod(True), 1),
        ("pod-restart-required", False, pod(False, ours=False), pod(True, ours=False), 1),
    ]
    for state, cordoned, old, new, wakes in cases:
        op, woken = _operator(_node_in(state, cordoned))
        _fire(op.pods, "MODIFIED", old, new)
        assert woken[node_key("n0")] == wakes, (state, cordoned, old, new)
    op, woken = _operator(_node_in("upgrade-done"))
    _fire(op.pods, "ADDED", None, pod(False))  # bound: the pod is there now
    assert woken[node_key("n0")] == 1


def test_a_validator_pod_wakes_its_node_only_while_the_upgrade_step_reads_it() -> None:
    """At rest (``upgrade-done``, schedulable) the upgrade step reads no validator, so
    a rollout's validator pods wake no node pass; mid-upgrade, or cordoned by one, they do."""
    node = _node_in

    pod = {
        "metadata": {
            "name": "validator-x",
            "namespace": "gpu-operator",
            "labels": {"app": "nvidia-operator-validator"},
        },
        "spec": {"nodeName": "n0"},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }
    for state, cordoned, wakes in (
        ("upgrade-done", False, 0),
        ("upgrade-done", True, 1),
        ("validation-required", False, 1),
        ("upgrade-failed", False, 1),
    ):
        op, woken = _operator(node(state, cordoned))
        _fire(op.pods, "ADDED", None, trim_pod(pod))
        assert woken[node_key("n0")] == wakes, (state, cordoned)
    op, woken = _operator()  # a node the cache does not hold (yet): nothing reads it
    _fire(op.pods, "ADDED", None, trim_pod(pod))
    assert woken[node_key("n0")] == 0


def test_an_nvidiadriver_pod_turning_ready_wakes_the_nvidiadriver_pass() -> None:
    """Its hand-over budget counts the nodes whose new driver is not Ready yet."""
    op, woken = _operator()
    app = "nvidia-gpu-driver-ubuntu22.04-7c6d5b4f8"
    _fire(op.pods, "ADDED", None, _driver_pod(app, ready=False))
    woken.clear()

    _fire(op.pods, "MODIFIED", _driver_pod(app, ready=False), _driver_pod(app, ready=True))

    assert woken[NVD_KEY] == 1
    # The ClusterPolicy's driver turning Ready is its rollout's progress, no hand-over's.
    policy = "nvidia-driver-daemonset"
    _fire(op.pods, "ADDED", None, _driver_pod(policy, ready=False))
    woken.clear()
    _fire(op.pods, "MODIFIED", _driver_pod(policy, ready=False), _driver_pod(policy, ready=True))
    assert woken[NVD_KEY] == 0


def test_a_new_node_wakes_each_pass_that_reads_it_once() -> None:
    op, woken = _operator()

    _fire(op.nodes, "ADDED", None, _node("n0"))

    assert woken == Counter(
        {node_key("n0"): 1, REMEDIATION_KEY: 1, NVD_KEY: 1, CLUSTER_KEY: 1, FLEET: 1}
    )


def test_a_node_event_that_changes_nothing_read_wakes_nothing() -> None:
    op, woken = _operator()
    node = _node("n0")

    _fire(
        op.nodes,
        "MODIFIED",
        node,
        {**node, "metadata": {**node["metadata"], "resourceVersion": "2"}},
    )

    assert woken == Counter()


def test_a_policy_spec_change_wakes_each_pass_and_gpu_node_once() -> None:
    op, woken = _operator(_node("g0"), _node("c0", gpu=False))
    old = {"metadata": {"name": "p", "generation": 1}, "spec": {}}
    new = {"metadata": {"name": "p", "generation": 2, "annotations": {"x": "y"}}, "spec": {}}

    _fire(op.policies, "MODIFIED", old, new)

    assert woken == Counter(
        {
            REMEDIATION_KEY: 1,
            CLUSTER_KEY: 1,
            UPGRADES_KEY: 1,
            NVD_KEY: 1,
            GC_KEY: 1,
            node_key("g0"): 1,
        }
    )


def test_a_spec_and_gate_record_change_wakes_the_fleet_pass_once() -> None:
    """Both what the gate reads (its record) and the spec changed: one wake, not two."""
    op, woken = _operator()
    old = {"metadata": {"name": "p", "generation": 1}, "spec": {}}
    record = {RECORD_ANNOTATION: "{}"}
    new = {"metadata": {"name": "p", "generation": 2, "annotations": record}, "spec": {}}

    _fire(op.policies, "MODIFIED", old, new)

    assert woken[UPGRADES_KEY] == 1


def test_a_policy_status_write_wakes_only_what_reads_its_annotations() -> None:
    op, woken = _operator(_node("g0"))
    old = {"metadata": {"name": "p", "generation": 1}, "spec": {}}
    new = {**old, "status": {"state": "ready"}}

    _fire(op.policies, "MODIFIED", old, new)

    assert woken == Counter()


def test_an_nvidiadriver_event_is_routed_by_the_operator_once() -> None:
    op, woken = _operator()
    old = {"metadata": {"name": "d", "generation": 1}}

    _fire(op.nvd.drivers, "MODIFIED", old, {**old, "status": {"state": "ready"}})
    assert woken == Counter()  # our own status write
    _fire(op.nvd.drivers, "MODIFIED", old, {"metadata": {"name": "d", "generation": 2}})
    assert woken == Counter({NVD_KEY: 1})


def test_the_listed_nvidiadriver_cache_wakes_each_waiting_pass_once() -> None:
    op, woken = _operator(_node("g0"), _node("c0", gpu=False))

    op.nvd._on_listed()

    assert woken == Counter({NVD_KEY: 1, UPGRADES_KEY: 1, node_key("g0"): 1})


def test_a_gpucluster_event_wakes_its_pass_the_conflict_its_drivers_and_every_node_once() -> None:
    op, woken = _operator(_node("g0"), _node("c0", gpu=False))
    gc = {"metadata": {"name": "gpu-cluster", "generation": 1}}

    _fire(op.gpuclusters.clusters, "ADDED", None, gc)

    # NVIDIADrivers install a GPUCluster's drivers: they follow its presence
    assert woken == Counter(
        {GC_KEY: 1, CLUSTER_KEY: 1, NVD_KEY: 1, node_key("g0"): 1, node_key("c0"): 1}
    )


def test_a_gpucluster_object_event_wakes_its_pass_once() -> None:
    op, woken = _operator()
    ds = {"metadata": {"name": "x", "namespace": "gpu-operator"}}

    _fire(op.gpuclusters.owned["DaemonSet"], "DELETED", ds, None)

    assert woken == Counter({GC_KEY: 1})


def test_a_deleted_daemonset_wakes_the_cluster_pass_once() -> None:
    """The last DaemonSet gone is both a deletion (put it back) and "every DaemonSet is
    ready" (the rollout may be done): one wake, not two."""
    op, woken = _operator()
    ds = {"metadata": {"name": "nvidia-device-plugin-daemonset", "namespace": "gpu-operator"}}

    _fire(op.owned["DaemonSet"], "DELETED", ds, None)

    assert woken == Counter({CLUSTER_KEY: 1})


def test_a_node_event_remediation_does_not_read_leaves_it_asleep() -> None:
    op, woken = _operator()
    op.remediation.wants_node = lambda _old, _new: False  # type: ignore[method-assign]

    _fire(op.nodes, "ADDED", None, _node("n0"))

    assert REMEDIATION_KEY not in woken
    assert woken[node_key("n0")] == 1


async def test_an_owner_label_write_wakes_its_node_the_cluster_and_fleet_passes_once() -> None:
    """NVIDIADrivers' own writes wake the other passes through the operator's router
    too (its node's watch event, cached already, then changes nothing)."""
    op, woken = _operator(_node("n0"))

    async def merge_patch(_kind: Any, name: str, patch: Obj) -> Obj:
        node = op.nodes.get(name)
        assert node is not None
        node_labels = {**node["metadata"]["labels"], **patch["metadata"]["labels"]}
        return {**node, "metadata": {**node["metadata"], "labels": node_labels}}

    op.nvd.op.rest.merge_patch = merge_patch  # type: ignore[attr-defined]

    await op.nvd._label({"n0": {OWNER_LABEL: "default"}})

    assert woken == Counter({node_key("n0"): 1, CLUSTER_KEY: 1, FLEET: 1})


def _nvd_node(extra: dict[str, str], state: str = "upgrade-required") -> dict[str, Any]:
    node_labels = {NFD_GPU_LABELS[0]: "true", STATE_LABEL: state, **extra}
    return {"metadata": {"name": "n0", "resourceVersion": "1", "labels": node_labels}, "spec": {}}


def _cluster_woken(old: dict[str, Any], new: dict[str, Any]) -> bool:
    wake = route_node(
        "MODIFIED",
        trim_node(old),
        trim_node(new),
        remediation_reads=lambda *_: False,
        labels_awaited=False,
    )
    return CLUSTER_KEY in wake.keys


def test_a_moving_or_skipped_nodes_upgrade_news_wakes_the_cluster_pass() -> None:
    """`NVIDIADrivers.upgrade_incomplete` (the policy's readiness) counts nodes with an
    owner or a next owner and leaves skipped ones out: each of those changing wakes the
    cluster pass."""
    owned = {OWNER_LABEL: "default"}
    assert _cluster_woken(_nvd_node(owned), _nvd_node({**owned, SKIP_LABEL: "true"}))
    moving = {NEXT_OWNER_LABEL: "pool"}
    assert _cluster_woken(_nvd_node(moving), _nvd_node(moving, state="upgrade-done"))
