"""Stale operand pods: the operator force-deletes only what Kubernetes' pod GC would
(terminating pods of a node that is not Ready and marked out of service), never a
driver pod, a few per pass, with an Event; a partitioned node alone changes nothing."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import crd
from components import RenderContext, desired_objects
from components.keys import NFD_GPU_LABELS
from gpuop.kube.informer import Informer, ResourceSpec
from gpuop.operator.controller.views.node_views import GpuNodes, trim_node
from gpuop.operator.controller.views.pod_records import pod_index, trim_pod
from gpuop.operator.controller.views.rollout_view import NodeRollouts
from gpuop.operator.controller.writers.rollout_reports import (
    REASON_STALE_PODS_DELETED,
    RolloutReports,
)
from gpuop.operator.metrics import OperatorMetrics
from statemachine.node_rollout import UNREACHABLE_TAINT
from statemachine.stale_pods import (
    MAX_RELEASED_PER_PASS,
    OUT_OF_SERVICE_TAINT,
    StalePod,
    out_of_service,
    plan_release,
)

Obj = dict[str, Any]
NS = "gpu-operator"
GPU = NFD_GPU_LABELS[0]
DEVICE_PLUGIN = "nvidia-device-plugin-daemonset"
TOOLKIT = "nvidia-container-toolkit-daemonset"
DCGM = "nvidia-dcgm-exporter"
DRIVER = "nvidia-driver-daemonset"
#: What the node lifecycle controller puts on a node whose kubelet stopped reporting.
UNREACHABLE = [
    {"key": UNREACHABLE_TAINT, "effect": "NoSchedule"},
    {"key": UNREACHABLE_TAINT, "effect": "NoExecute"},
]
OUT_OF_SERVICE = {"key": OUT_OF_SERVICE_TAINT, "value": "nodeshutdown", "effect": "NoExecute"}


async def _never(**_: Any) -> None:
    raise AssertionError("not listed in a unit test")


class _Rest:
    """Records deletions (the only write a release makes besides its Event)."""

    def __init__(self) -> None:
        self.deleted: list[tuple[str, str | None, Obj]] = []

    async def delete(
        self, kind: Any, name: str, namespace: str | None = None, body: Obj | None = None
    ) -> bool:
        self.deleted.append((name, namespace, dict(body or {})))
        return True


class _Events:
    def __init__(self) -> None:
        self.recorded: list[tuple[Obj, str, str, bool]] = []

    async def record(self, involved: Obj, reason: str, message: str, warning: bool = False) -> None:
        self.recorded.append((involved, reason, message, warning))


def _desired() -> dict[str, list[Obj]]:
    """The sample policy with autoUpgrade off: the driver DaemonSet rolls itself
    (RollingUpdate), as every other operand."""
    policy = copy.deepcopy(crd.sample_policy())
    policy["spec"]["driver"]["upgradePolicy"]["autoUpgrade"] = False
    model, problems = crd.parse_policy(policy)
    assert model is not None
    assert not problems
    ctx = RenderContext(namespace=NS, operator_image="gpuop:test", service_monitor_crd=False)
    desired = {name: list(objs) for name, objs in desired_objects(model.spec, ctx).items()}
    driver = [o for o in desired["driver"] if o["kind"] == "DaemonSet"]
    assert driver[0]["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    return desired


def _deploy_labels() -> dict[str, str]:
    """Every operand's deploy label: each DaemonSet selects the node."""
    return {
        k: v
        for objs in _desired().values()
        for o in objs
        if o["kind"] == "DaemonSet"
        for k, v in o["spec"]["template"]["spec"]["nodeSelector"].items()
    }


def _node(name: str, ready: str, taints: list[Obj]) -> bytes:
    obj = {
        "metadata": {
            "name": name,
            "uid": f"u-{name}",
            "resourceVersion": "1",
            "labels": {GPU: "true", **_deploy_labels()},
        },
        "spec": {"taints": taints},
        "status": {"conditions": [{"type": "Ready", "status": ready}]},
    }
    return json.dumps({"type": "ADDED", "object": obj}).encode()


