"""Which pods emptying a node may remove: the rules of ``kubectl drain``.

Upstream empties a node with kubectl's drain helper (DaemonSets ignored, ``force`` and
``deleteEmptyDir`` from the policy, the pod's own grace period, always the Eviction
API), both for the drain and for deleting the GPU pods. A pod the flags do not cover
is never removed: the node fails, naming it, so data is lost only when the admin said
so. These rules are pure so a table test can pin every pod shape against kubectl's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from statemachine.upgrade_keys import DRAIN_SKIP_POD_LABEL
from statemachine.upgrade_views import UpgradePolicyView

Pod = Mapping[str, Any]

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
GPU_RESOURCE_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-")
_FINISHED = ("Succeeded", "Failed")


class Verdict(StrEnum):
    EVICT = "evict"
    """Remove it through the Eviction API (PodDisruptionBudgets apply)."""
    IGNORE = "ignore"
    """Not for us to remove, and never in the way: DaemonSet and mirror pods, opt-outs."""
    WAIT = "wait"
    """Already terminating: nothing to do but wait until it is gone."""
    REFUSE = "refuse"
    """The flags do not allow removing it: the node fails, naming it and why."""


@dataclass(frozen=True)
class RemovalRules:
    """The flags of ``podDeletion`` or ``drain``.

    ``honour_drain_skip``: upstream adds ``nvidia.com/gpu-driver-upgrade-drain.skip!=true``
    to the drain's pod selector only; GPU pod deletion does not look at the label.
    """

    force: bool = False
    delete_empty_dir: bool = False
    honour_drain_skip: bool = True


@dataclass(frozen=True)
class PodVerdict:
    verdict: Verdict
    why: str


def _meta(pod: Pod) -> Mapping[str, Any]:
    meta: Mapping[str, Any] = pod.get("metadata") or {}
    return meta


def pod_key(pod: Pod) -> str:
    meta = _meta(pod)
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def controller_of(pod: Pod) -> Mapping[str, Any] | None:
    """The owner reference marked ``controller: true`` (kubectl's ``GetControllerOf``)."""
    for ref in _meta(pod).get("ownerReferences") or []:
        if ref.get("controller") is True:
            return dict(ref)
    return None


def finished(pod: Pod) -> bool:
    return (pod.get("status") or {}).get("phase") in _FINISHED


def has_empty_dir(pod: Pod) -> bool:
    return any("emptyDir" in v for v in (pod.get("spec") or {}).get("volumes") or [])


def uses_gpu(pod: Pod) -> bool:
    """A container limits or requests an ``nvidia.com/gpu*`` or ``nvidia.com/mig-*`` resource."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        for section in ("limits", "requests"):
            if any(k.startswith(GPU_RESOURCE_PREFIXES) for k in resources.get(section) or {}):
                return True
    return False


def gpu_workload(pod: Pod) -> bool:
    """What the pod-deletion step targets (upstream's filter): GPU pods still running or
    about to; finished ones hold no GPU."""
    phase = (pod.get("status") or {}).get("phase")
    return phase in ("Running", "Pending") and uses_gpu(pod)


def pod_verdict(pod: Pod, rules: RemovalRules) -> PodVerdict:
    """kubectl drain's filters, in its order, with every DaemonSet ignored.

    Deviation, on purpose: a pod already terminating is waited for rather than judged
    (kubectl would refuse a terminating unmanaged pod without ``force``, failing the
    node over a pod that is going anyway).
    """
    meta = _meta(pod)
    labels = meta.get("labels") or {}
    if MIRROR_ANNOTATION in (meta.get("annotations") or {}):
        return PodVerdict(Verdict.IGNORE, "mirror pod of a static pod")
    if rules.honour_drain_skip and labels.get(DRAIN_SKIP_POD_LABEL) == "true":
        return PodVerdict(Verdict.IGNORE, f"labelled {DRAIN_SKIP_POD_LABEL}=true")
    owner = controller_of(pod)
    is_daemon = owner is not None and owner.get("kind") == "DaemonSet"
    if finished(pod):
        # kubectl removes any finished pod, even a DaemonSet's: it holds nothing.
        return PodVerdict(Verdict.EVICT, "finished")
    if is_daemon:
        return PodVerdict(Verdict.IGNORE, "managed by a DaemonSet")
    if meta.get("deletionTimestamp"):
        return PodVerdict(Verdict.WAIT, "terminating")
    if has_empty_dir(pod) and not rules.delete_empty_dir:
        return PodVerdict(
            Verdict.REFUSE, "uses emptyDir, its data would be lost; needs deleteEmptyDir"
        )
    if owner is None and not rules.force:
        return PodVerdict(
            Verdict.REFUSE, "no controller manages it, it would not come back; needs force"
        )
    return PodVerdict(Verdict.EVICT, "")


@dataclass(frozen=True)
class RemovalPlan:
    """One node's pods sorted by verdict (``namespace/name`` keys, stable order)."""

    evict: tuple[str, ...] = ()
    waiting: tuple[str, ...] = ()
    refused: tuple[tuple[str, str], ...] = ()

    @property
    def remaining(self) -> tuple[str, ...]:
        """Pods still to go before the step is done."""
        return self.evict + self.waiting

    @property
    def refusals(self) -> tuple[str, ...]:
        """``namespace/name (why)`` of each pod the flags do not allow removing."""
        return tuple(f"{key} ({why})" for key, why in self.refused)


def plan_removal(pods: Iterable[Pod], rules: RemovalRules) -> RemovalPlan:
    evict: list[str] = []
    waiting: list[str] = []
    refused: list[tuple[str, str]] = []
    for pod in sorted(pods, key=pod_key):
        verdict = pod_verdict(pod, rules)
        if verdict.verdict is Verdict.EVICT:
            evict.append(pod_key(pod))
        elif verdict.verdict is Verdict.WAIT:
            waiting.append(pod_key(pod))
        elif verdict.verdict is Verdict.REFUSE:
            refused.append((pod_key(pod), verdict.why))
    return RemovalPlan(tuple(evict), tuple(waiting), tuple(refused))


def gpu_pod_rules(policy: UpgradePolicyView) -> RemovalRules:
    """The rules for removing GPU pods (``upgradePolicy.podDeletion``): the drain's skip
    label does not protect a pod that holds the GPU."""
    deletion = policy.pod_deletion
    return RemovalRules(
        force=bool(deletion and deletion.force),
        delete_empty_dir=bool(deletion and deletion.delete_empty_dir),
        honour_drain_skip=False,
    )


def drain_rules(policy: UpgradePolicyView) -> RemovalRules:
    """The rules of ``upgradePolicy.drain``, as ``kubectl drain`` with those flags."""
    return RemovalRules(force=policy.drain.force, delete_empty_dir=policy.drain.delete_empty_dir)


def selector(value: Mapping[str, str] | str) -> str:
    """A policy pod selector as a label selector string."""
    if isinstance(value, str):
        return value.strip()
    return ",".join(f"{k}={v}" for k, v in value.items())
