"""What each watch event wakes, decided in one place: one function per event kind.

Every watch handler of the operator (and the NVIDIADriver and GPUCluster units' own
caches, whose handlers only keep their books and hand the event on) asks one function
here which work-queue keys the event wakes, and ``EventRouter.wake`` queues them. No unit
queues anything from an event handler, so an event is routed once, not once per unit
that reads it: the NVIDIADriver unit only follows its driver pods
(``NVIDIADrivers.follow_pod``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

from components.driver import DAEMONSET_NAME as DRIVER_DS
from components.labels import is_gpu_node
from components.validator import DAEMONSET_NAME as VALIDATOR_DS
from crd import OWNER_LABEL
from gpuop.kube.informer import Obj
from gpuop.operator.controller.base.keys import (
    CLUSTER_KEY,
    GC_KEY,
    NVD_KEY,
    REMEDIATION_KEY,
    UPGRADES_KEY,
    node_key,
)
from gpuop.operator.controller.views.node_views import (
    is_ready,
    labels,
    node_fingerprint,
    node_out_of_service,
)
from gpuop.operator.controller.views.objects import generation, is_policy_driver
from gpuop.operator.controller.views.pod_records import (
    HANDOVER_APPS,
    PodRecord,
    pod_app,
)
from gpuop.operator.controller.views.remediation_views import policy_facts
from gpuop.operator.controller.views.rollout_view import pod_facts
from gpuop.operator.controller.views.wake_facts import gate_facts, rollback_facts, window_facts
from statemachine.driver_owner import NEXT_OWNER_LABEL
from statemachine.node_plan import cluster_label_facts
from statemachine.upgrade_keys import DRIVER_REVISION_LABEL, STATE_LABEL, UpgradeState, skipped


@dataclass(frozen=True)
class Wake:
    """The passes an event wakes: `keys` at once, the fleet pass and the cluster pass
    each on its own coalescing clock."""

    keys: tuple[str, ...] = ()
    """Queued at once, each once (``wake`` drops repeats)."""
    fleet: bool = False
    """The fleet pass, coalesced (``NodeReconciler.fleet_soon``)."""
    progress: bool = False
    """The cluster pass, paced (``EventRouter.progress``): rollout progress to count."""

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
    validators_read: Callable[[str], bool] = lambda node: True,
) -> Wake:
    """What an event of an operand pod wakes; `driver`: it is a driver pod (the
    ClusterPolicy's or an NVIDIADriver's). `upgrades_queued` is asked only when the
    answer matters: it reads every node; so is `validators_read` (`reads_validators`
    of the pod's node: whether its upgrade step is past rest), for a validator pod's
    event and a driver pod's that changes no fact read at rest."""
    pod = new or old
    assert pod is not None
    node = pod.node
    app = pod_app(pod)
    keys: list[str] = []
    if node and (
        (
            (driver or app == DRIVER_DS)
            and (_rest_facts(old) != _rest_facts(new) or validators_read(node))
        )
        or app in HANDOVER_APPS
        or (app == VALIDATOR_DS and validators_read(node))
    ):
        # The node's upgrade step reads its driver (at rest only what `_rest_facts`
        # keeps) and (but at rest) its validator; its workload hand-over waits for
        # every GPU claimant's pod (driver, VFIO or vGPU manager) to go.
        keys.append(node_key(node))
    fleet = False
    if (
        driver
        and event == "MODIFIED"
        and not is_policy_driver(app)
        and _serves(old) != _serves(new)
    ):
        # An NVIDIADriver's hand-over budget counts its nodes whose driver is not Ready.
        keys.append(NVD_KEY)
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


def reads_validators(node: Obj | None) -> bool:
    """Whether a node's upgrade step reads its validator pods now. Not at rest: from
    ``upgrade-done`` only a cordon the upgrade left behind (the node unschedulable) is
    resumed once the validators pass; otherwise the step reads the driver's revision and
    the node's labels alone (`statemachine.upgrade`). So a rollout's 2,000 validator pod
    events wake no node pass, and one that comes while the node is mid-upgrade does."""
    if node is None:
        return False
    state = labels(node).get(STATE_LABEL)
    unschedulable = bool((node.get("spec") or {}).get("unschedulable"))
    return state != UpgradeState.UPGRADE_DONE.value or unschedulable


def _rest_facts(pod: PodRecord | None) -> Any:
    """What the upgrade step at rest (``upgrade-done``, schedulable: not
    `reads_validators`) reads of a driver pod: whether one is there, which, and its
    revision and install digest, against the DaemonSet's newest. Its readiness and
    restarts are read only mid-upgrade, so a rollout's driver pods turning Ready wake
    no node pass (1,000 at 1,000 nodes)."""
    if pod is None:
        return None
    return (
        pod.key,
        pod.packed_uid,
        pod.node,
        pod.deleting,
        pod.labels.get(DRIVER_REVISION_LABEL),
        pod.config_digest,
    )


def _serves(pod: PodRecord | None) -> bool:
    """Whether a driver pod drives its node: Ready and not terminating."""
    return pod is not None and pod.ready and not pod.deleting


def wake(*keys: str, fleet: bool = False, progress: bool = False) -> Wake:
    """A `Wake` naming each key once, in the order first named."""
    return Wake(tuple(dict.fromkeys(keys)), fleet=fleet, progress=progress)


def gpu_node_keys(nodes: Iterable[tuple[str, Obj]]) -> list[str]:
    """The ``node/<name>`` key of every GPU node among ``(name, node)`` pairs."""
    return [node_key(name) for name, node in nodes if is_gpu_node(labels(node))]


def route_node(
    event: str,
    old: Obj | None,
    new: Obj | None,
    *,
    remediation_reads: Callable[[Obj | None, Obj | None], bool],
    labels_awaited: bool,
) -> Wake:
    """What a node event wakes: its node pass, the NVIDIADriver pass (owners), the
    remediation pass when it reads what changed, the fleet pass when a budget fact
    changed, and the cluster pass when a GPU fact changed, or (paced) when new
    workloads wait for deploy labels (``labels_awaited``) and the labels changed."""
    node = new or old
    assert node is not None
    if node_fingerprint(old) == node_fingerprint(new):
        return Wake()
    keys = [node_key(node["metadata"]["name"])]
    if remediation_reads(old, new):
        keys.append(REMEDIATION_KEY)
    keys.append(NVD_KEY)
    fleet = event != "MODIFIED" or budget_facts(old) != budget_facts(new)
    progress = False
    if event != "MODIFIED" or gpu_facts(old) != gpu_facts(new):
        keys.append(CLUSTER_KEY)
    elif labels_awaited and old is not None and new is not None and labels(old) != labels(new):
        progress = True  # new workloads wait for the deploy labels: count them again
    return wake(*keys, fleet=fleet, progress=progress)


def route_policy(
    event: str, old: Obj | None, new: Obj | None, nodes: Iterable[tuple[str, Obj]]
) -> Wake:
    """What a ClusterPolicy event wakes; a status-only change (most likely our own
    write) wakes only the passes that read its annotations. Its enabled components
    decide each GPU node's deploy labels, so a spec change wakes every GPU node."""
    keys: list[str] = []
    if policy_facts(old) != policy_facts(new):
        keys.append(REMEDIATION_KEY)
    if gate_facts(old) != gate_facts(new) or window_facts(old) != window_facts(new):
        keys.append(UPGRADES_KEY)  # the resume annotation, the gate's record, the windows
    if rollback_facts(old) != rollback_facts(new):
        keys.append(CLUSTER_KEY)  # a rollback record the driver's templates follow
    if (
        event == "MODIFIED"
        and old is not None
        and new is not None
        and generation(old) == generation(new)
        and old["metadata"].get("labels") == new["metadata"].get("labels")
    ):
        return wake(*keys)
    # A ClusterPolicy beside a GPUCluster is a conflict: the GPUCluster pass says so.
    keys += [CLUSTER_KEY, UPGRADES_KEY, NVD_KEY, GC_KEY, *gpu_node_keys(nodes)]
    return wake(*keys)


def _spec_changed(event: str, old: Obj | None, new: Obj | None, *fields: str) -> bool:
    """Whether an event changes more than status: ``generation`` or one of ``fields``
    of the metadata moved (a MODIFIED event that moves neither is most likely our own
    status write)."""
    if event != "MODIFIED" or old is None or new is None:
        return True
    return any(old["metadata"].get(f) != new["metadata"].get(f) for f in ("generation", *fields))


def route_nvidiadriver(
    event: str, old: Obj | None, new: Obj | None, nodes: Iterable[tuple[str, Obj]] = ()
) -> Wake:
    """An NVIDIADriver changed (not only its status): the NVIDIADriver pass, and the node
    passes of the nodes it owns or takes (its ``autoUpgrade`` decides their driver
    manager's hand-off annotation). Its rollout gate's annotations (the resume, the
    record) and its maintenance windows wake the fleet pass."""
    gated = gate_facts(old) != gate_facts(new) or window_facts(old) != window_facts(new)
    gate = [UPGRADES_KEY] if gated else []
    if rollback_facts(old) != rollback_facts(new):
        gate.append(NVD_KEY)  # a rollback record its pools' templates follow
    if not _spec_changed(event, old, new, "deletionTimestamp"):
        return wake(*gate)
    obj = new or old
    assert obj is not None
    name = obj["metadata"]["name"]
    owned = [
        node_key(n)
        for n, node in nodes
        if name in (labels(node).get(OWNER_LABEL), labels(node).get(NEXT_OWNER_LABEL))
    ]
    return wake(NVD_KEY, *gate, *owned)


def route_nvidiadrivers_listed(nodes: Iterable[tuple[str, Obj]]) -> Wake:
    """The NVIDIADriver cache listed: the passes that waited for it (its own, the fleet
    pass and every GPU node's)."""
    return wake(NVD_KEY, UPGRADES_KEY, *gpu_node_keys(nodes))


def route_gpucluster_presence(nodes: Iterable[tuple[str, Obj]]) -> Wake:
    """A GPUCluster came, went or is deleting (or its cache listed, which the cluster
    pass and the node labels wait for): the ClusterPolicy's conflict, every node's
    labels, and the NVIDIADrivers (beside a GPUCluster they install its drivers)."""
    return wake(CLUSTER_KEY, NVD_KEY, *(node_key(name) for name, _ in nodes))


def route_gpucluster(
    event: str, old: Obj | None, new: Obj | None, nodes: Iterable[tuple[str, Obj]]
) -> Wake:
    """A GPUCluster changed (not only its status): its pass, and what its presence
    decides."""
    if not _spec_changed(event, old, new, "deletionTimestamp", "finalizers"):
        return Wake()
    return wake(GC_KEY, *route_gpucluster_presence(nodes).keys)


def route_gpucluster_object(event: str, old: Obj | None, new: Obj | None) -> Wake:
    """One of the GPUCluster's objects changed: its pass puts it back or counts it."""
    return wake(GC_KEY)


def route_owned(
    event: str,
    old: Obj | None,
    new: Obj | None,
    *,
    daemonsets_settled: bool,
    driver_object: bool,
) -> Wake:
    """An object the ClusterPolicy owns changed: the cluster pass at once when it was
    deleted (put back) or the DaemonSets just became all ready (``daemonsets_settled``:
    the rollout may be done), else paced (mostly DaemonSet status during a rollout);
    a driver object's also wakes the NVIDIADriver pass (status, and the hand-over)."""
    keys: list[str] = []
    if daemonsets_settled:
        keys.append(CLUSTER_KEY)
    if event == "DELETED":
        keys.append(CLUSTER_KEY)
    if driver_object:
        keys.append(NVD_KEY)
    # A driver DaemonSet's new template keys the rollout gate (its install digest): the
    # fleet pass reads it, and its revision's event may have been routed before it.
    fleet = driver_object and event != "DELETED" and _generation(old) != _generation(new)
    return wake(*keys, progress=event != "DELETED", fleet=fleet)


def route_revision(
    event: str,
    old: Obj | None,
    new: Obj | None,
    *,
    driver: bool,
    nodes: Iterable[tuple[str, Obj]],
    driver_nodes: Collection[str],
) -> Wake:
    """A driver DaemonSet's new revision may start upgrades on the GPU nodes whose
    upgrade step reads it (:func:`reads_revision`). Other operands' revisions start
    nothing (their DaemonSets roll by themselves): a fresh install creates eight, and
    each would wake every node pass."""
    if not driver:
        return Wake()
    keys = [
        node_key(name)
        for name, node in nodes
        if is_gpu_node(labels(node)) and reads_revision(name, node, driver_nodes)
    ]
    return wake(UPGRADES_KEY, *keys)


def reads_revision(name: str, node: Obj, driver_nodes: Collection[str]) -> bool:
    """Whether a node's upgrade step reads its driver DaemonSet's newest revision now:
    it compares a driver pod's revision with it (``driver_nodes``: the nodes with a
    driver pod in the cache), and a node mid-upgrade or failed reads it for its retry.
    A node with no driver pod at rest (or not enrolled yet) does not: the pod the
    DaemonSet creates is the newest, and its own event wakes the node. So a fresh
    install's driver revision wakes no node pass (it woke 1,000 at 1,000 nodes)."""
    if name in driver_nodes:
        return True
    return labels(node).get(STATE_LABEL) not in (None, "", UpgradeState.UPGRADE_DONE.value)


def route_site_config() -> Wake:
    """A ConfigMap the driver's site configuration names changed: both driver renders."""
    return wake(CLUSTER_KEY, NVD_KEY)


def _generation(obj: Obj | None) -> Any:
    return None if obj is None else obj["metadata"].get("generation")


def budget_facts(node: Obj | None) -> Any:
    """What ``Upgrades.grant`` reads of a node."""
    if node is None:
        return None
    node_labels = labels(node)
    return (
        node_labels.get(STATE_LABEL),
        node_labels.get(OWNER_LABEL),  # which budget the node counts in
        node_labels.get(NEXT_OWNER_LABEL),
        skipped(node_labels),
        is_gpu_node(node_labels),
        node["spec"].get("unschedulable", False),
        is_ready(node),
    )


def gpu_facts(node: Obj | None) -> Any:
    """What the cluster pass reads of a node."""
    if node is None:
        return None
    return (*cluster_label_facts(labels(node)), node_out_of_service(node))
