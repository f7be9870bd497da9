"""Which operand pods of a lost node the operator may force-delete: only those that
Kubernetes' own pod garbage collector would, never a driver pod, a few per pass.

A node whose kubelet stops reporting (a network partition, a hung host) is only
*tainted* by the node lifecycle controller; its pods stay, with a stale phase, until the
kubelet returns and settles them. Kubernetes force-deletes (grace period 0) in two
cases only, both in pod garbage collection:

- the Node object is gone: its pods are orphans, deleted after a short quarantine. The
  operator does nothing there (pod GC needs no help, and a GPU node that is no longer
  in the cache is no longer ours to look at);
- the node is not Ready and an administrator tainted it ``node.kubernetes.io/out-of-service``
  (they vouch that it is shut down): pods already *terminating* there are deleted.

This module keeps to the second rule. It mostly repeats what pod GC does anyway (every
20 s), but a rolling update of an operand DaemonSet with ``maxUnavailable: 1`` is held
by such a pod, and the cluster pass acts as soon as the taint appears. Nothing is based
on a pod's phase: a partitioned kubelet's phase is stale, and ``Pending`` includes pods
whose init containers run. A pod that is not terminating is never chosen, even on an
out-of-service node: the taint manager and the DaemonSet controller evict it there
(gracefully) unless it tolerates the taint, and a tolerated pod is one Kubernetes
leaves alone. Driver pods are never chosen: a driver container whose deletion no
kubelet confirmed may still hold the kernel modules, and its replacement must not load
them beside it when the node returns (the upgrade machine alone moves drivers).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

OUT_OF_SERVICE_TAINT = "node.kubernetes.io/out-of-service"
"""Set by an administrator on a node known to be shut down (Kubernetes' non-graceful
node shutdown); never set by Kubernetes itself."""

MAX_RELEASED_PER_PASS = 10
"""At most this many force deletions per cluster pass. Each is an API write inside the
pass, which also writes status; an administrator marking a rack of nodes out of service
at once must not turn one pass into hundreds of deletions (pod GC removes the same pods
anyway, so going slower loses nothing). The rest wait for the next pass, which the
deletions themselves wake (and a timer, should they not)."""


def out_of_service(ready: str | None, taints: Sequence[Mapping[str, Any]]) -> bool:
    """Pod GC's test: the node is not Ready (False, Unknown or never reported) and
    carries the out-of-service taint, whatever its effect."""
    return ready != "True" and any(t.get("key") == OUT_OF_SERVICE_TAINT for t in taints)


@dataclass(frozen=True)
class StalePod:
    """What the choice reads of one operand pod bound to an out-of-service node."""

    name: str
    namespace: str
    uid: str
    node: str
    terminating: bool
    """``metadata.deletionTimestamp`` is set (a graceful deletion no kubelet confirmed)."""
    driver: bool
    """A pod of any driver DaemonSet (the ClusterPolicy's or an NVIDIADriver's)."""


def releasable(pod: StalePod) -> bool:
    """A pod on an out-of-service node that pod GC would force-delete and that is not
    a driver pod."""
    return pod.terminating and not pod.driver


@dataclass(frozen=True)
class ReleasePlan:
    """The pods to force-delete in this pass, and how many wait for a later one."""

    delete: tuple[StalePod, ...]
    left: int

    def by_node(self) -> dict[str, list[StalePod]]:
        """The chosen pods grouped by node (one Event per node)."""
        grouped: dict[str, list[StalePod]] = {}
        for pod in self.delete:
            grouped.setdefault(pod.node, []).append(pod)
        return grouped


def plan_release(pods: Iterable[StalePod], cap: int = MAX_RELEASED_PER_PASS) -> ReleasePlan:
    """The releasable ``pods`` (all bound to out-of-service nodes), at most ``cap``, in
    a stable order (node, then name) so a restarted operator picks the same ones."""
    chosen = sorted((p for p in pods if releasable(p)), key=lambda p: (p.node, p.name))
    return ReleasePlan(delete=tuple(chosen[:cap]), left=max(0, len(chosen) - cap))
