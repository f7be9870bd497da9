"""The workload hand-over: a claimant's label waits until no other claimant uses the GPUs."""

from __future__ import annotations

import pytest

from statemachine.workload_handover import (
    CLAIMING,
    DRIVER,
    DRIVER_LEAVING,
    GPU_PODS_LEAVING,
    SERVING,
    VFIO_MANAGER,
    VGPU_MANAGER,
    VM_MANAGER_LEAVING,
    HandoverView,
    handover_step,
    held,
    pending_claim,
)

DRIVER_LABEL = "nvidia.com/gpu.deploy.driver"
VFIO_LABEL = "nvidia.com/gpu.deploy.vfio-manager"
VGPU_LABEL = "nvidia.com/gpu.deploy.vgpu-manager"


def test_only_a_claimant_label_set_to_true_is_a_claim() -> None:
    assert pending_claim({DRIVER_LABEL: None, VFIO_LABEL: "true"}) == VFIO_MANAGER
    assert pending_claim({VGPU_LABEL: "true"}) == VGPU_MANAGER
    assert pending_claim({DRIVER_LABEL: "true"}) == DRIVER
    assert (
        pending_claim({DRIVER_LABEL: None, "nvidia.com/gpu.deploy.sandbox-validator": "true"})
        is None
    )


@pytest.mark.parametrize(
    ("view", "state", "waiting"),
    [
        (HandoverView(None, frozenset({DRIVER}), ("a/gpu",)), SERVING, ()),
        # container -> vm-passthrough: the driver first, then GPU pods, then the other VM manager
        (
            HandoverView(VFIO_MANAGER, frozenset({DRIVER}), ("a/gpu",)),
            DRIVER_LEAVING,
            ("the NVIDIA driver pod",),
        ),
        (
            HandoverView(VFIO_MANAGER, frozenset(), ("a/gpu", "b/job")),
            GPU_PODS_LEAVING,
            ("a/gpu", "b/job"),
        ),
        (
            HandoverView(VFIO_MANAGER, frozenset({VGPU_MANAGER})),
            VM_MANAGER_LEAVING,
            ("the vgpu-manager pod",),
        ),
        (HandoverView(VFIO_MANAGER, frozenset({VFIO_MANAGER})), CLAIMING, ()),
        (
            HandoverView(VGPU_MANAGER, frozenset({VFIO_MANAGER})),
            VM_MANAGER_LEAVING,
            ("the vfio-manager pod",),
        ),
        (
            HandoverView(VGPU_MANAGER, frozenset({DRIVER, VFIO_MANAGER})),
            DRIVER_LEAVING,
            ("the NVIDIA driver pod",),
        ),
        # back to containers: only the VM managers must go (GPU pods are the driver's own)
        (HandoverView(DRIVER, frozenset({DRIVER}), ("a/gpu",)), CLAIMING, ()),
        (
            HandoverView(DRIVER, frozenset({VFIO_MANAGER}), ("a/gpu",)),
            VM_MANAGER_LEAVING,
            ("the vfio-manager pod",),
        ),
        (HandoverView(DRIVER, frozenset()), CLAIMING, ()),
    ],
)
def test_the_claim_waits_for_every_other_user_of_the_gpus(
    view: HandoverView, state: str, waiting: tuple[str, ...]
) -> None:
    step = handover_step(view)
    assert (step.state, step.waiting_for) == (state, waiting)
    assert step.hold == (state not in (SERVING, CLAIMING))


def test_a_held_patch_drops_only_the_claim_and_keeps_removals() -> None:
    changes = {
        DRIVER_LABEL: None,
        VFIO_LABEL: "true",
        "nvidia.com/gpu.deploy.sandbox-validator": "true",
    }
    waiting = handover_step(HandoverView(VFIO_MANAGER, frozenset({DRIVER})))
    assert held(changes, waiting) == {
        DRIVER_LABEL: None,
        "nvidia.com/gpu.deploy.sandbox-validator": "true",
    }
    assert held(changes, handover_step(HandoverView(VFIO_MANAGER))) == changes
    assert held({VFIO_LABEL: "true"}, waiting) == {}
