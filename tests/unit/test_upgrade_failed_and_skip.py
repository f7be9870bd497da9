"""A failed node stays failed and quiet until a new revision, a request or a healed
driver; the skip label keeps a node from starting but never freezes one mid-upgrade."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from statemachine.upgrade import next_step
from statemachine.upgrade_keys import (
    FAILED_REVISION_ANNOTATION,
    REASON_ANNOTATION,
    REPLACE_POD_ANNOTATION,
    REQUESTED_ANNOTATION,
    SKIP_LABEL,
    STATE_LABEL,
    STATE_SINCE_ANNOTATION,
    VALIDATION_START_ANNOTATION,
)
from statemachine.upgrade_views import (
    Action,
    NodeUpgradeView,
    UpgradePolicyView,
)
from tests.unit.upgrade_fixtures import (
    NEW,
    NEW_POD,
    OURS,
    POLICY,
    S,
    T,
    applied,
    since,
    view,
)

# --- upgrade-failed ---------------------------------------------------------------------------


def _failed(**kw: Any) -> NodeUpgradeView:
    annotations = {
        **OURS,
        FAILED_REVISION_ANNOTATION: NEW,
        REASON_ANNOTATION: "drain timed out after 300s with 3 pods left",
        REPLACE_POD_ANNOTATION: "pod-old",
        STATE_SINCE_ANNOTATION: since(50),
    }
    annotations.update(kw.pop("annotations", {}))
    kw.setdefault("unschedulable", True)
    return view(S.UPGRADE_FAILED, annotations=annotations, **kw)


def test_failed_node_stays_failed_and_quiet() -> None:
    d = next_step(_failed(), POLICY)
    assert d.target is S.UPGRADE_FAILED
    assert d.action is Action.NONE
    assert d.reason == "drain timed out after 300s with 3 pods left"
    assert not d.has_patch
    assert d.entered_failed is False


def test_failed_node_is_retried_on_a_new_revision() -> None:
    d = next_step(_failed(newest_revision="rev-newer"), POLICY)
    assert d.triggers == ("retry",)
    assert d.target is S.UPGRADE_REQUIRED
    assert d.annotations[FAILED_REVISION_ANNOTATION] is None
    assert d.annotations[REASON_ANNOTATION] is None


def test_failed_node_is_retried_on_request() -> None:
    d = next_step(_failed(annotations={REQUESTED_ANNOTATION: "true"}), POLICY, may_start=True)
    assert d.triggers[:2] == ("retry", "start")
    assert d.annotations[REQUESTED_ANNOTATION] is None


def test_failed_node_recovers_when_driver_is_current_and_valid() -> None:
    v = _failed(driver_pod=NEW_POD, validators_ready=True)
    d = next_step(v, POLICY)
    assert d.triggers == ("recovered",)
    assert d.target is S.UNCORDON_REQUIRED
    assert d.action is Action.UNCORDON


def test_failed_node_does_not_recover_with_invalid_driver() -> None:
    assert next_step(_failed(driver_pod=NEW_POD), POLICY).target is S.UPGRADE_FAILED


def test_failed_node_without_record_gets_one() -> None:
    v = view(S.UPGRADE_FAILED, annotations={STATE_SINCE_ANNOTATION: since(5)})
    d = next_step(v, POLICY)
    assert d.target is S.UPGRADE_FAILED
    assert d.annotations == {FAILED_REVISION_ANNOTATION: NEW}
    # ...so the next revision change retries it
    later = view(
        S.UPGRADE_FAILED,
        annotations={STATE_SINCE_ANNOTATION: since(5), FAILED_REVISION_ANNOTATION: NEW},
        newest_revision="rev-newer",
    )
    assert next_step(later, POLICY).target is S.UPGRADE_REQUIRED


# --- skip label ----------------------------------------------------------------------------------


def test_skip_label_keeps_a_node_from_starting() -> None:
    v = view(
        S.UPGRADE_REQUIRED, labels={SKIP_LABEL: "true"}, annotations={STATE_SINCE_ANNOTATION: T}
    )
    d = next_step(v, POLICY, may_start=True)
    assert d.target is S.UPGRADE_REQUIRED
    assert d.action is Action.NONE
    assert not d.has_patch
    assert d.reason == "skip label set"


@pytest.mark.parametrize(
    ("state", "kw", "target"),
    [
        (S.CORDON_REQUIRED, {"unschedulable": False}, S.CORDON_REQUIRED),
        (S.DRAIN_REQUIRED, {"unschedulable": True}, S.POD_RESTART_REQUIRED),
        (S.UNCORDON_REQUIRED, {"unschedulable": True}, S.UNCORDON_REQUIRED),
    ],
)
def test_skip_label_set_mid_upgrade_does_not_freeze_the_node(
    state: S, kw: dict[str, Any], target: S
) -> None:
    """It used to stop every step: still cordoned, still holding its slot, for ever."""
    v = view(state, labels={SKIP_LABEL: "true"}, annotations={REPLACE_POD_ANNOTATION: "p"}, **kw)
    d = next_step(v, POLICY)
    assert d.target is target
    assert d.action is not Action.NONE


def test_skipped_node_in_progress_finishes_and_is_uncordoned() -> None:
    v = view(
        S.VALIDATION_REQUIRED,
        labels={SKIP_LABEL: "true"},
        unschedulable=True,
        driver_pod=NEW_POD,
        validators_ready=True,
        annotations={REPLACE_POD_ANNOTATION: "pod-old", VALIDATION_START_ANNOTATION: T},
    )
    d = next_step(v, POLICY)
    assert d.target is S.UNCORDON_REQUIRED
    assert d.action is Action.UNCORDON
    done = next_step(replace(applied(v, d), unschedulable=False), POLICY)
    assert done.target is S.UPGRADE_DONE


def test_skip_label_does_not_stop_the_cleanup_when_upgrades_are_off() -> None:
    """With the policy deleted (or autoUpgrade off) a skipped node is handed back too."""
    v = view(S.DRAIN_REQUIRED, labels={SKIP_LABEL: "true"}, unschedulable=True)
    d = next_step(v, UpgradePolicyView(auto_upgrade=False))
    assert d.action is Action.UNCORDON
    later = next_step(replace(v, unschedulable=False), UpgradePolicyView(auto_upgrade=False))
    assert later.labels == {STATE_LABEL: None}


def test_skip_label_must_be_true() -> None:
    v = view(labels={SKIP_LABEL: "false"})
    assert next_step(v, POLICY).target is S.UPGRADE_REQUIRED
