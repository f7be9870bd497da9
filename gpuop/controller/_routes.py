"""What one operand pod event wakes, decided in one place.

The operator's pods cache hands every event here once (``Operator._on_pod``): the
NVIDIADriver unit only follows its driver pods (``NVIDIADrivers.follow_pod``) and
queues nothing itself, so a pod event is routed once, not once per unit that reads it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from components.driver import DAEMONSET_NAME as DRIVER_DS
from gpuop.controller._keys import CLUSTER_KEY, NVD_KEY, node_key
from gpuop.controller._nvidiadriver_status import is_policy_driver
from gpuop.controller._pods import WATCHED_APPS, PodRecord, pod_app
from gpuop.controller._rollout_view import pod_facts
from gpuop.controller._workload import HANDOVER_APPS


@dataclass(frozen=True)
class Wake:
    """The passes an event wakes: `keys` at once, the fleet pass and the cluster pass
    each on its own coalescing clock."""

    keys: tuple[str, ...] = ()
    fleet: bool = False
    """The fleet pass, coalesced (``NodeReconciler.fleet_soon``)."""
    progress: bool = False
    """The cluster pass, paced (``Operator._progress``): rollout progress to count."""

    def apply(
        self,
        add: Callable[[str], None],
        fleet_soon: Callable[[], None],
        progress: Callable[[], None],
    ) -> None:
        for key in self.keys:
            add(key)
        if self.progress:
            progress()
        if self.fleet:
            fleet_soon()


def route_pod(
    event: str,
    old: PodRecord | None,
    new: PodRecord | None,
    *,
    driver: bool,
    upgrades_queued: Callable[[], bool],
) -> Wake:
    """What an event of an operand pod wakes; `driver`: it is a driver pod (the
    ClusterPolicy's or an NVIDIADriver's). `upgrades_queued` is asked only when the
    answer matters: it reads every node."""
    pod = new or old
    assert pod is not None
    node = pod.node
    app = pod_app(pod)
    keys: list[str] = []
    if node and (driver or app in WATCHED_APPS or app in HANDOVER_APPS):
        # The node's upgrade step reads its driver and validator; its workload hand-over
        # waits for every GPU claimant's pod (driver, VFIO or vGPU manager) to go.
        keys.append(node_key(node))
    fleet = False
    if event != "MODIFIED":  # hand-over gates and the fleet budget ask only whether one is there
        if driver:
            keys.append(NVD_KEY)
            if not is_policy_driver(app):
                # The ClusterPolicy's driver waits while an NVIDIADriver's pod runs. Its own
                # pods coming and going is rollout progress: the paced pass counts it
                # (queued at once here, 1,000 creations were 1,000 passes).
                keys.append(CLUSTER_KEY)
        if (driver or (node and app == DRIVER_DS)) and upgrades_queued():
            # Only a node waiting for a slot reads whether it has a driver pod. Queued at
            # once, a fresh install's 1,000 driver pods were 1,000 fleet passes.
            fleet = True
    return Wake(tuple(keys), fleet=fleet, progress=pod_facts(old) != pod_facts(new))
