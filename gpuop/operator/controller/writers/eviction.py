"""Emptying a node: LIST its pods, apply kubectl drain's rules, evict what they allow.

Split from ``writers.upgrade`` because health remediation drains through it too, and
because it is the one place that remembers something between passes: evictions
refused per node, which word failure reasons and pace retries (memory only; a
restart simply asks again).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from gpuop.kube.informer import Obj
from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Rest
from gpuop.log import get_logger
from statemachine import UpgradePolicyView
from statemachine.eviction import (
    RemovalPlan,
    drain_rules,
    gpu_pod_rules,
    gpu_workload,
    plan_removal,
    selector,
)

log = get_logger(__name__)

POD = by_kind("v1", "Pod")
#: An eviction refused (by a PodDisruptionBudget, say) is retried after this, as
#: kubectl drain does, until the step's timeout fails the node.
EVICTION_RETRY_SECONDS = 5.0


def eviction_error(err: ApiException) -> str:
    """The API's words for a refused eviction, causes included (they name the budget).
    The Status is in the body, or (as `gpuop.kube.rest` raises it) in the reason."""
    body: Any = None
    for raw in (err.body, err.reason):
        try:
            body = json.loads(raw or "")
        except (TypeError, ValueError):
            continue
        if isinstance(body, dict):
            break
    if not isinstance(body, dict):
        return f"{err.status} {err.reason}"
    causes = [
        str(c.get("message"))
        for c in (body.get("details") or {}).get("causes") or []
        if c.get("message")
    ]
    message = str(body.get("message") or f"{err.status} {err.reason}").rstrip(".")
    return ": ".join([message, *causes])


class Emptying:
    """Plans and evictions for nodes being emptied (pods elsewhere are not cached)."""

    def __init__(self, rest: Rest, namespace: str) -> None:
        self.rest = rest
        self.namespace = namespace
        #: Evictions refused per node: pod key -> (when, the API's words).
        self._refused: dict[str, dict[str, tuple[float, str]]] = {}

    async def node_pods(self, node: str, label_selector: str = "") -> list[Obj]:
        selectors = {"field_selector": f"spec.nodeName={node}"}
        if label_selector:
            selectors["label_selector"] = label_selector
        return await self.rest.list(POD, None, **selectors)

    def _gpu_workloads(self, pods: Iterable[Obj]) -> list[Obj]:
        """Pods the pod-deletion step targets: GPU pods still running, never our operands
        (DaemonSet pods elsewhere are ignored by the rules themselves)."""
        return [
            p for p in pods if gpu_workload(p) and p["metadata"].get("namespace") != self.namespace
        ]

    async def gpu_plan(self, node: str, policy: UpgradePolicyView) -> RemovalPlan:
        pods = self._gpu_workloads(await self.node_pods(node))
        return plan_removal(pods, gpu_pod_rules(policy))

    async def drain_plan(self, node: str, policy: UpgradePolicyView) -> RemovalPlan:
        pods = await self.node_pods(node, selector(policy.drain.pod_selector))
        return plan_removal(pods, drain_rules(policy))

    async def drain(self, node: str, policy: UpgradePolicyView) -> RemovalPlan:
        """One pass of the drain rules over `node`: evict what they allow (nothing when
        they refuse a pod)."""
        plan = await self.drain_plan(node, policy)
        await self.evict(node, plan)
        return plan

    def left(self, node: str, keys: tuple[str, ...]) -> tuple[str, ...]:
        """The pods a step still waits for, each with why its eviction was refused."""
        refused = self._refused.get(node, {})
        return tuple(f"{k} ({refused[k][1]})" if k in refused else k for k in keys)

    def refusals(self, node: str) -> dict[str, str]:
        """The evictions refused on ``node``: pod key -> the API's words."""
        return {key: why for key, (_, why) in self._refused.get(node, {}).items()}

    def blocked(self, node: str, keys: tuple[str, ...]) -> tuple[str, ...]:
        """Of ``keys``, those whose eviction the API refused, each with its words."""
        refused = self._refused.get(node, {})
        return tuple(f"{k} ({refused[k][1]})" for k in keys if k in refused)

    def forget(self, node: str) -> None:
        """A new step begins: only its own refusals count."""
        self._refused.pop(node, None)

    async def evict(self, node: str, plan: RemovalPlan) -> None:
        """Evict what the rules allow, never DELETE: PodDisruptionBudgets always apply.

        A refusal is remembered (for the failure reason) and retried no sooner than
        kubectl would; it never stops the other pods or other nodes.
        """
        if plan.refused:
            return  # the rulebook fails the step; kubectl evicts nothing then either
        refused = self._refused.setdefault(node, {})
        now = time.monotonic()
        for key in plan.evict:
            last = refused.get(key)
            if last is not None and now - last[0] < EVICTION_RETRY_SECONDS:
                continue
            namespace, name = key.split("/", 1)
            try:
                await self.rest.evict(name, namespace)
            except ApiException as err:
                if err.status == 404:
                    refused.pop(key, None)
                    continue
                why = eviction_error(err)
                if last is None or last[1] != why:
                    log.info("eviction refused, retrying", node=node, pod=key, reason=why)
                refused[key] = (now, why)
            else:
                refused.pop(key, None)
