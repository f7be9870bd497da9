"""Remediation's dry run: what it would do, told once each as an Event.

Dry run writes nothing but Events, so what was already told lives in memory (a
restarted operator tells it once more, changing nothing).
"""

from __future__ import annotations

from typing import Any

from gpuop.kube.informer import Obj
from gpuop.kube.kinds import by_kind
from gpuop.log import get_logger
from gpuop.operator.events import EventRecorder
from gpuop.operator.metrics import OperatorMetrics
from statemachine.remediation import RemediationPlan, RemediationPolicyView

log = get_logger(__name__)

POLICY = by_kind("nvidia.com/v1", "ClusterPolicy")


class DryRunReports:
    """The Events a dry run tells, each once while it holds."""

    def __init__(self, metrics: OperatorMetrics, events: EventRecorder, nodes: Any) -> None:
        self.metrics = metrics
        self.events = events
        self._nodes = nodes
        self._reported: set[tuple[str, str]] = set()

    def clear(self) -> None:
        """Remediation acts again: a later dry run tells everything anew."""
        self._reported.clear()

    async def report(
        self, plan: RemediationPlan, policy: RemediationPolicyView, raw: Obj | None
    ) -> None:
        """Tell once what would be done; write nothing but Events."""
        self.metrics.health_would_quarantine.set(len(plan.quarantine))
        self.metrics.health_paused.set(0)
        current: set[tuple[str, str]] = set()
        by_name = {n["metadata"]["name"]: n for n in self._nodes.values()}
        for q in plan.quarantine:
            current.add(("quarantine", q.node))
            if ("quarantine", q.node) not in self._reported:
                text = f"dry run: would quarantine ({policy.action.value}): {q.why}"
                log.warning("gpu health dry run", node=q.node, would=policy.action.value)
                await self.events.record(
                    node_ref(by_name[q.node]), "GPUUnhealthyDryRun", text, warning=True
                )
        for r in plan.release:
            current.add(("release", r.node))
            if ("release", r.node) not in self._reported:
                log.info("gpu health dry run", node=r.node, would="release")
                await self.events.record(
                    node_ref(by_name[r.node]),
                    "GPUHealthyDryRun",
                    f"dry run: would lift the quarantine: {r.why}",
                )
        if plan.tripped and raw is not None:
            current.add(("pause", ""))
            if ("pause", "") not in self._reported:
                message = "dry run: would pause: " + plan.pause_message(policy.max_unhealthy)
                log.warning("gpu health dry run", would="pause", held=list(plan.held))
                await self.events.record(
                    policy_ref(raw), "RemediationPausedDryRun", message, warning=True
                )
        self._reported = current


def node_ref(node: Obj) -> Obj:
    return {"apiVersion": "v1", "kind": "Node", "metadata": node["metadata"]}


def policy_ref(raw: Obj) -> Obj:
    return {"apiVersion": POLICY.api_version, "kind": POLICY.kind, "metadata": raw["metadata"]}
