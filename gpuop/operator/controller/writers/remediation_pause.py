"""Remediation's pause: the ClusterPolicy's RemediationPaused condition and the resume
annotation, written as the circuit breaker trips and an administrator resumes."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from gpuop.kube.informer import Obj
from gpuop.kube.rest import Rest
from gpuop.log import get_logger
from gpuop.operator.controller.views.remediation_views import paused_condition
from gpuop.operator.controller.writers.remediation_dry_run import POLICY, policy_ref
from gpuop.operator.controller.writers.status_write import condition_change, write_policy_conditions
from gpuop.operator.events import EventRecorder
from statemachine.remediation import (
    CONDITION_REMEDIATION_PAUSED,
    REASON_CIRCUIT_BREAKER,
    REASON_RESUMED,
    RESUME_ANNOTATION,
    RemediationPlan,
    RemediationPolicyView,
)

log = get_logger(__name__)


class PauseCondition:
    """Writes RemediationPaused (guarded by resourceVersion) and clears the resume
    annotation once acted on."""

    def __init__(self, rest: Rest, events: EventRecorder, policies: Any) -> None:
        self.rest = rest
        self.events = events
        self._policies = policies
        #: The pause as last written: if a concurrent status write drops the
        #: condition, the next pass restores it instead of taking the pause as lifted.
        self.written = False

    async def state(
        self, raw: Obj, plan: RemediationPlan, policy: RemediationPolicyView, now: datetime
    ) -> None:
        involved = policy_ref(raw)
        if plan.resumed:
            patched = await self.rest.merge_patch(
                POLICY,
                raw["metadata"]["name"],
                {"metadata": {"annotations": {RESUME_ANNOTATION: None}}},
            )
            self._policies.observe(patched)
            raw = patched
            log.info("gpu health remediation resumed", policy=raw["metadata"]["name"])
            await self.events.record(
                involved, "RemediationResumed", "GPU health remediation resumed by annotation"
            )
        if plan.paused:
            message = plan.pause_message(policy.max_unhealthy)
            condition = ("True", REASON_CIRCUIT_BREAKER, message)
        elif plan.resumed or paused_condition(raw) is not None:
            condition = ("False", REASON_RESUMED, "GPU health remediation is active")
        else:
            return  # never paused: no condition at all, the status stays upstream's
        if plan.tripped:
            log.warning("gpu health remediation paused", reason=message, held=list(plan.held))
            await self.events.record(involved, "RemediationPaused", message, warning=True)
        await self.write(raw, condition, now)

    async def write(self, raw: Obj, condition: tuple[str, str, str] | None, now: datetime) -> None:
        """Set (or with None remove) RemediationPaused, guarded by resourceVersion."""
        change = condition_change(raw, CONDITION_REMEDIATION_PAUSED, condition, now)
        if change is None:
            # Unreadable status: writing ours alone would drop Ready and Error.
            log.warning("policy status unreadable; RemediationPaused not written")
            return
        self.written = condition is not None and condition[0] == "True"
        if change.wanted == change.stored:
            return
        await write_policy_conditions(
            self.rest, self._policies, raw, change.wanted, owned=CONDITION_REMEDIATION_PAUSED
        )
