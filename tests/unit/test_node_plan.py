"""The node pass reads once, decides once, writes once (issue 45): `plan_node` is the
one decision, over a snapshot; what it asks of the queue is part of its plan."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import crd
from statemachine import UpgradePolicyView
from statemachine.driver_handoff import HANDOFF_ANNOTATION
from statemachine.node_plan import (
    EMPTYING_POLL_SECONDS,
    GPU_PODS_RECHECK_S,
    DriverFacts,
    LiveReads,
    NodeSnapshot,
    Reads,
    plan_node,
    plan_reads,
)
from statemachine.upgrade_keys import STATE_LABEL, UpgradeState
from statemachine.upgrade_views import Action, DrainView, DriverPodView
from tests.factories import node, pod, snapshot
from tests.tools.walk import walk

SPEC = crd.ClusterPolicySpec.model_validate({"driver": {"upgradePolicy": {"autoUpgrade": True}}})


def _settled(state: str, **spec: Any) -> dict[str, Any]:
    """A GPU node with its deploy labels and hand-off annotation: no label to write."""
    annotations = {HANDOFF_ANNOTATION: "true", "gpuop.io/driver-upgrade-state-since": "999999990"}
    return node(
        labels={STATE_LABEL: state},
        annotations=annotations,
        deployed=SPEC,
        uid="u",
        rv="3",
        ready=True,
        **spec,
    )


def _snap(node_obj: dict[str, Any] | None, **kw: Any) -> NodeSnapshot:
    return snapshot(node_obj, now=1e9, spec=SPEC, gpucluster=None, **kw)


def test_a_gone_node_is_forgotten_and_an_invalid_policy_changes_nothing() -> None:
    gone = plan_node(_snap(None))
    assert gone.gone
    assert gone.again.forget
    invalid = plan_node(snapshot(node(ready=True), policy_invalid=True))
    assert (invalid.label_patch, invalid.upgrade, invalid.said) == ({}, None, None)
    assert invalid.again == type(invalid.again)()  # nothing asked of the queue


def test_a_new_gpu_node_is_labelled_and_enrolled_in_one_patch_and_left_at_rest() -> None:
    """The enrolment ran the upgrade step on the labels it writes, so the pass does not
    run again for it: planned again on the patched node, it would write nothing."""
    from statemachine.upgrade_views import UpgradePolicyView as View

    policy = View(auto_upgrade=True)
    fresh = node(gpu=True, uid="u", rv="3", ready=True)
    snap = _snap(fresh, spec_policy=policy)
    assert plan_reads(snap) == Reads()  # the driver's first claim: on the caches' word
    plan = plan_node(snap)
    labels = plan.label_patch["metadata"]["labels"]
    assert labels["nvidia.com/gpu.deploy.driver"] == "true"
    assert labels[STATE_LABEL] == UpgradeState.UPGRADE_DONE.value  # enrolled
    assert plan.upgrade is None
    assert not plan.again.now
    assert plan.again.fleet
    assert not plan.again.forget
    patched = copy.deepcopy(fresh)
    patched["metadata"]["labels"].update(labels)
    written = plan.label_patch["metadata"].get("annotations") or {}
    patched["metadata"].setdefault("annotations", {}).update(written)
    again = plan_node(_snap(patched, spec_policy=policy))
    assert again.label_patch == {}
    assert again.upgrade is not None
    assert not again.upgrade.patch
    assert again.upgrade.decision.action is Action.NONE


def test_a_label_patch_that_enrols_nothing_runs_the_pass_again() -> None:
    """Without an enrolment the upgrade step has not read the new labels: it runs at
    once after the patch."""
    snap = _snap(node(gpu=True, uid="u", rv="3", ready=True))  # upgrades off: no enrolment
    plan = plan_node(snap)
    assert plan.label_patch["metadata"]["labels"]["nvidia.com/gpu.deploy.driver"] == "true"
    assert STATE_LABEL not in plan.label_patch["metadata"]["labels"]
    assert plan.again.now


def test_only_a_first_driver_claim_goes_without_asking_the_api() -> None:
    """The API is asked before a claim whenever a claimant's DaemonSet may have
    selected the node: once it carries any deploy label, or for a VM claim (the
    container GPU pods a VFIO or vGPU manager waits for are in no cache)."""
    fresh = node(gpu=True, uid="u", rv="3", ready=True)
    assert plan_reads(_snap(fresh)) == Reads()
    # Its first labels held the claim back (a claimant's pod in the cache): the next
    # pass asks, though nothing in the cache holds the claim any longer.
    labelled = node(gpu=True, uid="u", rv="3", ready=True, deployed=SPEC)
    labelled["metadata"]["labels"].pop("nvidia.com/gpu.deploy.driver")
    assert plan_reads(_snap(labelled)) == Reads(node_pods=True, unbound=True)
    vm = node(gpu=True, uid="u", rv="3", ready=True)
    vm["metadata"]["labels"]["nvidia.com/gpu.workload.config"] = "vm-passthrough"
    sandbox = crd.ClusterPolicySpec.model_validate({"sandboxWorkloads": {"enabled": True}})
    vm_snap = snapshot(vm, now=1e9, spec=sandbox, gpucluster=None)
    assert plan_reads(vm_snap) == Reads(node_pods=True, unbound=True)


def test_an_emptying_node_reads_its_pods_and_looks_again_soon() -> None:
    draining = _settled("drain-required", unschedulable=True)
    policy = UpgradePolicyView(auto_upgrade=True, drain=DrainView(enable=True))
    snap = _snap(draining, spec_policy=policy, owner_policies=None)
    reads = plan_reads(snap)
    assert reads.drain_selector == ""  # every pod on the node (no selector)
    assert not reads.unbound
    workload = pod("w", "n0", namespace="ml", owner=("ReplicaSet", "web-1"))
    plan = plan_node(replace(snap, live=LiveReads(drain_pods=(workload,))))
    assert plan.label_patch == {}
    assert plan.upgrade is not None
    assert plan.upgrade.evict is not None
    assert plan.upgrade.evict.evict == ("ml/w",)
    assert plan.again.requeue_after == EMPTYING_POLL_SECONDS


def test_a_resting_answer_is_kept_and_asks_nothing() -> None:
    policy = UpgradePolicyView(auto_upgrade=True)
    pod = DriverPodView("uid", "rev", running=True, ready=True)
    snap = snapshot(
        _settled("upgrade-done"),
        now=1e9,
        spec=SPEC,
        spec_policy=policy,
        driver=DriverFacts("d", newest_revision="rev", driver_pod=pod, validators_ready=True),
    )
    first = plan_node(snap)
    assert first.upgrade is not None
    assert first.upgrade.resting == "put"
    assert first.again.forget
    assert not first.again.now
    assert not first.again.fleet


def test_a_held_claim_for_container_gpu_pods_looks_again_every_few_seconds() -> None:
    from statemachine._node_upgrade import _again
    from statemachine.node_plan import NodeAgain
    from statemachine.upgrade_views import Action, Decision

    waiting = Decision(
        "n0", UpgradeState.DRAIN_REQUIRED, UpgradeState.DRAIN_REQUIRED, Action.DRAIN, ""
    )
    assert _again(waiting, recheck=True).requeue_after == EMPTYING_POLL_SECONDS
    done = Decision("n0", UpgradeState.UPGRADE_DONE, UpgradeState.UPGRADE_DONE, Action.NONE, "")
    assert _again(done, recheck=True) == NodeAgain(requeue_after=GPU_PODS_RECHECK_S, forget=True)


def test_the_node_pass_climbs_from_the_core_at_most_twice() -> None:
    """Read (one pure question: what to read), plan, write: `tests/tools/walk.py`."""
    for which in ("enrol", "drain"):
        assert walk(which, core_whole=False).counts()["climbs"] <= 2
        # infrastructure and the caches' record types as edges (the walk's third rule)
        assert walk(which, core_whole=True, edges=True).counts()["modules"] <= 8
