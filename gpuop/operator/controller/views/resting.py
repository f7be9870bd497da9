"""Per node, the last upgrade decision that did nothing: asked again, the same view
gets the same answer without the rulebook.

During a rollout a node at rest is asked again on each of its driver and validator
pod events; the rulebook's answer depends only on the view (its clock aside) and the
policy. What is kept per node is what makes the entry small at fleet scale
(``GPUOP_BENCH_TRACEMALLOC``): the view without its clock and without its driver pod,
the driver pod as the cache's own record (alive in the cache anyway, compared by what
the rulebook reads of it) and a decision shared by every node resting in the same
state for the same reason (the node's name is put back on each answer).
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

from gpuop.operator.controller.views.pod_records import PodRecord, driver_pod_view
from statemachine import Decision, NodeUpgradeView, UpgradePolicyView, UpgradeState

POOL_LIMIT = 256
"""Distinct resting answers shared; past it, an entry keeps its own (reasons are a
closed set of sentences today, the bound only keeps a surprise from growing)."""


class Entry(NamedTuple):
    """What is kept for one node."""

    policy: UpgradePolicyView
    view: NodeUpgradeView
    """Clock zeroed, ``driver_pod`` left out (``driver``)."""
    driver: PodRecord | None
    decision: Decision
    """Shared between nodes: ``node`` is empty."""


def _bare(view: NodeUpgradeView) -> NodeUpgradeView:
    return replace(view, now=0.0, driver_pod=None)


class RestingMemo:
    """The resting answers of every node, keyed by node name."""

    def __init__(self) -> None:
        self._entries: dict[str, Entry] = {}
        self._policies: dict[UpgradePolicyView, UpgradePolicyView] = {}
        self._answers: dict[tuple[UpgradeState, str], Decision] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def entry(self, name: str) -> Entry | None:
        """What is kept for node ``name`` (for tests and debugging)."""
        return self._entries.get(name)

    def get(
        self, policy: UpgradePolicyView, view: NodeUpgradeView, driver: PodRecord | None
    ) -> Decision | None:
        """The remembered answer for this view and policy, or None. ``driver``: the record
        ``view.driver_pod`` was made from."""
        entry = self._entries.get(view.name)
        if entry is None or entry.policy != policy or entry.view != _bare(view):
            return None
        if entry.driver is not driver:
            kept = None if entry.driver is None else driver_pod_view(entry.driver)
            if kept != view.driver_pod:
                return None
            # The same to the rulebook: hold the cache's current record, not the old one.
            self._entries[view.name] = entry._replace(driver=driver)
        return replace(entry.decision, node=view.name)

    def put(
        self,
        policy: UpgradePolicyView,
        view: NodeUpgradeView,
        driver: PodRecord | None,
        decision: Decision,
    ) -> None:
        """Remembers a decision at rest (nothing to do, write or report; no clock)."""
        self._entries[view.name] = Entry(
            self._shared_policy(policy), _bare(view), driver, self._shared_answer(decision)
        )

    def forget(self, name: str) -> None:
        self._entries.pop(name, None)

    def hold(self, name: str, driver: PodRecord | None) -> None:
        """An answer was given from the memo: hold the cache's current driver record,
        not the old one (the same to the rulebook)."""
        entry = self._entries.get(name)
        if entry is not None and entry.driver is not driver:
            self._entries[name] = entry._replace(driver=driver)

    def _shared_policy(self, policy: UpgradePolicyView) -> UpgradePolicyView:
        """One instance per distinct policy: each node pass builds its own, and a
        thousand resting nodes held a thousand equal copies (0.45 KiB a node)."""
        if len(self._policies) > 64:
            self._policies.clear()  # policies held by entries stay valid, only unshared
        return self._policies.setdefault(policy, policy)

    def _shared_answer(self, decision: Decision) -> Decision:
        """The decision without its node, one instance per state and reason."""
        key = (decision.current, decision.reason)
        shared = self._answers.get(key)
        if shared is None:
            shared = replace(decision, node="")
            if len(self._answers) < POOL_LIMIT:
                self._answers[key] = shared
        return shared
