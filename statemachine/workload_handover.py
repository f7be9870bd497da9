"""Handing a node's GPUs from one workload to another: never two drivers on one GPU.

Three operands take a node's GPUs for themselves: the NVIDIA driver (containers), the
VFIO manager (binds them to `vfio-pci` for passthrough VMs) and the vGPU manager (the
vGPU host driver). When a node's workload changes (`nvidia.com/gpu.workload.config`,
or `sandboxWorkloads` turned on or off) the label pass removes the old workload's deploy
labels and adds the new one's in one patch; that patch may *remove* a claimant's label
at once, but it sets the new claimant's label (`GPU_CLAIMS`) only once nothing of the
old workload still uses the GPUs:

1. `driver-leaving`: the NVIDIA driver pod is gone from the node (its DaemonSet stops
   selecting the node when its deploy label goes; its pod unloads the driver as it ends);
2. `gpu-pods-leaving`: no container workload holds a GPU there (Running or Pending pods
   requesting `nvidia.com/gpu` or MIG devices). The operator removes none of them: the
   device plugin has left with its label, so no new one is admitted, and the
   administrator empties the node (`kubectl drain` with their own flags) when it is
   time, told by an Event naming the pods;
3. `vm-manager-leaving`: no other VM workload's claimant (VFIO or vGPU manager) pod is
   left, so a GPU bound to `vfio-pci` or carved into vGPUs is released first;
4. `claiming`: the new claimant's label is written in this pass.

Steps that do not apply to the target are passed at once (a node going back to
containers waits only for the VM managers). The machine holds no memory: each pass
builds the view from the caches and runs it from `serving`, so a restarted operator
finds the same place; the held label itself is the record (the node's other labels
already name the new workload).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from transitions import EventData

from components.keys import (
    DEPLOY_DRIVER_LABEL,
    DEPLOY_VFIO_MANAGER_LABEL,
    DEPLOY_VGPU_MANAGER_LABEL,
    TRUE,
)
from statemachine._fsm import MachineDef, SharedMachine, StateDef, TransitionDef, named

DRIVER = "driver"
VFIO_MANAGER = "vfio-manager"
VGPU_MANAGER = "vgpu-manager"

CLAIM_SETTLE_S = 3.0
"""After our patch takes a claimant's deploy label off a node, another claimant's label is
granted no sooner than this. kube-controller-manager's DaemonSet controller may still
create a pod for the claimant it last saw selecting the node (its node cache behind our
patch), after the API read that found no claimant there: a chaos run caught a driver pod
created two revisions after our removal and a vGPU manager granted beside it."""

GPU_CLAIMS: Mapping[str, str] = {
    DEPLOY_DRIVER_LABEL: DRIVER,
    DEPLOY_VFIO_MANAGER_LABEL: VFIO_MANAGER,
    DEPLOY_VGPU_MANAGER_LABEL: VGPU_MANAGER,
}
"""The deploy labels whose operand takes the node's GPUs, to the claimant's name."""

SERVING = "serving"
DRIVER_LEAVING = "driver-leaving"
GPU_PODS_LEAVING = "gpu-pods-leaving"
VM_MANAGER_LEAVING = "vm-manager-leaving"
CLAIMING = "claiming"
CLAIM_SETTLING = "claim-settling"
"""Not a state of the machine: the node pass holds a free claim for `CLAIM_SETTLE_S`
after a claimant's label left the node."""
HANDOVER_STATES = (SERVING, DRIVER_LEAVING, GPU_PODS_LEAVING, VM_MANAGER_LEAVING, CLAIMING)


@dataclass(frozen=True)
class HandoverView:
    """One node, as the caches show it, for a claim label the label pass would set."""

    claim: str | None
    """The claimant the pass would give the GPUs to (`GPU_CLAIMS` value); None: none."""
    claimant_pods: frozenset[str] = frozenset()
    """The claimants with a pod on the node (terminating ones included: a pod holds the
    GPU until it is gone)."""
    gpu_pods: tuple[str, ...] = ()
    """Container workload pods holding GPUs on the node (`namespace/name`)."""


