"""Automatic rollback after a halt (gpuop's `upgradePolicy.rollbackOnHalt`).

A DaemonSet creates pods from its current template only, so nodes go back to the last
driver that validated by the driver DaemonSets themselves going back: while a rollback
stands, the operator writes each driver DaemonSet with the pod template of the revision
the rest of its pool still runs (the nodes the canary or the halt held back ran it,
validated, before this rollout). The DaemonSet controller then finds that revision
again (same template, same hash), so the held-back nodes are current and the canary
and failed nodes are the outdated ones: the upgrade machine takes them back through
the same cordon, drain, restart and validation, under the same budget.

The rollback is one JSON record in an annotation on the ClusterPolicy (nothing in
memory): the halted rollout's key (the driver templates' install configuration) and,
per driver DaemonSet, the revision it goes back to. It holds while the policy still
renders that rollout; a new driver in the policy ends it, as does the resume
annotation (which retries the new driver).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

ROLLBACK_ANNOTATION = "gpuop.io/driver-rollback"


@dataclass(frozen=True)
class RollbackRecord:
    key: str
    """The halted rollout's key (``components.driver.rollout_key`` of the policy's
    driver templates): the rollback stands while the policy renders this."""
    revisions: Mapping[str, str] = field(default_factory=dict)
    """Driver DaemonSet name -> the revision hash its template goes back to."""

    def dumps(self) -> str:
        return json.dumps(
            {"key": self.key, "revisions": dict(sorted(self.revisions.items()))},
            sort_keys=True,
            separators=(",", ":"),
        )

    @classmethod
    def loads(cls, raw: str | None) -> RollbackRecord | None:
        """None when absent or unreadable (a hand-edited record ends the rollback)."""
        if not raw:
            return None
        try:
            data = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(data, dict) or not isinstance(data.get("key"), str):
            return None
        revisions = data.get("revisions")
        if not isinstance(revisions, dict):
            return None
        return cls(
            key=data["key"],
            revisions={str(k): str(v) for k, v in revisions.items() if isinstance(v, str)},
        )

    def describe(self) -> str:
        return ", ".join(f"{ds} to {rev}" for ds, rev in sorted(self.revisions.items()))


def revisions_to_restore(
    pod_revisions: Mapping[str, Iterable[str | None]], newest: Mapping[str, str | None]
) -> dict[str, str]:
    """Per driver DaemonSet, the revision most of its live pods run that is not its
    newest: what its pool ran before the halted rollout. A DaemonSet all of whose pods
    already run the newest (or none) has nothing to go back to and is left out."""
    result = {}
    for ds, revisions in pod_revisions.items():
        counts = Counter(r for r in revisions if r and r != newest.get(ds))
        if counts:
            # most common first; ties by hash, so every pass picks the same one
            result[ds] = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
    return result


def rollback_stands(record: RollbackRecord | None, policy_key: str) -> bool:
    """Whether ``record`` still applies to a policy whose driver renders ``policy_key``
    (a changed driver in the policy is a new rollout: the rollback is over)."""
    return record is not None and bool(record.revisions) and record.key == policy_key
