"""How soon the cluster pass follows progress news (pod and DaemonSet status).

During a rollout's event storm the pass waits (``ClusterReconciler.coalesce_seconds``)
so one pass counts many events. The wait must not lengthen the end of the rollout:
once every DaemonSet we own reports all its pods ready, the pass runs at once, and
news after that waits only the least delay.
"""

from __future__ import annotations

from collections.abc import Iterable

from components.readiness import daemonset_ready
from gpuop.kube.informer import Obj

__all__ = ["LEAST_WAIT_S", "ProgressPace"]

LEAST_WAIT_S = 0.1
"""The shortest a pass ever waits for more news; also the cluster pass's least coalescing
wait (`gpuop.operator.controller.passes.cluster`), which imports it from here so the two stay
one."""


class ProgressPace:
    """Remembers only whether every owned DaemonSet was ready at its last event."""

    def __init__(self) -> None:
        self.settled = True  # no DaemonSet yet: nothing is rolling out

    def daemonsets_changed(self, daemonsets: Iterable[Obj]) -> bool:
        """Record a DaemonSet event; True when the DaemonSets just became all ready,
        which is when the pass should run at once."""
        was = self.settled
        self.settled = all(daemonset_ready(d)[0] for d in daemonsets)
        return self.settled and not was

    def wait(self, coalesced: float) -> float:
        """How long progress news waits for the pass, given the storm's wait; once the
        DaemonSets are settled, the pass's least wait."""
        return LEAST_WAIT_S if self.settled else coalesced
