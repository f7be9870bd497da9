"""Cluster objects turned into the upgrade rulebook's inputs, without I/O.

Pure functions of cached objects (the policy, DaemonSets, ControllerRevisions,
pods, nodes): split from ``writers.upgrade`` so the node and fleet passes, the
``gpuop upgrades`` reports and the tests share one reading of them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from components.driver import digest_in, startup_budget_seconds
from crd import ClusterPolicySpec
from gpuop.kube.informer import Obj
from statemachine import (
    DrainView,
    PodDeletionView,
    UpgradePolicyView,
    WaitForCompletionView,
)
from statemachine.upgrade_keys import DRIVER_REVISION_LABEL

_LAST_VIEW: list[tuple[ClusterPolicySpec, UpgradePolicyView]] = []
"""The last spec asked about and its view: every node pass asks of the same parsed spec
(a new policy is a new object), and building the view was a twentieth of the pass."""


def policy_view(spec: ClusterPolicySpec) -> UpgradePolicyView:
    """The rulebook's view of ``driver.upgradePolicy``."""
    if _LAST_VIEW and _LAST_VIEW[0][0] is spec:
        return _LAST_VIEW[0][1]
    view = _policy_view(spec)
    _LAST_VIEW[:] = [(spec, view)]
    return view


def _policy_view(spec: ClusterPolicySpec) -> UpgradePolicyView:
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
    rev = _newest(ds, revisions)
    if rev is None:
        return None
    return str((rev["metadata"].get("labels") or {}).get(DRIVER_REVISION_LABEL, ""))


def revision_lags(ds: Obj | None, revisions: Iterable[Obj]) -> bool:
    """Whether the DaemonSet's newest ControllerRevision installs another driver than its
    template (their driver config digests differ). The DaemonSet and its revisions come
    on two watches: when the template changes (a rollback reverting it, say), the
    DaemonSet controller then makes or renumbers the template's revision, and for a
    moment one cache has the change and the other not. The newest revision and the
    template's digest are then of two rollouts, and the rollout gate must not decide on
    them. Revisions trimmed without a digest (``configDigest``) never lag."""
    rev = _newest(ds, revisions)
    if ds is None or rev is None:
        return False
    mine, theirs = digest_in(template_spec(ds)), str(rev.get("configDigest") or "")
    return bool(mine and theirs and mine != theirs)


def template_spec(obj: Obj | None) -> Obj:
    """The pod spec of ``spec.template``: a DaemonSet's, or a ControllerRevision's
    ``data`` (empty when there is none, or it is not an object)."""
    found: Any = obj
    for key in ("spec", "template", "spec"):
        found = found.get(key) if isinstance(found, dict) else None
    return found if isinstance(found, dict) else {}


def _newest(ds: Obj | None, revisions: Iterable[Obj]) -> Obj | None:
    """The DaemonSet's ControllerRevision with the highest ``revision`` number."""
    if ds is None:
        return None
    uid = ds["metadata"].get("uid")
    newest: tuple[int, Obj] | None = None
    for rev in revisions:
        owners = rev["metadata"].get("ownerReferences") or []
        if not any(o.get("uid") == uid for o in owners):
            continue
        number = int(rev.get("revision", 0))
        if newest is None or number > newest[0]:
            newest = (number, rev)
    return newest[1] if newest else None
