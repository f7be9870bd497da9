"""A node's workload on the node pass: the GPU hand-over hold and the Events about it.

The label pass (`components.labels`) gives a node its workload's deploy labels; this
module carries out `statemachine.workload_handover` on that patch: a claimant's label
(driver, VFIO manager, vGPU manager) is left out while another claimant's pod, or for
a VM host a container's GPU pod, is still on the node. What the machine reads comes
from the operand pods cache, except the GPU workload pods, which are listed (one GET on
the node) only while a VM claimant's label is held; those are not watched, so the node
is looked at again every `GPU_PODS_RECHECK_S` until they are gone.

Events tell the administrator what happens, once per change: a node whose
`nvidia.com/gpu.workload.config` names no workload (Warning, with the fallback), and a
hand-over waiting or done. The memo that keeps them from repeating on every pass is
only that; every decision is read from the cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from components.driver import COMPONENT_POD_LABEL
from components.driver import DAEMONSET_NAME as DRIVER_DS
from components.keys import TRUE
from components.labels import node_workload
from components.vfio_manager import DAEMONSET_NAME as VFIO_MANAGER_APP
from components.vgpu_manager import DAEMONSET_NAME as VGPU_MANAGER_APP
from crd import ClusterPolicySpec
from gpuop.kube.informer import Informer, Obj
from gpuop.log import get_logger
from gpuop.operator.controller.views.node_views import labels
from gpuop.operator.controller.views.pod_records import PodRecord, is_driver_pod, trim_pod
from gpuop.operator.controller.writers.eviction import POD, Emptying
from gpuop.operator.events import EventRecorder
from statemachine.eviction import gpu_workload
from statemachine.workload_handover import (
    DRIVER,
    GPU_CLAIMS,
    GPU_PODS_LEAVING,
    VFIO_MANAGER,
    VGPU_MANAGER,
    HandoverStep,
    HandoverView,
    handover_step,
    held,
    pending_claim,
)

log = get_logger(__name__)

VGPU_HOST_MANAGER_COMPONENT = "nvidia-vgpu-host-manager"
"""An NVIDIADriver with ``driverType: vgpu-host-manager``: the vGPU manager of its nodes."""
GPU_PODS_RECHECK_S = 5.0
"""How often a node held for container GPU pods is looked at again (they are not
watched: only the operator's own pods are)."""


class WorkloadHandovers:
    """The node pass's hand-over hold and workload Events."""

    def __init__(
        self,
        pods: Informer[PodRecord],
        emptying: Emptying,
        events: EventRecorder,
    ) -> None:
        self._pods = pods
        self._emptying = emptying
        self._events = events
        #: Per node, what was last said in an Event (only to say it once).
        self._said_invalid: dict[str, str] = {}
        self._said_step: dict[str, str] = {}

    def forget(self, node: str) -> None:
        self._said_invalid.pop(node, None)
        self._said_step.pop(node, None)

    async def report_workload(self, node: Obj, spec: ClusterPolicySpec | None) -> None:
        """A Warning Event naming a node whose workload label is invalid, once per value."""
        name = node["metadata"]["name"]
        workload = node_workload(labels(node), spec)
        problem = workload.problem
        if problem is None:
            self._said_invalid.pop(name, None)
            return
        assert workload.invalid_value is not None
        if self._said_invalid.get(name) == workload.invalid_value:
            return
        self._said_invalid[name] = workload.invalid_value
        log.warning("invalid GPU workload", node=name, problem=problem)
        await self._events.record(
            _node_ref(node), "GPUWorkloadConfigInvalid", f"node {name}: {problem}", warning=True
        )

    async def hold(
        self, node: Obj, changes: Mapping[str, str | None], target: str
    ) -> tuple[dict[str, str | None], HandoverStep | None]:
        """The label patch to write this pass, and the hand-over step (None: no claimant
        label pending).

        Another claimant counts as present while its pod is on the node (or bound for
        it) and while its own label is still there: its DaemonSet may have placed a pod
        the pods cache has not shown yet, so the patch that removes one claimant's label
        never grants another's. A claim the cache would grant is confirmed by reading
        the node's pods from the API server first (the caches trail each other: a driver
        pod bound a moment before the node's switch can still be missing)."""
        claim = pending_claim(changes)
        name = node["metadata"]["name"]
        if claim is None:
            self._said_step.pop(name, None)
            return dict(changes), None
        present = self._claimants_on(name) | _labelled(labels(node), claim)
        others = present - {claim}
        gpu_pods: tuple[str, ...] = ()
        if not (others if claim == DRIVER else others & {DRIVER}):  # nothing holds it yet
            claimants, found = await self._on_node_now(name)
            present |= claimants
            gpu_pods = found if claim != DRIVER else ()
        step = handover_step(HandoverView(claim, present, gpu_pods))
        await self._report(node, target, claim, step)
        return held(changes, step), step

    def _claimants_on(self, node: str) -> frozenset[str]:
        """The GPU claimants with a pod on ``node`` (terminating ones included: they still
        hold the GPUs), each known by what it is, never by a DaemonSet selector: the
        hand-over's own label patch takes the node out of the driver DaemonSet's
        selection (``nvidia.com/gpu.deploy.driver``) while its pod is still there."""
        return frozenset(
            claimant
            for pod in self._pods.indexed(node)
            if (claimant := claimant_of(pod)) is not None
        )

    async def _on_node_now(self, node: str) -> tuple[frozenset[str], tuple[str, ...]]:
        """The claimants and container GPU pods the API server has on ``node`` now: its
        pods, and our unbound pods whose node affinity names it (a DaemonSet's pod is
        created unbound and bound by the scheduler)."""
        pods = await self._emptying.node_pods(node)
        ours = self._emptying.namespace
        unbound = await self._emptying.rest.list(POD, ours, field_selector="spec.nodeName=")
        claimants = frozenset(
            claimant
            for p in [*pods, *(p for p in unbound if _bound_for(p, node))]
            if p["metadata"].get("namespace") == ours
            and (claimant := claimant_of(trim_pod(p))) is not None
        )
        gpu = tuple(
            sorted(
                f"{p['metadata'].get('namespace')}/{p['metadata'].get('name')}"
                for p in pods
                if gpu_workload(p) and p["metadata"].get("namespace") != ours
            )
        )
        return claimants, gpu

    async def _report(self, node: Obj, target: str, claim: str, step: HandoverStep) -> None:
        """An Event when the hand-over starts waiting for something new, and when it ends."""
        name = node["metadata"]["name"]
        said = self._said_step.get(name)
        if not step.hold:
            self._said_step.pop(name, None)
            if said is not None:  # it was held: a hand-over, not an ordinary labelling
                words = f"node {name} ({target}): GPUs handed to the {claim}"
                log.info("GPU workload handed over", node=name, workload=target, claimant=claim)
                await self._events.record(_node_ref(node), "GPUWorkloadHandedOver", words)
            return
        waiting = ", ".join(step.waiting_for)
        key = f"{step.state}: {waiting}"
        if said == key:
            return
        self._said_step[name] = key
        words = f"node {name} switches to {target}: the {claim} waits ({step.state}) for {waiting}"
        pods = step.state == GPU_PODS_LEAVING
        if pods:
            words += "; the operator removes no workload: drain the node to go on"
        log.info("GPU workload hand-over waits", node=name, state=step.state, waiting=waiting)
        await self._events.record(_node_ref(node), "GPUWorkloadHandover", words, warning=pods)


def claimant_of(pod: PodRecord) -> str | None:
    """Which GPU claimant a pod is: any driver pod (the ClusterPolicy's, a precompiled
    pool's or an NVIDIADriver's, by its component label), a VFIO manager, or a vGPU
    manager (the ClusterPolicy's, or an NVIDIADriver's ``vgpu-host-manager`` driver)."""
    component = pod.labels.get(COMPONENT_POD_LABEL)
    if component == VGPU_HOST_MANAGER_COMPONENT or pod.app == VGPU_MANAGER_APP:
        return VGPU_MANAGER
    if is_driver_pod(pod) or pod.app == DRIVER_DS:
        return DRIVER
    if pod.app == VFIO_MANAGER_APP:
        return VFIO_MANAGER
    return None


def _labelled(node_labels: Mapping[str, str], claim: str) -> frozenset[str]:
    """The other claimants whose deploy label is on the node (``true``)."""
    return frozenset(
        c for key, c in GPU_CLAIMS.items() if c != claim and node_labels.get(key) == TRUE
    )


def _bound_for(pod: Obj, node: str) -> bool:
    """Whether an unbound pod may only go to ``node``: a DaemonSet pod's node affinity
    names it (``matchFields`` on ``metadata.name``)."""
    affinity = ((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    return any(
        field.get("key") == "metadata.name" and node in (field.get("values") or ())
        for term in required.get("nodeSelectorTerms") or ()
        for field in term.get("matchFields") or ()
    )


def _node_ref(node: Obj) -> dict[str, Any]:
    meta = node["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": meta["name"], "uid": meta.get("uid")},
    }
