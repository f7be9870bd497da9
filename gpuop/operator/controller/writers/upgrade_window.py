"""Maintenance windows' imperative side: read them off their resource, report them.

``statemachine.maintenance_window`` decides which `upgrade-required` nodes a closed (or
invalid) window holds back; this module runs inside the serial fleet pass, once per
driver owner, reads the windows from the ClusterPolicy or that owner's NVIDIADriver,
and shows the result as the resource's ``DriverUpgradeWindow`` condition (True while a
window is open) and, for an annotation it cannot read, a Warning Event naming it. The
fleet pass merges the holds into the rollout gate's and asks to run again when the
next window opens: a timer, not polling. Nothing is kept in memory.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from components.labels import is_gpu_node
from gpuop.kube.informer import Informer, Obj
from gpuop.kube.rest import Rest
from gpuop.log import get_logger
from gpuop.operator.controller.writers.owner_condition import (
    condition_of,
    owner_ref,
    write_owner_condition,
)
from gpuop.operator.events import EventRecorder
from statemachine.maintenance_window import (
    INVALID,
    OPEN,
    WindowDecision,
    plan_windows,
)
from statemachine.upgrade_keys import STATE_LABEL, UpgradeState, parse_state, skipped

log = get_logger(__name__)

CONDITION_TYPE = "DriverUpgradeWindow"
INVALID_EVENT = "DriverUpgradeWindowInvalid"


def waiting_nodes(nodes: Iterable[Mapping[str, Any]]) -> list[str]:
    """The GPU nodes a window can hold: queued for a slot (``upgrade-required``)."""
    waiting = []
    for node in nodes:
        meta = node.get("metadata") or {}
        node_labels = meta.get("labels") or {}
        if (
            is_gpu_node(node_labels)
            and parse_state(node_labels.get(STATE_LABEL)) is UpgradeState.UPGRADE_REQUIRED
            and not skipped(node_labels)
        ):
            waiting.append(str(meta.get("name", "")))
    return waiting


class UpgradeWindows:
    """The windows of every driver owner; runs inside the serial ``upgrades`` pass."""

    def __init__(
        self, rest: Rest, events: EventRecorder, policies: Informer, drivers: Informer | None
    ) -> None:
        self.rest = rest
        self.events = events
        self._policies = policies
        self._drivers = drivers

    async def reconcile(
        self, raw: Obj | None, owner: str | None, nodes: list[Obj]
    ) -> WindowDecision:
        """The windows of ``owner`` (None: the ClusterPolicy ``raw``) over its ``nodes``;
        the decision's ``held`` joins the gate's, its ``requeue_after`` the pass's."""
        carrier = raw if owner is None else self._nvd(owner)
        if carrier is None:  # the NVIDIADriver is gone: its nodes wait for their next owner
            return WindowDecision()
        annotations = carrier["metadata"].get("annotations") or {}
        decision = plan_windows(annotations, waiting_nodes(nodes), time.time())
        await self._report(carrier, decision, owner)
        return decision

    def _nvd(self, owner: str) -> Obj | None:
        return self._drivers.get(owner) if self._drivers is not None else None

    async def _report(self, raw: Obj, decision: WindowDecision, owner: str | None) -> None:
        """The condition (removed when no window is declared), and a Warning Event when
        the windows turn invalid (the condition's reason is that state persisted, so a
        restart does not repeat it)."""
        cache = self._policies if owner is None else self._drivers
        if not decision.configured:
            await write_owner_condition(self.rest, cache, raw, owner, CONDITION_TYPE, None)
            return
        old = condition_of(raw, CONDITION_TYPE)
        if decision.reason == INVALID and (old is None or old.get("reason") != INVALID):
            name = raw["metadata"]["name"]
            log.warning("invalid maintenance window", name=name, why=decision.message)
            ref = owner_ref(raw, owner)
            await self.events.record(ref, INVALID_EVENT, decision.message, warning=True)
        status = "True" if decision.reason == OPEN else "False"
        condition = (status, decision.reason, decision.message)
        await write_owner_condition(self.rest, cache, raw, owner, CONDITION_TYPE, condition)
