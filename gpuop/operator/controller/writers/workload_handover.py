"""A node's workload on the node pass: what the GPU hand-over reads, and the memo of
what its Events said.

The label pass (`components.labels`) gives a node its workload's deploy labels; the
node pass's plan (`statemachine.node_plan`) carries out `statemachine.workload_handover`
on that patch: a claimant's label (driver, VFIO manager, vGPU manager) is left out
while another claimant's pod, or for a VM host a container's GPU pod, is still on the
node. What the machine reads comes from the operand pods cache (``claimants_on``),
except what only the API server shows yet: the node's pods (its container GPU pods)
and our pods bound for it (``claimants_now``), read only while nothing in the caches
holds the claim; GPU workload pods are not watched, so the node is looked at again
every `GPU_PODS_RECHECK_S` until they are gone.

Events tell the administrator what happens, once per change: a node whose
`nvidia.com/gpu.workload.config` names no workload (Warning, with the fallback), and a
hand-over waiting or done. The memo that keeps them from repeating on every pass is
only that (``said``, ``remember``); every decision is read from the cluster.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from components.driver import COMPONENT_POD_LABEL
from components.driver import DAEMONSET_NAME as DRIVER_DS
from components.vfio_manager import DAEMONSET_NAME as VFIO_MANAGER_APP
from components.vgpu_manager import DAEMONSET_NAME as VGPU_MANAGER_APP
from gpuop.kube.informer import Informer, Obj
from gpuop.log import get_logger
from gpuop.operator.controller.views.pod_records import PodRecord, is_driver_pod, trim_pod
from gpuop.operator.controller.writers.eviction import POD, Emptying
from statemachine import node_plan
from statemachine.workload_handover import (
    CLAIM_SETTLE_S,
    DRIVER,
    GPU_CLAIMS,
    VFIO_MANAGER,
    VGPU_MANAGER,
)

log = get_logger(__name__)

VGPU_HOST_MANAGER_COMPONENT = "nvidia-vgpu-host-manager"
"""An NVIDIADriver with ``driverType: vgpu-host-manager``: the vGPU manager of its nodes."""
GPU_PODS_RECHECK_S = node_plan.GPU_PODS_RECHECK_S
"""How often a node held for container GPU pods is looked at again (they are not
watched: only the operator's own pods are)."""


class WorkloadHandovers:
    """What the node pass's hand-over reads (claimants, per the cache and the API), and
    the memo of its workload Events. ``events`` is the recorder they go to (the node
    pass's writer records them)."""

    def __init__(
        self,
        pods: Informer[PodRecord],
        emptying: Emptying,
    ) -> None:
        self._pods = pods
        self._emptying = emptying
        #: Per node, what was last said in an Event (only to say it once).
        self._said_invalid: dict[str, str] = {}
        self._said_step: dict[str, str] = {}
        #: Per node, when our patch last took a claimant's label off it (monotonic):
        #: only to hold the next claim for `CLAIM_SETTLE_S`. A restarted operator
        #: has none; its own start is a longer wait than the settle.
        self._released: dict[str, float] = {}

    def forget(self, node: str) -> None:
        self._said_invalid.pop(node, None)
        self._said_step.pop(node, None)
        self._released.pop(node, None)

    def patched(self, node: str, labels: Mapping[str, str | None]) -> None:
        """Note a label patch written to ``node``: one that removes a claimant's label
        starts the settle."""
        if any(labels.get(key, "") is None for key in GPU_CLAIMS):
            self._released[node] = time.monotonic()

    def claim_settle_s(self, node: str) -> float:
        """Seconds before another claimant may be granted ``node`` (0: now)."""
        released = self._released.get(node)
        if released is None:
            return 0.0
        left = released + CLAIM_SETTLE_S - time.monotonic()
        if left <= 0:
            del self._released[node]
            return 0.0
        return left

    # ------------------------------------------------------- the node pass
    def said(self, node: str) -> tuple[str | None, str | None]:
        """What was last said of ``node``: its invalid workload value, its hand-over step."""
        return self._said_invalid.get(node), self._said_step.get(node)

    def remember(self, node: str, invalid: str | None, step: str | None) -> None:
        """What the node pass's plan says was said last (None: nothing)."""
        for memo, value in ((self._said_invalid, invalid), (self._said_step, step)):
            if value is None:
                memo.pop(node, None)
            else:
                memo[node] = value

    async def claimants_now(self, node: str, pods: list[Obj]) -> frozenset[str]:
        """The claimants the API server has on ``node`` now: of its ``pods`` (as listed),
        and of our unbound pods whose node affinity names it."""
        ours = self._emptying.namespace
        unbound = await self._emptying.rest.list(POD, ours, field_selector="spec.nodeName=")
        return frozenset(
            claimant
            for p in [*pods, *(p for p in unbound if _bound_for(p, node))]
            if p["metadata"].get("namespace") == ours
            and (claimant := claimant_of(trim_pod(p))) is not None
        )

    def claimants_on(self, node: str) -> frozenset[str]:
        """The GPU claimants with a pod on ``node`` (terminating ones included: they still
        hold the GPUs), each known by what it is, never by a DaemonSet selector: the
        hand-over's own label patch takes the node out of the driver DaemonSet's
        selection (``nvidia.com/gpu.deploy.driver``) while its pod is still there."""
        return frozenset(
            claimant
            for pod in self._pods.indexed(node)
            if (claimant := claimant_of(pod)) is not None
        )


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
