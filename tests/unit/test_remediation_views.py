"""What the operator reads for remediation: the trimmed node keeps GPUHealthy without
its heartbeat, and only changes the planner reads wake the remediation key."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import crd
from gpuop.operator.controller.passes.remediation import Remediation
from gpuop.operator.controller.views.cluster_status import flag_spec_conditions
from gpuop.operator.controller.views.node_views import node_fingerprint, trim_node
from gpuop.operator.controller.views.remediation_views import (
    node_facts,
    node_view,
    policy_facts,
    policy_view,
)
from statemachine.remediation import (
    CONDITION_REMEDIATION_BLIND,
    CORDONED_ANNOTATION,
    HEALTHY_SEEN_ANNOTATION,
    QUARANTINED_ANNOTATION,
    RESUME_ANNOTATION,
    Health,
    RemediationAction,
    blind,
    seen_at,
    seen_record,
)
from statemachine.upgrade_keys import STATE_LABEL


def _node(status: str = "False", heartbeat: str = "2026-01-01T00:00:00Z") -> dict[str, Any]:
    return {
        "metadata": {
            "name": "gpu-node-0001",
            "resourceVersion": "7",
            "labels": {
                "feature.node.kubernetes.io/pci-10de.present": "true",
                "kubernetes.io/hostname": "gpu-node-0001",
                STATE_LABEL: "drain-required",
            },
            "annotations": {QUARANTINED_ANNOTATION: "XidCritical: x", CORDONED_ANNOTATION: "true"},
        },
        "spec": {"unschedulable": True},
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True", "lastHeartbeatTime": heartbeat},
                {"type": "MemoryPressure", "status": "False"},
                {
                    "type": "GPUHealthy",
                    "status": status,
                    "reason": "XidCritical",
                    "message": "GPU 0: XID 79",
                    "lastHeartbeatTime": heartbeat,
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                },
            ]
        },
    }


def test_trimmed_node_keeps_gpu_healthy_and_what_remediation_reads() -> None:
    view = node_view(trim_node(_node()))
    assert view.health is Health.UNHEALTHY
    assert view.since == 1767225600.0
    assert (view.reason, view.message) == ("XidCritical", "GPU 0: XID 79")
    assert view.gpu
    assert view.quarantined
    assert view.cordoned_by_us
    assert view.unschedulable
    assert view.in_upgrade


def test_the_healthy_sighting_counts_only_for_the_transition_it_saw() -> None:
    """Issue 43, item 6: the record is keyed by the lastTransitionTime it was taken for."""
    node = _node(status="True")
    annotations = node["metadata"]["annotations"]
    annotations[HEALTHY_SEEN_ANNOTATION] = seen_record(
        "2026-03-01T12:00:00Z", "2026-01-01T00:00:00Z"
    )
    assert node_view(trim_node(node)).healthy_seen == 1772366400.0
    assert node_view(trim_node(node)).since == 1767225600.0  # the node's clock, apart
    node["status"]["conditions"][2]["lastTransitionTime"] = "2026-01-01T00:05:00Z"
    assert node_view(trim_node(node)).healthy_seen is None  # failed and recovered since
    assert node_view(trim_node(_node(status="False"))).healthy_seen is None
    assert seen_at(None, "") is None
    assert seen_at(seen_record("2026-03-01T12:00:00Z", ""), "") == "2026-03-01T12:00:00Z"


def test_heartbeats_wake_nothing_a_status_flip_does() -> None:
    a = trim_node(_node(heartbeat="2026-01-01T00:00:00Z"))
    b = trim_node(_node(heartbeat="2026-01-01T00:10:00Z"))
    assert node_fingerprint(a) == node_fingerprint(b)
    assert node_facts(a) == node_facts(b)
    c = trim_node(_node(status="True"))
    assert node_fingerprint(a) != node_fingerprint(c)
    assert node_facts(a) != node_facts(c)


def test_a_node_without_the_condition_is_unknown() -> None:
    raw = _node()
    raw["status"]["conditions"] = raw["status"]["conditions"][:1]
    assert node_view(trim_node(raw)).health is Health.UNKNOWN


def _policy(**meta: Any) -> dict[str, Any]:
    policy = copy.deepcopy(crd.sample_policy())
    policy["metadata"].update({"generation": 1, **meta})
    return policy


def test_policy_wakes_remediation_on_resume_and_pause_not_on_other_status() -> None:
    base = _policy()
    other_status = {**base, "status": {"state": "ready"}}
    assert policy_facts(base) == policy_facts(other_status)
    resumed = _policy(annotations={RESUME_ANNOTATION: "true"})
    assert policy_facts(base) != policy_facts(resumed)
    paused = {
        **base,
        "status": {"conditions": [{"type": "RemediationPaused", "status": "True"}]},
    }
    assert policy_facts(base) != policy_facts(paused)
    assert policy_facts(base) != policy_facts(_policy(generation=2))


def test_policy_view_is_off_without_the_section() -> None:
    assert not policy_view(crd.default_policy().spec).enabled
    assert not policy_view(None).enabled
    spec = crd.ClusterPolicySpec.model_validate(
        {"healthRemediation": {"enabled": True, "action": "drain", "maxUnhealthy": 2}}
    )
    view = policy_view(spec)
    assert (view.enabled, view.action, view.max_unhealthy) == (True, RemediationAction.DRAIN, 2)
    assert (view.dry_run, view.settle_seconds) == (False, 300)


def test_with_remediation_off_only_quarantined_nodes_wake_it() -> None:
    none: Any = None
    remediation = Remediation(none, none, none, none, none, none, none)
    plain = _node()
    plain["metadata"]["annotations"] = {}
    flipped = _node(status="True")
    flipped["metadata"]["annotations"] = {}
    assert remediation.wants_node(trim_node(plain), trim_node(flipped))
    remediation._enabled = False
    assert not remediation.wants_node(trim_node(plain), trim_node(flipped))
    # A node we still hold must be released even with remediation off.
    assert remediation.wants_node(trim_node(_node()), trim_node(_node(status="True")))


def test_remediation_without_the_node_agent_is_blind() -> None:
    def spec(**sections: Any) -> crd.ClusterPolicySpec:
        return crd.ClusterPolicySpec.model_validate(sections)

    assert not blind(None)
    assert not blind(spec())  # remediation off: nothing to see
    assert blind(spec(healthRemediation={"enabled": True}))  # the exporter is off by default
    assert blind(spec(healthRemediation={"enabled": True, "dryRun": True}))
    assert not blind(
        spec(healthRemediation={"enabled": True}, nodeStatusExporter={"enabled": True})
    )
    assert not blind(spec(healthRemediation={"enabled": False}))


def test_the_cluster_status_says_when_remediation_is_blind() -> None:
    def policy(**sections: Any) -> crd.ClusterPolicy:
        return crd.ClusterPolicy.model_validate(
            {"metadata": {"name": "cluster-policy"}, "spec": sections}
        )

    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    plain = crd.ClusterPolicyStatus(state="ready")
    blind_policy = policy(healthRemediation={"enabled": True})
    flagged = flag_spec_conditions(plain, blind_policy, 3, t0)
    cond = crd.find_condition(flagged.conditions, CONDITION_REMEDIATION_BLIND)
    assert cond is not None
    assert (cond.status, cond.reason) == ("True", "NodeStatusExporterDisabled")
    assert "nodeStatusExporter.enabled is false" in cond.message
    # Said again later: equal, so nothing is written.
    assert flag_spec_conditions(flagged, blind_policy, 3, t0 + timedelta(hours=1)) == flagged
    # The agent switched on, remediation off, or no active policy: the condition goes.
    seeing = policy(healthRemediation={"enabled": True}, nodeStatusExporter={"enabled": True})
    for model in (seeing, policy(), None):
        cleared = flag_spec_conditions(flagged, model, 4, t0)
        assert crd.find_condition(cleared.conditions, CONDITION_REMEDIATION_BLIND) is None
    assert flag_spec_conditions(plain, policy(), 4, t0) == plain  # upstream's status
