"""A node whose upgrade bookkeeping was damaged (issue 35, item 5): a removed or mistyped
state label on a node we cordoned, and a timer stamped in the future."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest

from statemachine.budget import BudgetNode, select_nodes
from statemachine.cordon import CORDON_REASON_ANNOTATION, CORDONED_BY_ANNOTATION, CordonOwner
from statemachine.upgrade import next_step
from statemachine.upgrade_keys import (
    DRAIN_START_ANNOTATION,
    STATE_LABEL,
    STATE_SINCE_ANNOTATION,
    VALIDATION_START_ANNOTATION,
    UpgradeState,
)
from statemachine.upgrade_views import (
    Action,
    Decision,
    DrainView,
    DriverPodView,
    NodeUpgradeView,
    UpgradePolicyView,
)

S = UpgradeState
NOW = 1_700_000_000.0
T = str(int(NOW))
POLICY = UpgradePolicyView(auto_upgrade=True)
DRAIN = replace(POLICY, drain=DrainView(enable=True, timeout_seconds=300))
OLD_POD = DriverPodView(uid="pod-old", revision_hash="rev-old", running=True, ready=True)
NEW_POD = DriverPodView(uid="pod-new", revision_hash="rev-new", running=True, ready=True)
OURS = {CORDONED_BY_ANNOTATION: CordonOwner.DRIVER_UPGRADE.value, CORDON_REASON_ANNOTATION: "x"}
#: The year 5000: what a typo in an epoch-seconds annotation easily becomes.
FAR_FUTURE = str(int(NOW) + 3118 * 365 * 86400)


def view(
    label: str | None, annotations: Mapping[str, str] | None = None, **kw: Any
) -> NodeUpgradeView:
    kw.setdefault("driver_pod", NEW_POD)
    kw.setdefault("newest_revision", "rev-new")
    labels = {STATE_LABEL: label} if label is not None else {}
    return NodeUpgradeView(
        name="gpu-7", now=NOW, labels=labels, annotations=dict(annotations or {}), **kw
    )


def _apply(v: NodeUpgradeView, d: Decision) -> NodeUpgradeView:
    labels, annotations = dict(v.labels), dict(v.annotations)
    for target, patch in ((labels, d.labels), (annotations, d.annotations)):
        for k, val in patch.items():
            if val is None:
                target.pop(k, None)
            else:
                target[k] = val
    unschedulable = {Action.CORDON: True, Action.UNCORDON: False}.get(d.action, v.unschedulable)
    return replace(v, labels=labels, annotations=annotations, unschedulable=unschedulable)


@pytest.mark.parametrize("label", [None, "", "upgrade-dnoe", "unknown"], ids=repr)
def test_a_node_we_cordoned_with_a_lost_label_and_a_valid_driver_is_uncordoned(
    label: str | None,
) -> None:
    """It used to go to upgrade-done, cordoned for ever, using up maxUnavailable."""
    v = view(label, OURS, unschedulable=True, validators_ready=True)
    d = next_step(v, POLICY)
    assert d.target is S.UNCORDON_REQUIRED
    assert d.action is Action.UNCORDON
    done = next_step(_apply(v, d), POLICY)
    assert done.target is S.UPGRADE_DONE
    assert CORDONED_BY_ANNOTATION not in _apply(_apply(v, d), done).annotations


def test_a_node_we_cordoned_with_a_lost_label_and_an_unproven_driver_redoes_the_upgrade() -> None:
    """Validation never passed (maybe the label said upgrade-failed): never uncordoned
    on a guess; it queues (already cordoned, so it costs no availability) and restarts."""
    v = view(None, OURS, unschedulable=True, validators_ready=False)
    d = next_step(v, POLICY)
    assert d.target is S.UPGRADE_REQUIRED
    assert d.action is Action.NONE
    queued = _apply(v, d)
    assert next_step(queued, POLICY).target is S.UPGRADE_REQUIRED  # not cancelled to done
    started = next_step(queued, POLICY, may_start=True)
    assert started.triggers[0] == "start"
    assert started.action is Action.RESTART_DRIVER_POD


def _run(v: NodeUpgradeView, steps: int = 20) -> NodeUpgradeView:
    """Persist and perform each decision as the controller does, until the node rests."""
    for _ in range(steps):
        d = next_step(v, POLICY, may_start=v.state is S.UPGRADE_REQUIRED)
        v = _apply(v, d)
        if d.action is Action.RESTART_DRIVER_POD:
            v = replace(v, driver_pod=replace(NEW_POD, uid=f"pod-{v.now}"))
        elif d.action is Action.WAIT_VALIDATION:
            v = replace(v, validators_ready=True)
        elif d.action is Action.NONE and d.target is S.UPGRADE_DONE:
            return v
        v = replace(v, now=v.now + 1)
    raise AssertionError("no convergence")


def test_a_lost_label_on_a_cordoned_node_frees_the_budget_again() -> None:
    """4 nodes at 25%: one node cordoned for ever kept every other node from starting."""
    stuck = view(None, OURS, unschedulable=True, validators_ready=False, driver_pod=OLD_POD)
    after = _apply(stuck, next_step(stuck, POLICY))
    fleet = [BudgetNode.from_view(after)] + [
        BudgetNode(f"gpu-{i}", S.UPGRADE_DONE) for i in range(3)
    ]
    selection = select_nodes(fleet, max_parallel_upgrades=1, max_unavailable="25%")
    assert selection.start == ("gpu-7",)  # already cordoned: it costs no availability
    done = _run(after)
    assert not done.unschedulable  # the upgrade ends by lifting its own cordon
    assert CORDONED_BY_ANNOTATION not in done.annotations


@pytest.mark.parametrize("label", ["upgrade-dnoe", "Upgrade-Done", "unknown"])
def test_an_invalid_label_value_is_reported_naming_node_and_value(label: str) -> None:
    d = next_step(view(label), POLICY)
    warnings = " ".join(text for _, text in d.alerts)
    assert "gpu-7" in warnings
    assert repr(label) in warnings


def test_a_lost_label_on_a_node_we_cordoned_is_reported() -> None:
    d = next_step(view(None, OURS, unschedulable=True, validators_ready=True), POLICY)
    assert any("gpu-7" in text and "cordon" in text for _, text in d.alerts)


def test_a_clean_node_without_a_label_is_not_reported() -> None:
    assert next_step(view(None), POLICY).alerts == ()


# --- timers in the future ------------------------------------------------------------------


def test_a_timer_in_the_future_counts_from_now_and_is_rewritten() -> None:
    """It used to disable the drain timeout: next check in 3,118 years."""
    v = view(
        S.DRAIN_REQUIRED.value,
        {**OURS, DRAIN_START_ANNOTATION: FAR_FUTURE, STATE_SINCE_ANNOTATION: T},
        unschedulable=True,
        driver_pod=OLD_POD,
        drain_pods=2,
    )
    d = next_step(v, DRAIN)
    assert d.target is S.DRAIN_REQUIRED
    assert d.requeue_after is not None
    assert d.requeue_after <= 300
    assert d.annotations[DRAIN_START_ANNOTATION] == T
    assert any(DRAIN_START_ANNOTATION in text and "gpu-7" in text for _, text in d.alerts)
    # ...and the timeout then fires on time.
    later = replace(_apply(v, d), now=NOW + 300)
    assert next_step(later, DRAIN).target is S.UPGRADE_FAILED


def test_a_timer_a_little_ahead_from_clock_skew_is_waited_out_not_rewritten() -> None:
    ahead = str(int(NOW) + 5)
    v = view(
        S.VALIDATION_REQUIRED.value,
        {**OURS, VALIDATION_START_ANNOTATION: ahead, STATE_SINCE_ANNOTATION: T},
        unschedulable=True,
    )
    d = next_step(v, POLICY)
    assert d.requeue_after is not None
    assert d.requeue_after <= POLICY.validation_timeout_seconds
    assert VALIDATION_START_ANNOTATION not in d.annotations
    assert d.alerts == ()
