"""Writing ClusterPolicy statuses: only differences, progress at most every couple of
seconds, an Event when the state (or the error) changes or when fields are set that
gpuop does not act on; every policy but the active one is marked ignored.

What a status *says* is computed elsewhere
(:func:`gpuop.operator.controller.views.cluster_status.cluster_status`); this module is the write
path and its bookkeeping.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from crd import (
    CONDITION_UNSUPPORTED_FIELDS,
    REASON_FIELDS_NOT_ACTED_ON,
    ClusterPolicyStatus,
    find_condition,
    ignored_status,
)
from gpuop.kube.informer import Informer, Obj
from gpuop.kube.rest import Rest
from gpuop.log import get_logger
from gpuop.operator.controller.views.cluster_status import flag_spec_conditions
from gpuop.operator.controller.views.objects import (
    generation,
    parse_status,
    policy_ref,
    stored_condition,
)
from gpuop.operator.controller.writers.status_write import (
    CLUSTER_PASS_CONDITIONS,
    POLICY,
    StatusWrite,
    status_dict,
    status_patch,
    write_status,
)
from gpuop.operator.events import EventRecorder
from statemachine.remediation import CONDITION_REMEDIATION_BLIND

log = get_logger(__name__)

#: Status writes that change only progress messages are spaced by at least this.
STATUS_COALESCE_SECONDS = 2.0
#: Status keys that change with every pod during a rollout: written at most every
#: STATUS_COALESCE_SECONDS, not per pod.
_PROGRESS_KEYS = frozenset(("message", "nodesReady", "nodesNotReady", "nodesAt"))


def now() -> datetime:
    return datetime.now(UTC)


class PolicyStatusWriter:
    """Writes ClusterPolicy statuses and the Events that go with them."""

    def __init__(
        self,
        rest: Rest,
        policies: Informer,
        events: EventRecorder,
        write_again_after: Callable[[float], None],
    ) -> None:
        self.rest = rest
        self.policies = policies
        self.events = events
        self._write_again_after = write_again_after
        self._written: dict[str, float] = {}

    async def mark_ignored(self, active: str) -> None:
        """Every policy but ``active`` says it is ignored, and why."""
        for raw in self.policies.values():
            if raw["metadata"]["name"] == active:
                continue
            gen = generation(raw)
            at = now()
            status = ignored_status(active, generation=gen, now=at, previous=parse_status(raw))
            await self.write(raw, flag_spec_conditions(status, None, gen, at))

    async def write(self, raw: Obj, status: ClusterPolicyStatus) -> None:
        desired = status_dict(status)
        patch = status_patch(raw.get("status"), desired)
        if patch is None:
            return
        name = raw["metadata"]["name"]
        since = time.monotonic() - self._written.get(name, float("-inf"))
        if _only_messages_differ(raw.get("status"), desired) and since < STATUS_COALESCE_SECONDS:
            # Progress counts ("981/1000 pods available") change with every pod during
            # a rollout; write them at most every couple of seconds, not per pod.
            self._write_again_after(STATUS_COALESCE_SECONDS - since)
            return
        old = raw.get("status") or {}
        if status.state != old.get("state") or _new_error(old, desired):
            await self._record_state_change(raw, status)
        await self._record_unsupported_fields(raw, status)
        await self._record_remediation_blind(raw, status)
        # Only our condition types: another writer's condition, written after our cache
        # was filled, survives (and a stale copy of one is never written back).
        mine = [c for c in desired.get("conditions") or [] if c["type"] in CLUSTER_PASS_CONDITIONS]
        write = StatusWrite(CLUSTER_PASS_CONDITIONS, mine, fields=desired)
        await write_status(self.rest, POLICY, self.policies, raw, write)
        self._written[name] = time.monotonic()

    async def _record_unsupported_fields(self, raw: Obj, status: ClusterPolicyStatus) -> None:
        """A Warning Event naming the fields set but not acted on, once per change of the
        UnsupportedFields condition (so once per policy generation that sets them)."""
        new = find_condition(status.conditions, CONDITION_UNSUPPORTED_FIELDS)
        if new is None:
            return
        old = stored_condition(raw, CONDITION_UNSUPPORTED_FIELDS)
        if (old.get("message"), old.get("observedGeneration")) == (
            new.message,
            new.observed_generation,
        ):
            return
        await self.events.record(
            policy_ref(raw), REASON_FIELDS_NOT_ACTED_ON, new.message, warning=True
        )
        log.warning(
            "ClusterPolicy sets fields gpuop does not act on",
            policy=raw["metadata"]["name"],
            message=new.message,
        )

    async def _record_remediation_blind(self, raw: Obj, status: ClusterPolicyStatus) -> None:
        """A Warning Event when RemediationBlind turns True (once, not per write)."""
        new = find_condition(status.conditions, CONDITION_REMEDIATION_BLIND)
        if (
            new is None
            or stored_condition(raw, CONDITION_REMEDIATION_BLIND).get("status") == "True"
        ):
            return
        await self.events.record(
            policy_ref(raw), CONDITION_REMEDIATION_BLIND, new.message, warning=True
        )
        log.warning(
            "gpu health remediation is blind", policy=raw["metadata"]["name"], reason=new.message
        )

    async def _record_state_change(self, raw: Obj, status: ClusterPolicyStatus) -> None:
        """An Event on the policy when its state changes (ready, notReady, ignored)."""
        ready = find_condition(status.conditions, "Ready")
        error = find_condition(status.conditions, "Error")
        await self.events.record(
            policy_ref(raw),
            ready.reason if ready else "StateChanged",
            f"ClusterPolicy is {status.state}: {ready.message if ready else ''}",
            warning=error is not None and error.status == "True",
        )


def _without_messages(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_messages(v) for k, v in value.items() if k not in _PROGRESS_KEYS}
    if isinstance(value, list):
        return [_without_messages(v) for v in value]
    return value


def _only_messages_differ(observed: Obj | None, desired: Obj) -> bool:
    return bool(_without_messages(observed or {}) == _without_messages(desired))


def _error_condition(status: Obj) -> tuple[str, str] | None:
    for cond in status.get("conditions") or []:
        if cond.get("type") == "Error" and cond.get("status") == "True":
            return (str(cond.get("reason")), str(cond.get("message")))
    return None


def _new_error(observed: Obj, desired: Obj) -> bool:
    """A different error than the one already reported (an Event is due even when
    the state stays notReady, e.g. rolling out, then an object is refused)."""
    error = _error_condition(desired)
    return error is not None and error != _error_condition(observed)
