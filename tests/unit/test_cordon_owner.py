"""One owner per cordon (issue 35, item 8): driver upgrades and health remediation each
lift only a cordon recorded as theirs, and hand it to the other when the other still
needs the node cordoned; an administrator's cordon (no record) is never lifted."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from statemachine.cordon import (
    CORDON_REASON_ANNOTATION,
    CORDONED_BY_ANNOTATION,
    CordonOwner,
    cordon_owner,
)
from statemachine.remediation import (
    ACTION_ANNOTATION,
    CORDONED_ANNOTATION,
    QUARANTINED_ANNOTATION,
    FleetHealthView,
    Health,
    HealthNodeView,
    RemediationPolicyView,
    plan_remediation,
)
from statemachine.upgrade import cleanup_step, next_step
from statemachine.upgrade_keys import (
    INITIAL_UNSCHEDULABLE_ANNOTATION,
    REPLACE_POD_ANNOTATION,
    STATE_LABEL,
    UpgradeState,
)
from statemachine.upgrade_views import (
    Action,
    DriverPodView,
    NodeUpgradeView,
    UpgradePolicyView,
)

S = UpgradeState
NOW = 1_700_000_000.0
POLICY = UpgradePolicyView(auto_upgrade=True)
OFF = UpgradePolicyView(auto_upgrade=False)
OLD_POD = DriverPodView(uid="pod-old", revision_hash="rev-old", running=True, ready=True)
NEW_POD = DriverPodView(uid="pod-new", revision_hash="rev-new", running=True, ready=True)
UPGRADE = CordonOwner.DRIVER_UPGRADE.value
REMEDIATION = CordonOwner.HEALTH_REMEDIATION.value
QUARANTINE = {QUARANTINED_ANNOTATION: "XidCritical: GPU 0: XID 79", ACTION_ANNOTATION: "cordon"}


def view(
    state: S | None, annotations: Mapping[str, str] | None = None, **kw: Any
) -> NodeUpgradeView:
    labels = {STATE_LABEL: state.value} if state is not None else {}
    kw.setdefault("driver_pod", OLD_POD)
    kw.setdefault("newest_revision", "rev-new")
    return NodeUpgradeView(
        name="gpu-1", now=NOW, labels=labels, annotations=dict(annotations or {}), **kw
    )


def owned(owner: str, **extra: str) -> dict[str, str]:
    return {CORDONED_BY_ANNOTATION: owner, CORDON_REASON_ANNOTATION: "why", **extra}


# --- the upgrade machine ------------------------------------------------------------------


def test_an_upgrade_that_cordons_records_itself_as_the_owner_in_the_same_patch() -> None:
    d = next_step(view(S.UPGRADE_REQUIRED), POLICY, may_start=True)
    assert d.action is Action.CORDON
    assert d.annotations[CORDONED_BY_ANNOTATION] == UPGRADE
    assert "driver upgrade" in (d.annotations[CORDON_REASON_ANNOTATION] or "")


def test_an_upgrade_of_a_node_already_cordoned_does_not_take_the_cordon() -> None:
    quarantined = view(S.UPGRADE_REQUIRED, owned(REMEDIATION, **QUARANTINE), unschedulable=True)
    d = next_step(quarantined, POLICY, may_start=True)
    assert CORDONED_BY_ANNOTATION not in d.annotations
    assert d.annotations[INITIAL_UNSCHEDULABLE_ANNOTATION] == "true"


def test_an_upgrade_never_lifts_a_cordon_remediation_holds() -> None:
    """The node was uncordoned mid-upgrade, then quarantined: remediation's cordon now."""
    v = view(
        S.UNCORDON_REQUIRED,
        owned(REMEDIATION, **QUARANTINE, **{REPLACE_POD_ANNOTATION: "pod-old"}),
        unschedulable=True,
        driver_pod=NEW_POD,
    )
    d = next_step(v, POLICY)
    assert d.target is S.UPGRADE_DONE
    assert d.action is Action.NONE
    assert CORDONED_BY_ANNOTATION not in d.annotations  # still remediation's


def test_an_upgrade_done_with_a_quarantined_node_hands_its_cordon_over() -> None:
    v = view(
        S.UNCORDON_REQUIRED,
        owned(UPGRADE, **QUARANTINE, **{REPLACE_POD_ANNOTATION: "pod-old"}),
        unschedulable=True,
        driver_pod=NEW_POD,
    )
    d = next_step(v, POLICY)
    assert d.target is S.UPGRADE_DONE
    assert d.action is Action.NONE  # stays cordoned: remediation lifts it on release
    assert d.annotations[CORDONED_BY_ANNOTATION] == REMEDIATION
    assert d.annotations[CORDON_REASON_ANNOTATION] == QUARANTINE[QUARANTINED_ANNOTATION]


def test_a_taint_only_quarantine_does_not_keep_the_node_cordoned() -> None:
    taint = {**QUARANTINE, ACTION_ANNOTATION: "taint"}
    v = view(S.UNCORDON_REQUIRED, owned(UPGRADE, **taint), unschedulable=True, driver_pod=NEW_POD)
    d = next_step(v, POLICY)
    assert d.action is Action.UNCORDON
    assert d.annotations[CORDONED_BY_ANNOTATION] is None  # cleared with the uncordon


