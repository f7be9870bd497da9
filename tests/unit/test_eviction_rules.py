"""kubectl drain's rules for emptying a node: every pod shape against every flag.

The expectations are kubectl's documented behaviour (``kubectl drain --help``, with
``--ignore-daemonsets`` as upstream always sets it): DaemonSet-managed pods are
ignored, mirror pods are skipped, pods with emptyDir volumes need
``--delete-emptydir-data``, pods no controller manages need ``--force``, finished pods
may always go. Anything the flags do not cover is refused, never silently removed.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from statemachine.eviction import (
    RemovalRules,
    Verdict,
    gpu_workload,
    plan_removal,
    pod_verdict,
    uses_gpu,
)
from statemachine.upgrade_keys import DRAIN_SKIP_POD_LABEL

E, IG, W, R = Verdict.EVICT, Verdict.IGNORE, Verdict.WAIT, Verdict.REFUSE


def _owner(kind: str, controller: bool = True) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "name": "o",
        "uid": "u",
        "controller": controller,
    }


def pod(
    name: str = "p",
    *,
    owner: str | None = "ReplicaSet",
    controller: bool = True,
    empty_dir: bool = False,
    phase: str = "Running",
    mirror: bool = False,
    skip: bool = False,
    terminating: bool = False,
    gpu: bool = False,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ml", "labels": {}, "annotations": {}}
    if owner:
        meta["ownerReferences"] = [_owner(owner, controller)]
    if mirror:
        meta["annotations"]["kubernetes.io/config.mirror"] = "abc"
    if skip:
        meta["labels"][DRAIN_SKIP_POD_LABEL] = "true"
    if terminating:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    container: dict[str, Any] = {"name": "c", "image": "i"}
    if gpu:
        container["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    spec: dict[str, Any] = {"containers": [container]}
    if empty_dir:
        spec["volumes"] = [{"name": "scratch", "emptyDir": {}}]
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


FLAGS = list(itertools.product([False, True], [False, True]))  # (force, deleteEmptyDir)


# shape, then the verdict for (force, deleteEmptyDir) = FF, FT, TF, TT
TABLE: list[tuple[str, dict[str, Any], tuple[Verdict, Verdict, Verdict, Verdict]]] = [
    ("managed by a ReplicaSet", {}, (E, E, E, E)),
    ("managed by a StatefulSet", {"owner": "StatefulSet"}, (E, E, E, E)),
    ("managed by a Job", {"owner": "Job"}, (E, E, E, E)),
    ("unmanaged", {"owner": None}, (R, R, E, E)),
    ("owner that is not a controller", {"controller": False}, (R, R, E, E)),
    ("managed, emptyDir", {"empty_dir": True}, (R, E, R, E)),
    ("unmanaged, emptyDir", {"owner": None, "empty_dir": True}, (R, R, R, E)),
    ("DaemonSet", {"owner": "DaemonSet"}, (IG, IG, IG, IG)),
    ("DaemonSet, emptyDir", {"owner": "DaemonSet", "empty_dir": True}, (IG, IG, IG, IG)),
    ("DaemonSet owner not a controller", {"owner": "DaemonSet", "controller": False}, (R, R, E, E)),
    ("DaemonSet, finished", {"owner": "DaemonSet", "phase": "Succeeded"}, (E, E, E, E)),
    ("mirror (static) pod", {"owner": "Node", "mirror": True}, (IG, IG, IG, IG)),
    ("mirror, unmanaged", {"owner": None, "mirror": True}, (IG, IG, IG, IG)),
    ("unmanaged, Succeeded", {"owner": None, "phase": "Succeeded"}, (E, E, E, E)),
    (
        "unmanaged, Failed, emptyDir",
        {"owner": None, "phase": "Failed", "empty_dir": True},
        (E, E, E, E),
    ),
    ("unmanaged, Pending", {"owner": None, "phase": "Pending"}, (R, R, E, E)),
    ("drain-skip label", {"skip": True, "owner": None, "empty_dir": True}, (IG, IG, IG, IG)),
    ("terminating, managed", {"terminating": True}, (W, W, W, W)),
    (
        "terminating, unmanaged, emptyDir",
        {"terminating": True, "owner": None, "empty_dir": True},
        (W, W, W, W),
    ),
    ("terminating DaemonSet", {"terminating": True, "owner": "DaemonSet"}, (IG, IG, IG, IG)),
]


@pytest.mark.parametrize(("shape", "kw", "expected"), TABLE, ids=[t[0] for t in TABLE])
def test_verdict_table(shape: str, kw: dict[str, Any], expected: tuple[Verdict, ...]) -> None:
    got = tuple(
        pod_verdict(pod(**kw), RemovalRules(force=f, delete_empty_dir=e)).verdict for f, e in FLAGS
    )
    assert got == expected, shape


def test_refusals_say_which_flag_would_allow_them() -> None:
    unmanaged = pod_verdict(pod(owner=None), RemovalRules())
    assert unmanaged.verdict is R
    assert unmanaged.why.endswith("needs force")
    scratch = pod_verdict(pod(empty_dir=True), RemovalRules())
    assert scratch.verdict is R
    assert scratch.why.endswith("needs deleteEmptyDir")
    # kubectl checks local storage before the controller: the first missing flag is named
    both = pod_verdict(pod(owner=None, empty_dir=True), RemovalRules(force=True))
    assert both.why.endswith("needs deleteEmptyDir")


def test_pod_deletion_does_not_honour_the_drain_skip_label() -> None:
    """Upstream adds the skip label to the drain's selector only."""
    labelled = pod(skip=True, gpu=True)
    assert pod_verdict(labelled, RemovalRules(honour_drain_skip=False)).verdict is E
    assert pod_verdict(labelled, RemovalRules()).verdict is IG


