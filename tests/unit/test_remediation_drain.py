"""Remediation's drain (issue 35, item 6): the Event says what the drain did, and a
quarantined node whose drain was refused or interrupted is drained again, from the
node's own record (no memory)."""

from __future__ import annotations

from typing import Any

import pytest

from gpuop.operator.controller.views.remediation_views import node_view
from statemachine.remediation import (
    ACTION_ANNOTATION,
    DRAINED_ANNOTATION,
    QUARANTINED_ANNOTATION,
    DrainOutcome,
    FleetHealthView,
    Health,
    HealthNodeView,
    RemediationAction,
    RemediationPolicyView,
    plan_remediation,
)

NOW = 1_000_000.0
DRAIN = RemediationPolicyView(
    enabled=True, action=RemediationAction.DRAIN, max_unhealthy=4, settle_seconds=60
)


def quarantined(name: str = "a", **kw: Any) -> HealthNodeView:
    kw.setdefault("health", Health.UNHEALTHY)
    kw.setdefault("since", NOW - 10)
    return HealthNodeView(name, quarantined=True, cordoned_by_us=True, unschedulable=True, **kw)


def test_a_quarantined_node_whose_drain_did_not_finish_is_drained_again() -> None:
    """A PodDisruptionBudget refused an eviction, or the operator died between the
    quarantine and the drain: the record on the node says the drain is still owed."""
    plan = plan_remediation(FleetHealthView((quarantined(drain_pending=True),), NOW), DRAIN)
    assert plan.drain == ("a",)
    assert plan.quarantine == ()


@pytest.mark.parametrize(
    ("node", "policy"),
    [
        (quarantined(drain_pending=False), DRAIN),  # drained already
        (quarantined(drain_pending=True, in_upgrade=True), DRAIN),  # the upgrade's node
        (quarantined(drain_pending=True), RemediationPolicyView(enabled=True, max_unhealthy=4)),
        (
            quarantined(drain_pending=True, health=Health.HEALTHY, healthy_seen=0.0),
            DRAIN,
        ),  # released
    ],
    ids=["drained", "in-upgrade", "action-taint-now", "released"],
)
def test_no_drain_is_owed(node: HealthNodeView, policy: RemediationPolicyView) -> None:
    assert plan_remediation(FleetHealthView((node,), NOW), policy).drain == ()


def test_the_view_owes_a_drain_until_the_node_records_one_done() -> None:
    def node(annotations: dict[str, str]) -> dict[str, Any]:
        return {
            "metadata": {
                "name": "a",
                "labels": {"feature.node.kubernetes.io/pci-10de.present": "true"},
                "annotations": annotations,
            },
            "spec": {"unschedulable": True},
        }

    owed = {QUARANTINED_ANNOTATION: "XidCritical: x", ACTION_ANNOTATION: "drain"}
    assert node_view(node(owed)).drain_pending
    assert not node_view(node({**owed, DRAINED_ANNOTATION: "2026-01-01T00:00:00Z"})).drain_pending
    assert not node_view(node({**owed, ACTION_ANNOTATION: "cordon"})).drain_pending


def test_the_outcome_says_drained_only_when_nothing_is_left() -> None:
    assert DrainOutcome().drained
    assert "drained" in DrainOutcome().message()
    evicting = DrainOutcome(left=("ml/trainer-0",))
    assert not evicting.drained


def test_a_refused_drain_names_the_pods_and_says_nothing_was_evicted() -> None:
    why = "ml/trainer-0 (uses emptyDir, its data would be lost; needs deleteEmptyDir)"
    outcome = DrainOutcome(refused=(why,), left=("ml/trainer-0", "ml/other"))
    assert not outcome.drained
    message = outcome.message()
    assert why in message
    assert "nothing evicted" in message
    assert "drained" not in message.replace("drain refused", "")
    assert "driver.upgradePolicy.drain" in message


def test_a_budget_blocked_drain_names_the_pod_and_the_api_words() -> None:
    blocked = "ml/guarded (Cannot evict pod as it would violate the pod's disruption budget)"
    outcome = DrainOutcome(blocked=(blocked,), left=("ml/guarded",))
    assert not outcome.drained
    assert blocked in outcome.message()
