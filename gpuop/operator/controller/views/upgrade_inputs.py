"""Cluster objects turned into the upgrade rulebook's inputs, without I/O.

Pure functions of cached objects (the policy, DaemonSets, ControllerRevisions,
pods, nodes): split from ``writers.upgrade`` so the node and fleet passes, the
``gpuop upgrades`` reports and the tests share one reading of them.
"""

from __future__ import annotations

from collections.abc import Iterable

from components.driver import startup_budget_seconds
from crd import ClusterPolicySpec
from gpuop.kube.informer import Obj
from statemachine import (
    DrainView,
    PodDeletionView,
    UpgradePolicyView,
    WaitForCompletionView,
)
from statemachine.upgrade_keys import DRIVER_REVISION_LABEL


def policy_view(spec: ClusterPolicySpec) -> UpgradePolicyView:
    """The rulebook's view of ``driver.upgradePolicy``."""
    up = spec.driver.upgrade_policy
    return UpgradePolicyView(
        auto_upgrade=bool(spec.driver.enabled and up.auto_upgrade),
        max_parallel_upgrades=up.max_parallel_upgrades,
        max_unavailable=up.max_unavailable,
        wait_for_completion=WaitForCompletionView(
            pod_selector=up.wait_for_completion.pod_selector or "",
            timeout_seconds=up.wait_for_completion.timeout_seconds,
        ),
        pod_deletion=PodDeletionView(
            force=up.pod_deletion.force,
            timeout_seconds=up.pod_deletion.timeout_seconds,
            delete_empty_dir=up.pod_deletion.delete_empty_dir,
        ),
        drain=DrainView(
            enable=up.drain.enable,
            force=up.drain.force,
            pod_selector=up.drain.pod_selector or "",
            timeout_seconds=up.drain.timeout_seconds,
            delete_empty_dir=up.drain.delete_empty_dir,
        ),
        validation_enabled=spec.validator.enabled if spec.validator.enabled is not None else True,
        driver_ready_timeout_seconds=startup_budget_seconds(spec.driver),
    )


def newest_revision(ds: Obj | None, revisions: Iterable[Obj]) -> str | None:
    """The hash of the DaemonSet's newest ControllerRevision: the target of upgrades."""
    if ds is None:
        return None
    uid = ds["metadata"].get("uid")
    newest: tuple[int, str] | None = None
    for rev in revisions:
        owners = rev["metadata"].get("ownerReferences") or []
        if not any(o.get("uid") == uid for o in owners):
            continue
        number = int(rev.get("revision", 0))
        hash_ = (rev["metadata"].get("labels") or {}).get(DRIVER_REVISION_LABEL, "")
        if newest is None or number > newest[0]:
            newest = (number, hash_)
    return newest[1] if newest else None
