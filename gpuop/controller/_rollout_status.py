"""What the per-node rollout view leads to outside the process: pods released from dead
nodes, the stuck-node timer, the ``NodesNotReady`` Event and the metric.

:mod:`gpuop.controller._rollout_view` says where each node stands and writes nothing;
this module acts on its answer: operand pods on nodes whose kubelet is gone are deleted
(they only block rolling updates elsewhere), the cluster pass is woken when the next
node becomes due to count as stuck, and the stuck nodes are told through a Warning
Event and ``gpu_operator_nodes_not_ready``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from gpuop.controller._policy_status import policy_ref, stored_condition
from gpuop.controller._rollout_view import NodeRollouts, RolloutView, rolls_out
from gpuop.events import EventRecorder
from gpuop.informer import Obj
from gpuop.log import get_logger
from gpuop.metrics import OperatorMetrics
from gpuop.rest import Rest, by_kind
from statemachine.node_rollout import NODE_ORDER

log = get_logger(__name__)

STUCK_KEY = "rollout-stuck"
"""Work-queue key of the timer that re-runs the cluster pass when a node becomes due to
count as stuck (a key of its own, so dropping it never drops a refusal's retry)."""
REASON_NODES_NOT_READY = "NodesNotReady"
"""Event reason (Warning, on the ClusterPolicy) when the set of stuck nodes changes."""
_POD = by_kind("v1", "Pod")


class Timers(Protocol):
    """The part of the work queue the stuck-node timer needs."""

    def add_after(self, key: str, delay: float) -> None: ...

    def forget(self, key: str) -> None: ...


class RolloutReports:
    """Acts on a :class:`RolloutView`; remembers only the stuck nodes last announced."""

    def __init__(
        self,
        rest: Rest,
        rollouts: NodeRollouts,
        events: EventRecorder,
        metrics: OperatorMetrics,
    ) -> None:
        self._rest = rest
        self._rollouts = rollouts
        self._events = events
        self._metrics = metrics
        self._announced: str | None = None

    async def release_abandoned(
        self, dead_nodes: Sequence[Obj], desired: Mapping[str, Iterable[Obj]]
    ) -> None:
        """Delete (grace period 0) our pods that only block rolling updates elsewhere;
        ``dead_nodes``: the GPU nodes whose kubelet is gone."""
        if not dead_nodes:
            return
        apps = [
            o["spec"]["selector"]["matchLabels"]["app"]
            for objs in desired.values()
            for o in objs
            if o.get("kind") == "DaemonSet" and rolls_out(o)
        ]
        for pod in self._rollouts.abandoned_pods(dead_nodes, apps):
            meta = pod["metadata"]
            body = {
                "apiVersion": "v1",
                "kind": "DeleteOptions",
                "gracePeriodSeconds": 0,
                "preconditions": {"uid": meta.get("uid")},
            }
            await self._rest.delete(_POD, meta["name"], meta.get("namespace"), body=body)
            log.warning(
                "deleted an operand pod on a node whose kubelet is gone",
                pod=meta["name"],
                node=pod["spec"].get("nodeName"),
            )

    def schedule(self, view: RolloutView, queue: Timers) -> None:
        """Wake the cluster pass when the next node becomes due to count as stuck; no
        timer at all once every node is done or already reported (an idle queue)."""
        if view.next_due is None:
            queue.forget(STUCK_KEY)
        else:
            queue.add_after(STUCK_KEY, view.next_due + 0.05)

    async def announce(self, policy: Obj, view: RolloutView) -> None:
        """Metric always; a Warning Event ``NodesNotReady`` when the stuck nodes change
        (not again after a restart if the status already says the same)."""
        stuck = {name: 0 for name in NODE_ORDER}
        for node in view.stuck:
            stuck[node.state] += 1
        for name, count in stuck.items():
            self._metrics.nodes_not_ready.labels(state=name).set(count)
        if view.message is None:
            self._announced = None
            return
        if view.message == self._announced:
            return
        self._announced = view.message
        ready = stored_condition(policy, "Ready")
        if view.message in str(ready.get("message", "")):
            return
        await self._events.record(
            policy_ref(policy), REASON_NODES_NOT_READY, view.message, warning=True
        )
