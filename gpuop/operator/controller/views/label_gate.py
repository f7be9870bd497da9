"""New workloads wait for the deploy labels (at most ``LABEL_WAIT_MAX_S``).

A DaemonSet selects its nodes by the ``nvidia.com/gpu.deploy.*`` labels the node passes
write. Created while those labels are still being written, kube-controller-manager
syncs every such DaemonSet again for each node labelled (a sync reads every node and
every pod of the DaemonSet), and starts a fresh burst of pod creations for the few nodes
labelled since; the label patches themselves queue behind the rollout's requests. In one
1,000-GPU-node run on the local control plane, labelling first finished the labels at
5.5 s instead of 22.9 s and the control plane used 10 CPU seconds less (within the
run-to-run spread for time to ready). Upstream labels the GPU nodes before it applies
any state.

So an object that runs pods and does not exist yet is created once no GPU node is
waiting for a deploy label, or after ``LABEL_WAIT_MAX_S`` (a node whose label patch the
API server keeps refusing must not hold the fleet back). Objects that exist are updated
at once, and a node that joins later never holds anything back.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from components.labels import node_label_changes
from crd import ClusterPolicySpec
from gpuop.kube.informer import Obj
from gpuop.operator.controller.views.node_views import labels
from gpuop.operator.controller.views.objects import RUNS_PODS

LABEL_WAIT_MAX_S = 60.0
"""The longest new workloads wait for the deploy labels: labelling 3,000 nodes took
about 20 s on the local control plane; a refused patch must not hold more."""
RECHECK_S = 0.5
"""How often a held pass counts again: the node passes store their own label patches
in the cache without an event, so nothing else would wake the cluster pass."""


def adds_labels(node: Obj, spec: ClusterPolicySpec) -> bool:
    """Does the node pass still have a label to add to this node?"""
    return any(value is not None for value in node_label_changes(labels(node), spec).values())


@dataclass
class LabelGate:
    """Decides, per pass, which new workloads to hold back; remembers only since when
    it has held for a policy generation (a restarted operator waits at most once more)."""

    clock: Callable[[], float] = time.monotonic
    max_wait_s: float = LABEL_WAIT_MAX_S
    _since: dict[tuple[str, int | None], float] = field(default_factory=dict)
    _memo: tuple[tuple[int, tuple[str, int | None]], int] | None = None
    waiting_nodes: int = 0
    """GPU nodes still waiting for a deploy label at the last pass that held anything."""

    def hold(
        self,
        objects: Sequence[Obj],
        exists: Callable[[Obj], bool],
        gpu_nodes: Sequence[Obj],
        spec: ClusterPolicySpec,
        policy: tuple[str, int | None],
        nodes_version: int,
    ) -> tuple[list[Obj], float | None]:
        """The new workloads to hold back this pass, and when to look again (None: no
        deadline runs). ``policy`` is (uid, generation); ``nodes_version`` keys the
        count, so passes between node changes do not scan the fleet again."""
        new = [o for o in objects if o["kind"] in RUNS_PODS and not exists(o)]
        if not new:
            self._since.pop(policy, None)
            self.waiting_nodes = 0
            return [], None
        key = (nodes_version, policy)
        if self._memo is None or self._memo[0] != key:
            self._memo = (key, sum(1 for n in gpu_nodes if adds_labels(n, spec)))
        self.waiting_nodes = self._memo[1]
        if not self.waiting_nodes:
            self._since.pop(policy, None)
            return [], None
        now = self.clock()
        since = self._since.setdefault(policy, now)
        left = since + self.max_wait_s - now
        if left <= 0:
            return [], None
        return new, min(left, RECHECK_S)