def test_drain_skip_label_must_be_true() -> None:
    p = pod(owner=None)
    p["metadata"]["labels"][DRAIN_SKIP_POD_LABEL] = "false"
    assert pod_verdict(p, RemovalRules()).verdict is R


def test_plan_sorts_pods_by_verdict_in_a_stable_order() -> None:
    pods = [
        pod("z"),
        pod("a"),
        pod("ds", owner="DaemonSet"),
        pod("gone", terminating=True),
        pod("bare", owner=None),
        pod("scratch", empty_dir=True),
    ]
    plan = plan_removal(pods, RemovalRules())
    assert plan.evict == ("ml/a", "ml/z")
    assert plan.waiting == ("ml/gone",)
    assert plan.remaining == ("ml/a", "ml/z", "ml/gone")
    assert [key for key, _ in plan.refused] == ["ml/bare", "ml/scratch"]
    assert plan.refusals[0].startswith("ml/bare (no controller manages it")
    allowed = plan_removal(pods, RemovalRules(force=True, delete_empty_dir=True))
    assert allowed.refused == ()
    assert allowed.evict == ("ml/a", "ml/bare", "ml/scratch", "ml/z")


def test_gpu_pods_are_recognised_by_their_resources() -> None:
    gpu = pod(gpu=True)
    mig = pod()
    mig["spec"]["containers"][0]["resources"] = {"requests": {"nvidia.com/mig-1g.10gb": "1"}}
    other = pod()
    other["spec"]["containers"][0]["resources"] = {"limits": {"example.com/gpu": "1"}}
    assert uses_gpu(gpu)
    assert uses_gpu(mig)
    assert not uses_gpu(other)
    assert not uses_gpu(pod())


@pytest.mark.parametrize(
    ("phase", "targeted"),
    [("Running", True), ("Pending", True), ("Succeeded", False), ("Failed", False)],
)
def test_pod_deletion_targets_gpu_pods_still_running(phase: str, targeted: bool) -> None:
    assert gpu_workload(pod(gpu=True, phase=phase)) is targeted
    assert not gpu_workload(pod(phase=phase))


def test_a_gpu_daemonset_pod_elsewhere_is_never_targeted() -> None:
    """It would come straight back: deleting it failed the node, or looped for ever."""
    ds = pod("monitor", owner="DaemonSet", gpu=True)
    assert gpu_workload(ds)
    plan = plan_removal(
        [ds], RemovalRules(force=True, delete_empty_dir=True, honour_drain_skip=False)
    )
    assert plan.remaining == ()
    assert plan.refused == ()