@dataclass(frozen=True)
class HandoverStep:
    """Where the node's hand-over stands after one view."""

    state: str
    waiting_for: tuple[str, ...] = ()
    """What the node waits for (pods, or claimant operands), for the log and Event."""

    @property
    def hold(self) -> bool:
        """The claim label must stay off the node this pass."""
        return self.state not in (SERVING, CLAIMING)


def _view(event: EventData) -> HandoverView:
    model = event.model
    assert isinstance(model, _Model)
    return model.view


def _others(view: HandoverView, claimants: tuple[str, ...]) -> set[str]:
    return {c for c in claimants if c != view.claim and c in view.claimant_pods}


def _claim_pending(event: EventData) -> bool:
    return _view(event).claim is not None


def _driver_gone(event: EventData) -> bool:
    return not _others(_view(event), (DRIVER,))


def _gpu_pods_gone(event: EventData) -> bool:
    view = _view(event)
    return view.claim == DRIVER or not view.gpu_pods


def _vm_managers_gone(event: EventData) -> bool:
    return not _others(_view(event), (VFIO_MANAGER, VGPU_MANAGER))


def _definition() -> MachineDef:
    chain = (
        (DRIVER_LEAVING, GPU_PODS_LEAVING, named("driver_pod_gone", _driver_gone)),
        (GPU_PODS_LEAVING, VM_MANAGER_LEAVING, named("no_gpu_workload_pods", _gpu_pods_gone)),
        (VM_MANAGER_LEAVING, CLAIMING, named("other_vm_manager_gone", _vm_managers_gone)),
    )
    transitions = [
        TransitionDef(
            "switch",
            (SERVING,),
            DRIVER_LEAVING,
            conditions=(named("claim_label_pending", _claim_pending),),
        ),
        *(TransitionDef("advance", (s,), d, conditions=(guard,)) for s, d, guard in chain),
    ]
    return MachineDef(
        name="workload-handover",
        states=tuple(StateDef(name) for name in HANDOVER_STATES),
        transitions=tuple(transitions),
        initial=SERVING,
    )


WORKLOAD_HANDOVER_DEFINITION = _definition()
_MACHINE = SharedMachine(WORKLOAD_HANDOVER_DEFINITION)


class _Model:
    state: str
    trigger: Any

    def __init__(self, view: HandoverView) -> None:
        self.view = view


def pending_claim(changes: Mapping[str, str | None]) -> str | None:
    """The claimant a label patch would give the node's GPUs to, if it sets one's label."""
    for key, value in changes.items():
        if value == TRUE and key in GPU_CLAIMS:
            return GPU_CLAIMS[key]
    return None


@lru_cache(maxsize=1024)
def handover_step(view: HandoverView) -> HandoverStep:
    """Run the machine over one view, from `serving`."""
    model = _Model(view)
    with _MACHINE.attached(model, SERVING):
        _MACHINE.run_to_rest(model)
        state = model.state
    waiting: tuple[str, ...] = ()
    if state == DRIVER_LEAVING:
        waiting = ("the NVIDIA driver pod",)
    elif state == GPU_PODS_LEAVING:
        waiting = view.gpu_pods
    elif state == VM_MANAGER_LEAVING:
        names = sorted(_others(view, (VFIO_MANAGER, VGPU_MANAGER)))
        waiting = tuple(f"the {name} pod" for name in names)
    return HandoverStep(state, waiting)


def held(changes: Mapping[str, str | None], step: HandoverStep) -> dict[str, str | None]:
    """The patch to write this pass: the claim label left out while the step holds it."""
    if not step.hold:
        return dict(changes)
    return {k: v for k, v in changes.items() if not (v == TRUE and k in GPU_CLAIMS)}
