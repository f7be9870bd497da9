"""Turning a rollout outcome into a ClusterPolicy status, and the patch that writes it."""

from __future__ import annotations

from typing import Any

from crd import ClusterPolicyStatus

Obj = dict[str, Any]


def status_dict(status: ClusterPolicyStatus) -> Obj:
    dumped: Obj = status.model_dump(by_alias=True, exclude_none=True, mode="json")
    return dumped


def status_patch(observed: Obj | None, desired: Obj) -> Obj | None:
    """A merge patch turning ``observed`` into ``desired``; None when they are equal.

    Keys the new status no longer has are set to null, so stale fields vanish.
    """
    observed = observed or {}
    if observed == desired:
        return None
    patch: Obj = dict(desired)
    for key in observed:
        if key not in desired:
            patch[key] = None
    return {"status": patch}
