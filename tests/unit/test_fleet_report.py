"""`gpuop upgrade status|plan` reports: PDB blockers, drain refusals, waves, canary, estimate."""

from __future__ import annotations

from typing import Any

from gpuop.upgrades_cli._render import render_plan, render_status, status_json
from statemachine.eviction import RemovalRules
from statemachine.fleet_plan import plan_upgrade
from statemachine.fleet_report import (
    NodeFacts,
    Rules,
    selector_matches,
    status_report,
)
from statemachine.rollout_gate import GatePolicy
from statemachine.upgrade_keys import REASON_ANNOTATION, STATE_LABEL
from statemachine.upgrade_views import DrainView, UpgradePolicyView

POLICY = UpgradePolicyView(
    auto_upgrade=True, max_parallel_upgrades=2, max_unavailable="100%", drain=DrainView(enable=True)
)
RULES = Rules(gpu_pods=RemovalRules(honour_drain_skip=False), drain=RemovalRules())


def node(name: str, state: str = "", **annotations: str) -> dict[str, Any]:
    labels = {STATE_LABEL: state} if state else {}
    return {
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def pod(name: str, *, owned: bool = True, empty_dir: bool = False, app: str = "web") -> Any:
    refs = [{"kind": "ReplicaSet", "name": "rs", "controller": True}] if owned else []
    volumes = [{"name": "v", "emptyDir": {}}] if empty_dir else []
    return {
        "metadata": {
            "name": name,
            "namespace": "w",
            "labels": {"app": app},
            "ownerReferences": refs,
        },
        "spec": {"containers": [{"name": "c"}], "volumes": volumes},
        "status": {"phase": "Running"},
    }


PDB = {
    "metadata": {"name": "web-pdb", "namespace": "w"},
    "spec": {"selector": {"matchLabels": {"app": "web"}}},
    "status": {"disruptionsAllowed": 0},
}


def facts(
    name: str, *pods: Any, digest: str = "d1", revision: str = "old", state: str = ""
) -> NodeFacts:
    return NodeFacts(
        node=node(name, state),
        driver_pod={"metadata": {"name": f"driver-{name}"}},
        driver_revision=revision,
        driver_digest=digest,
        pods=pods,
    )


def test_selector_matching() -> None:
    labels = {"app": "web", "tier": "a"}
    assert selector_matches({}, labels)
    assert not selector_matches(None, labels)
    assert selector_matches(
        {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["a"]}]}, labels
    )
    assert not selector_matches({"matchExpressions": [{"key": "x", "operator": "Exists"}]}, labels)
    assert selector_matches(
        {"matchExpressions": [{"key": "x", "operator": "DoesNotExist"}]}, labels
    )


def test_plan_names_zero_disruption_pdb_and_empty_dir_pod_in_waves() -> None:
    fleet = [
        facts("a", pod("web-1")),
        facts("b", pod("scratch", empty_dir=True, app="batch")),
        facts("c"),
        facts("d", revision="new"),
    ]
    plan = plan_upgrade(
        fleet,
        POLICY,
        GatePolicy(canary_nodes=1, soak_seconds=30),
        RULES,
        [PDB],
        namespace="gpu-operator",
        target="new",
        template_digest="d2",
        proposed=False,
    )
    assert [[n.name for n in w] for w in plan.waves] == [["a"], ["b", "c"]]
    assert plan.up_to_date == ("d",)
    text = render_plan(plan)
    assert "PDB w/web-pdb allows 0 disruptions: w/web-1 cannot be evicted" in text
    assert "drain refuses w/scratch: uses emptyDir" in text
    assert "then soak 30s" in text
    assert plan.estimate_seconds is not None
    assert plan.estimate_seconds == 2 * (plan.wave_seconds or 0) + 30


def test_restart_only_nodes_are_marked_and_skip_blocks() -> None:
    skipped = NodeFacts(
        node={
            **node("s"),
            "metadata": {"name": "s", "labels": {"nvidia.com/gpu-driver-upgrade.skip": "true"}},
        },
        driver_pod={"metadata": {"name": "x"}},
        driver_revision="old",
    )
    plan = plan_upgrade(
        [facts("a"), skipped],
        POLICY,
        GatePolicy(),
        RULES,
        [],
        namespace="gpu-operator",
        target="new",
        template_digest="d1",
        proposed=False,
    )
    assert plan.waves[0][0].restart_only
    assert "skip label" in plan.excluded["s"]


def test_status_counts_failed_and_says_why() -> None:
    failed = NodeFacts(node=node("f", "upgrade-failed", **{REASON_ANNOTATION: "boom"}))
    report = status_report(
        [failed, facts("a", state="upgrade-done", revision="new")],
        POLICY,
        RULES,
        [],
        "new",
        namespace="gpu-operator",
        now=0.0,
    )
    assert report.failed == ("f",)
    assert report.totals == {"upgrade-done": 1, "upgrade-failed": 1}
    assert report.rows[1].waits_for == "boom"


def test_status_text_and_json_name_the_failed_node_and_the_budget() -> None:
    failed = NodeFacts(node=node("f", "upgrade-failed", **{REASON_ANNOTATION: "boom"}))
    report = status_report(
        [failed, facts("a", state="upgrade-done", revision="new")],
        POLICY,
        RULES,
        [],
        "new",
        namespace="gpu-operator",
        now=0.0,
    )
    text = render_status(report)
    assert "f: waiting for boom" in text
    assert "FAILED: f" in text
    assert "budget: in progress 1/2" in text  # a failed node keeps its slot
    assert "WAITING FOR" in render_status(report, wide=True)
    data = status_json(report)
    assert data["failed"] == ["f"]
    assert data["budget"]["maxParallelUpgrades"] == 2
