"""The node pass's write phase: carries out a `statemachine.node_plan.NodePlan`, in its
order (the workload's Events, then one label patch, or the upgrade step's patch, pod
removals, driver restart and Events), and turns its `NodeAgain` into the pass's
`Result`. Our own node patches go into the node cache through ``Informer.observe``
(they wake no watch event): when one moves what the cluster pass reads of the node,
the plan says so (``NodeAgain.progress``), as the router would for a watch event; a
patch refused (409) moved nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kubernetes_asyncio.client.exceptions import ApiException

from crd import OWNER_LABEL
from gpuop.kube.informer import Informer, Obj
from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Rest
from gpuop.log import get_logger
from gpuop.operator.controller.base.result import Result
from gpuop.operator.events import EventRecorder
from statemachine.node_plan import NodeAgain, NodePlan, Say, UpgradeWrite

if TYPE_CHECKING:
    from gpuop.operator.controller.writers.upgrade import Upgrades
    from gpuop.operator.controller.writers.workload_handover import WorkloadHandovers

log = get_logger(__name__)

NODE = by_kind("v1", "Node")
POD = by_kind("v1", "Pod")


@dataclass(kw_only=True)
class NodeWriter:
    """Writes one node pass's plan."""

    rest: Rest
    nodes: Informer
    upgrades: Upgrades
    workloads: WorkloadHandovers

    @property
    def events(self) -> EventRecorder:
        return self.upgrades.events

    async def write(self, plan: NodePlan) -> Result:
        name = plan.name
        if plan.gone:
            self.upgrades.forget_node(name)
            self.workloads.forget(name)
            return _result(plan.again)
        if plan.said is not None:
            self.workloads.remember(name, *plan.said)
        for say in plan.says:
            await self._say(plan, say)
        again = plan.again
        if plan.label_patch:
            self.nodes.observe(await self.rest.merge_patch(NODE, name, dict(plan.label_patch)))
            self.workloads.patched(name, plan.label_patch["metadata"].get("labels") or {})
            if plan.label_say is not None:
                await self._say(plan, plan.label_say)
        elif plan.upgrade is not None:
            again = await self._upgrade(plan, plan.upgrade)
        return _result(again)

    async def _upgrade(self, plan: NodePlan, step: UpgradeWrite) -> NodeAgain:
        name = plan.name
        self.upgrades.remember(name, step)
        if step.resting == "keep":
            return plan.again
        if step.patch:
            try:
                self.nodes.observe(await self.rest.merge_patch(NODE, name, dict(step.patch)))
            except ApiException as err:
                if err.status != 409:
                    raise
                return step.on_conflict
        if step.forget_refusals:
            self.upgrades.emptying.forget(name)  # a new step: its own refusals only
        if step.evict is not None:
            await self.upgrades.emptying.evict(name, step.evict)
        if step.unown:
            patch = {"metadata": {"labels": {OWNER_LABEL: None}}}
            self.nodes.observe(await self.rest.merge_patch(NODE, name, patch))
            log.info("driver owner", node=name, owner=None, reason="moving")
        for pod, namespace in step.delete_pods:
            await self.rest.delete(POD, pod, namespace)
        for say in step.says:
            await self._say(plan, say)
        return plan.again

    async def _say(self, plan: NodePlan, say: Say) -> None:
        if say.log:
            fields: dict[str, Any] = dict(say.fields)
            (log.warning if say.log_warning else log.info)(say.log, **fields)
        if say.reason:
            await self.events.record(_node_ref(plan.node), say.reason, say.message, say.warning)


def _result(again: NodeAgain) -> Result:
    return Result(
        again.requeue_after,
        now=again.now,
        forget=again.forget,
        fleet=again.fleet,
        progress=again.progress,
    )


def _node_ref(node: Any) -> Obj:
    meta = (node or {}).get("metadata") or {}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": meta.get("name"), "uid": meta.get("uid")},
    }
