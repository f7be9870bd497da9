"""Shared fixtures of the upgrade rulebook tests: a clock, revisions, driver pods, policies,
`view` (a node as the rulebook sees it), `World` (a node and a toy controller) and
`applied` (a view after a decision's writes)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from statemachine.cordon import CORDON_REASON_ANNOTATION, CORDONED_BY_ANNOTATION
from statemachine.upgrade import next_step
from statemachine.upgrade_keys import (
    STATE_LABEL,
    UpgradeState,
)
from statemachine.upgrade_views import (
    Action,
    Decision,
    DrainView,
    DriverPodView,
    NodeUpgradeView,
    UpgradePolicyView,
    WaitForCompletionView,
)

S = UpgradeState
NOW = 1_700_000_000.0
T = str(int(NOW))
OLD, NEW = "rev-old", "rev-new"

POLICY = UpgradePolicyView(auto_upgrade=True)
DRAIN = replace(POLICY, drain=DrainView(enable=True, timeout_seconds=300))
WAIT = replace(
    POLICY,
    wait_for_completion=WaitForCompletionView(pod_selector={"app": "train"}, timeout_seconds=600),
)

OLD_POD = DriverPodView(uid="pod-old", revision_hash=OLD, running=True, ready=True)
NEW_POD = DriverPodView(uid="pod-new", revision_hash=NEW, running=True, ready=True)
NEW_POD_STARTING = replace(NEW_POD, running=False, ready=False)
#: The owner record of a cordon the upgrade set (written with the cordon).
OURS = {CORDONED_BY_ANNOTATION: "driver-upgrade", CORDON_REASON_ANNOTATION: "driver upgrade"}


def view(
    state: S | str | None = None,
    *,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    **kw: Any,
) -> NodeUpgradeView:
    all_labels = dict(labels or {})
    if isinstance(state, S):
        if state is not S.UNKNOWN:
            all_labels[STATE_LABEL] = state.value
    elif state is not None:
        all_labels[STATE_LABEL] = state
    kw.setdefault("driver_pod", OLD_POD)
    kw.setdefault("newest_revision", NEW)
    return NodeUpgradeView(
        name="gpu-1", now=NOW, labels=all_labels, annotations=dict(annotations or {}), **kw
    )


def since(seconds_ago: float) -> str:
    return str(int(NOW - seconds_ago))


@dataclass
class World:
    """A node plus a toy controller that performs actions the way the real one will."""

    policy: UpgradePolicyView = POLICY
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    unschedulable: bool = False
    pod: DriverPodView | None = OLD_POD
    newest: str = NEW
    gpu_pods: int = 2
    drain_pods: int = 3
    wait_pods: int = 0
    validators_ready: bool = False
    digest: str = ""
    now: float = NOW
    effects: list[Action] = field(default_factory=list)
    patches: int = 0
    restarts: int = 0

    def view(self) -> NodeUpgradeView:
        return NodeUpgradeView(
            name="gpu-1",
            now=self.now,
            labels=dict(self.labels),
            annotations=dict(self.annotations),
            unschedulable=self.unschedulable,
            driver_pod=self.pod,
            newest_revision=self.newest,
            wait_pods_running=self.wait_pods,
            gpu_pods=self.gpu_pods,
            drain_pods=self.drain_pods,
            validators_ready=self.validators_ready,
            newest_config_digest=self.digest,
        )

    def persist(self, d: Decision) -> None:
        if d.has_patch:
            self.patches += 1
        for target, patch in ((self.labels, d.labels), (self.annotations, d.annotations)):
            for k, v in patch.items():
                if v is None:
                    target.pop(k, None)
                else:
                    target[k] = v

    def perform(self, d: Decision) -> None:
        self.effects.append(d.action)
        if d.action is Action.CORDON:
            self.unschedulable = True
        elif d.action is Action.UNCORDON:
            self.unschedulable = False
        elif d.action is Action.DELETE_GPU_PODS:
            self.gpu_pods = 0
        elif d.action is Action.DRAIN:
            self.drain_pods = 0
        elif d.action is Action.WAIT_JOBS:
            self.wait_pods = 0
        elif d.action is Action.RESTART_DRIVER_POD:
            self.restarts += 1
            self.pod = DriverPodView(uid=f"pod-{self.restarts}", revision_hash=self.newest)
        elif d.action is Action.WAIT_DRIVER_POD and self.pod is not None:
            self.pod = replace(self.pod, running=True, ready=True)
        elif d.action is Action.WAIT_VALIDATION:
            self.validators_ready = True

    def step(self) -> Decision:
        view = self.view()
        # the fleet budget only ever grants slots to queued nodes
        may_start = view.state is S.UPGRADE_REQUIRED
        d = next_step(view, self.policy, may_start=may_start)
        self.persist(d)  # persist first ...
        self.perform(d)  # ... then act
        self.now += 1
        return d

    def run(self, limit: int = 30) -> list[Decision]:
        steps = []
        for _ in range(limit):
            d = self.step()
            steps.append(d)
            if d.target is S.UPGRADE_DONE and d.action is Action.NONE:
                return steps
        raise AssertionError(f"no convergence: {[s.target for s in steps]}")


def applied(v: NodeUpgradeView, d: Decision) -> NodeUpgradeView:
    labels = dict(v.labels)
    annotations = dict(v.annotations)
    for target, patch in ((labels, d.labels), (annotations, d.annotations)):
        for k, val in patch.items():
            if val is None:
                target.pop(k, None)
            else:
                target[k] = val
    return replace(v, labels=labels, annotations=annotations)
