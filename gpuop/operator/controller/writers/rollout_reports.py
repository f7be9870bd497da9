"""What the per-node rollout view leads to outside the process: stale pods released from
out-of-service nodes, the stuck-node timer, the ``NodesNotReady`` Event and the metric.

:mod:`gpuop.operator.controller.views.rollout_view` says where each node stands and writes nothing;
this module acts on its answer: terminating operand pods on nodes an administrator
marked out of service are force-deleted as pod GC would (they only hold rolling updates
elsewhere; :mod:`statemachine.stale_pods`), the cluster pass is woken when the next
node becomes due to count as stuck, and the stuck nodes are told through a Warning
Event and ``gpu_operator_nodes_not_ready``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from kubernetes_asyncio.client.exceptions import ApiException

from components.driver import NAME as DRIVER_COMPONENT
from gpuop.kube.informer import Obj
from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Rest
from gpuop.log import get_logger
from gpuop.operator.controller.base.keys import STUCK_KEY
from gpuop.operator.controller.views.objects import policy_ref, stored_condition
from gpuop.operator.controller.views.pod_records import daemonset_app
from gpuop.operator.controller.views.rollout_view import NodeRollouts, RolloutView
from gpuop.operator.events import EventRecorder
from gpuop.operator.metrics import OperatorMetrics
from statemachine.node_rollout import NODE_ORDER
from statemachine.stale_pods import OUT_OF_SERVICE_TAINT, StalePod, plan_release

log = get_logger(__name__)

REASON_NODES_NOT_READY = "NodesNotReady"
"""Event reason (Warning, on the ClusterPolicy) when the set of stuck nodes changes."""
REASON_STALE_PODS_DELETED = "StaleOperandPodsDeleted"
"""Event reason (Warning, on the Node) when operand pods of an out-of-service node were
force-deleted."""
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

    async def release_stale(
        self, out_of_service: Sequence[Obj], desired: Mapping[str, Iterable[Obj]]
    ) -> int:
        """Force-delete (grace period 0) the operand pods pod GC would on
        ``out_of_service`` nodes (:mod:`statemachine.stale_pods`: terminating, not a
        driver's, at most :data:`~statemachine.stale_pods.MAX_RELEASED_PER_PASS`), with
        a Warning Event on each node saying which and why; returns how many wait for
        a later pass. A partitioned node that no administrator marked is left alone."""
        if not out_of_service:
            return 0
        apps = [
            daemonset_app(o)
            for component, objs in desired.items()
            if component != DRIVER_COMPONENT
            for o in objs
            if o.get("kind") == "DaemonSet"
        ]
        plan = plan_release(self._rollouts.stale_pods(out_of_service, apps))
        uids = {str(n["metadata"]["name"]): n["metadata"].get("uid") for n in out_of_service}
        for node, pods in plan.by_node().items():
            deleted = [pod.name for pod in pods if await self._force_delete(pod)]
            if not deleted:
                continue
            log.warning(
                "force-deleted operand pods on an out-of-service node", node=node, pods=deleted
            )
            await self._events.record(
                {"kind": "Node", "metadata": {"name": node, "uid": uids.get(node)}},
                REASON_STALE_PODS_DELETED,
                f"force-deleted {len(deleted)} terminating operand pod(s) "
                f"({', '.join(deleted)}): the node is not Ready and tainted "
                f"{OUT_OF_SERVICE_TAINT}, as pod garbage collection does; "
                "their DaemonSets' rolling updates can go on",
                warning=True,
            )
        return plan.left

    async def _force_delete(self, pod: StalePod) -> bool:
        """Delete that very pod (uid precondition) at once; False if it was gone already
        or had been replaced."""
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": pod.uid},
        }
        try:
            return await self._rest.delete(_POD, pod.name, pod.namespace, body=body)
        except ApiException as err:
            if err.status == 409:  # the uid precondition: another pod of that name now
                return False
            raise

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