def test_an_upgrade_uncordons_its_own_cordon_and_drops_the_record_in_the_same_patch() -> None:
    v = view(S.UNCORDON_REQUIRED, owned(UPGRADE), unschedulable=True, driver_pod=NEW_POD)
    d = next_step(v, POLICY)
    assert d.action is Action.UNCORDON
    assert d.annotations[CORDONED_BY_ANNOTATION] is None
    assert d.annotations[CORDON_REASON_ANNOTATION] is None


def test_an_administrators_cordon_is_never_lifted_by_an_upgrade() -> None:
    v = view(
        S.UNCORDON_REQUIRED,
        {INITIAL_UNSCHEDULABLE_ANNOTATION: "true"},
        unschedulable=True,
        driver_pod=NEW_POD,
    )
    assert next_step(v, POLICY).action is Action.NONE
    assert cleanup_step(v).action is Action.NONE


def test_a_cordon_from_before_the_record_is_adopted_as_the_upgrades() -> None:
    """Upstream semantics: in an upgrade state without the initial-state annotation the
    cordon is the upgrade's. The record is written so it never rests on a guess again."""
    v = view(S.VALIDATION_REQUIRED, {REPLACE_POD_ANNOTATION: "pod-old"}, unschedulable=True)
    assert cordon_owner(v.labels, v.annotations) is CordonOwner.DRIVER_UPGRADE
    d = next_step(v, POLICY)
    assert d.annotations[CORDONED_BY_ANNOTATION] == UPGRADE


def test_upgrades_off_never_lift_a_cordon_remediation_holds() -> None:
    v = view(S.DRAIN_REQUIRED, owned(REMEDIATION, **QUARANTINE), unschedulable=True)
    d = next_step(v, OFF)
    assert d.action is Action.NONE
    assert d.labels == {STATE_LABEL: None}
    assert CORDONED_BY_ANNOTATION not in d.annotations


def test_upgrades_off_hand_their_cordon_to_a_quarantine() -> None:
    v = view(S.DRAIN_REQUIRED, owned(UPGRADE, **QUARANTINE), unschedulable=True)
    d = next_step(v, OFF)
    assert d.action is Action.NONE
    assert d.annotations[CORDONED_BY_ANNOTATION] == REMEDIATION


# --- remediation ----------------------------------------------------------------------------

ON = RemediationPolicyView(enabled=True, max_unhealthy=4, settle_seconds=60)


def _settled(**kw: Any) -> HealthNodeView:
    return HealthNodeView(
        "a", Health.HEALTHY, since=NOW - 3600, healthy_seen=NOW - 3600, quarantined=True, **kw
    )


def test_remediation_hands_a_failed_upgrades_node_to_the_upgrade() -> None:
    """Quarantined (and cordoned by us) before the upgrade, whose new driver then failed
    validation: the release must not put that node back in service."""
    node = _settled(cordoned_by_us=True, unschedulable=True, upgrade_holds_cordon=True)
    plan = plan_remediation(FleetHealthView((node,), NOW), ON)
    (release,) = plan.release
    assert not release.uncordon
    assert release.hand_over


def test_remediation_releases_its_own_cordon_when_the_upgrade_does_not_need_it() -> None:
    node = _settled(cordoned_by_us=True, unschedulable=True)
    (release,) = plan_remediation(FleetHealthView((node,), NOW), ON).release
    assert release.uncordon
    assert not release.hand_over


def test_remediation_never_lifts_a_cordon_it_does_not_own() -> None:
    node = _settled(unschedulable=True, upgrade_holds_cordon=True)
    (release,) = plan_remediation(FleetHealthView((node,), NOW), ON).release
    assert not release.uncordon
    assert not release.hand_over


def test_the_remediation_view_reads_the_owner_record() -> None:
    from gpuop.operator.controller.views.remediation_views import node_view

    def node(annotations: dict[str, str], state: S | None = None) -> dict[str, Any]:
        labels = {"feature.node.kubernetes.io/pci-10de.present": "true"}
        if state is not None:
            labels[STATE_LABEL] = state.value
        return {
            "metadata": {"name": "a", "labels": labels, "annotations": annotations},
            "spec": {"unschedulable": True},
            "status": {},
        }

    assert node_view(node(owned(REMEDIATION, **QUARANTINE))).cordoned_by_us
    assert not node_view(node(owned(UPGRADE, **QUARANTINE))).cordoned_by_us
    # A record written before the owner record existed still counts.
    assert node_view(node({**QUARANTINE, CORDONED_ANNOTATION: "true"})).cordoned_by_us
    failed = node_view(node(owned(REMEDIATION, **QUARANTINE), S.UPGRADE_FAILED))
    assert failed.upgrade_holds_cordon
    assert not node_view(node(owned(REMEDIATION), S.UPGRADE_DONE)).upgrade_holds_cordon