def _pod(node: str, app: str, phase: str, terminating: bool, serial: int = 0) -> bytes:
    """A pod as a partitioned node's kubelet last reported it: the phase is stale
    (``Pending`` with its init containers running, or ``Running``)."""
    labels = {"app": app}
    if app == DRIVER:
        labels["app.kubernetes.io/component"] = "nvidia-driver"
    meta: Obj = {
        "name": f"{app}-{node}-{serial}",
        "namespace": NS,
        "uid": f"uid-{app}-{node}-{serial}",
        "resourceVersion": str(serial + 1),
        "labels": labels,
    }
    if terminating:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    obj = {
        "metadata": meta,
        "spec": {"nodeName": node},
        "status": {
            "phase": phase,
            "conditions": [{"type": "Ready", "status": "False"}],
            "initContainerStatuses": [{"name": "toolkit-validation", "state": {"running": {}}}],
        },
    }
    return json.dumps({"type": "ADDED", "object": obj}).encode()


class _Cluster:
    """The operator's node and pod caches and the cluster pass's release step."""

    def __init__(self) -> None:
        self.nodes = Informer(ResourceSpec("nodes", _never, transform=trim_node), lambda *_: None)
        self.pods = Informer(
            ResourceSpec("pods", _never, index=pod_index, transform=trim_pod), lambda *_: None
        )
        self.rollouts = rollouts = NodeRollouts(
            self.pods,
            Informer(ResourceSpec("r", _never), lambda *_: None),
            Informer(ResourceSpec("d", _never), lambda *_: None),
            NS,
        )
        self.rest = _Rest()
        self.events = _Events()
        self.reports = RolloutReports(
            self.rest,  # type: ignore[arg-type]
            rollouts,
            self.events,  # type: ignore[arg-type]
            OperatorMetrics(),
        )
        self.fleet = GpuNodes(self.nodes)
        self.desired = _desired()

    def release(self) -> int:
        """One cluster pass's release step (after its view, as in the pass); how many
        pods it left for later."""
        self.rollouts.view(self.desired, list(self.fleet().nodes))
        return asyncio.run(self.reports.release_stale(self.fleet().out_of_service, self.desired))

    def deleted(self) -> list[str]:
        return [name for name, _, _ in self.rest.deleted]


def _every_kind_of_pod(cluster: _Cluster, node: str) -> None:
    """A partitioned node's operand pods: a rolling update's old pod stuck terminating,
    a new pod bound there and ``Pending`` (its kubelet never started it, or its init
    container runs and the phase is stale), a ``Running`` one, the driver terminating."""
    cluster.pods._on_line(_pod(node, DEVICE_PLUGIN, "Running", terminating=True, serial=1))
    cluster.pods._on_line(_pod(node, DEVICE_PLUGIN, "Pending", terminating=False, serial=2))
    cluster.pods._on_line(_pod(node, TOOLKIT, "Pending", terminating=False, serial=3))
    cluster.pods._on_line(_pod(node, DCGM, "Running", terminating=False, serial=4))
    cluster.pods._on_line(_pod(node, DRIVER, "Pending", terminating=True, serial=5))
    cluster.pods._on_line(_pod(node, DRIVER, "Pending", terminating=False, serial=6))


def test_a_partitioned_node_alone_loses_no_pod() -> None:
    """Not Ready, tainted unreachable by the lifecycle controller, no administrator's
    word: Kubernetes deletes nothing there, nor do we (whatever the stale phases say)."""
    cluster = _Cluster()
    cluster.nodes._on_line(_node("lost", "Unknown", UNREACHABLE))
    cluster.nodes._on_line(_node("down", "False", UNREACHABLE))
    _every_kind_of_pod(cluster, "lost")
    _every_kind_of_pod(cluster, "down")
    assert cluster.release() == 0
    assert cluster.deleted() == []
    assert cluster.events.recorded == []


def test_out_of_service_releases_only_terminating_non_driver_pods_with_an_event() -> None:
    cluster = _Cluster()
    cluster.nodes._on_line(_node("lost", "Unknown", [*UNREACHABLE, OUT_OF_SERVICE]))
    _every_kind_of_pod(cluster, "lost")
    assert cluster.release() == 0
    # The rolling update's old pod only: not the Pending or Running ones (Kubernetes
    # evicts those itself, or leaves them where they tolerate the taint), never the
    # driver, terminating or not.
    assert cluster.deleted() == [f"{DEVICE_PLUGIN}-lost-1"]
    _, namespace, body = cluster.rest.deleted[0]
    assert namespace == NS
    assert body["gracePeriodSeconds"] == 0
    assert body["preconditions"] == {"uid": f"uid-{DEVICE_PLUGIN}-lost-1"}
    [(involved, reason, message, warning)] = cluster.events.recorded
    assert involved["kind"] == "Node"
    assert involved["metadata"] == {"name": "lost", "uid": "u-lost"}
    assert reason == REASON_STALE_PODS_DELETED
    assert warning
    assert f"{DEVICE_PLUGIN}-lost-1" in message
    assert OUT_OF_SERVICE_TAINT in message


def test_out_of_service_on_a_ready_node_releases_nothing() -> None:
    """A Ready node's kubelet confirms deletions itself (pod GC asks for both)."""
    cluster = _Cluster()
    cluster.nodes._on_line(_node("alive", "True", [OUT_OF_SERVICE]))
    _every_kind_of_pod(cluster, "alive")
    assert cluster.release() == 0
    assert cluster.deleted() == []


def test_releases_are_capped_per_pass_and_the_rest_wait() -> None:
    cluster = _Cluster()
    apps = (DEVICE_PLUGIN, TOOLKIT, DCGM)
    for n in range(5):
        node = f"lost-{n}"
        cluster.nodes._on_line(_node(node, "Unknown", [*UNREACHABLE, OUT_OF_SERVICE]))
        for i, app in enumerate(apps):
            cluster.pods._on_line(_pod(node, app, "Running", terminating=True, serial=i))
        cluster.pods._on_line(_pod(node, DRIVER, "Running", terminating=True, serial=9))
    total = 5 * len(apps)
    assert total > MAX_RELEASED_PER_PASS
    assert cluster.release() == total - MAX_RELEASED_PER_PASS
    assert len(cluster.deleted()) == MAX_RELEASED_PER_PASS
    assert not any(name.startswith(DRIVER) for name in cluster.deleted())
    # One Event per node touched, naming its pods.
    assert sorted(e[0]["metadata"]["name"] for e in cluster.events.recorded) == [
        "lost-0",
        "lost-1",
        "lost-2",
        "lost-3",
    ]


def test_out_of_service_is_pod_gcs_test() -> None:
    assert out_of_service("Unknown", [OUT_OF_SERVICE])
    assert out_of_service("False", [OUT_OF_SERVICE])
    assert out_of_service(None, [{"key": OUT_OF_SERVICE_TAINT, "effect": "NoSchedule"}])
    assert not out_of_service("True", [OUT_OF_SERVICE])
    assert not out_of_service("Unknown", UNREACHABLE)
    assert not out_of_service(None, [])


def test_the_plan_is_stable_and_never_holds_a_driver_pod() -> None:
    def pod(node: str, name: str, terminating: bool = True, driver: bool = False) -> StalePod:
        return StalePod(name, NS, f"u-{name}", node, terminating, driver)

    pods = [
        pod("b", "x"),
        pod("a", "z"),
        pod("a", "y"),
        pod("a", "driver", driver=True),
        pod("a", "live", terminating=False),
    ]
    plan = plan_release(pods, cap=2)
    assert [p.name for p in plan.delete] == ["y", "z"]
    assert plan.left == 1
    assert plan_release(list(reversed(pods)), cap=2) == plan
    assert plan.by_node() == {"a": [pods[2], pods[1]]}
    assert plan_release([pod("a", "driver", driver=True)]).delete == ()
