"""Node labels under a GPUCluster: the DRA stack's deploy labels instead of the
device-plugin stack's.

As upstream: every GPU node gets `gpu.present` and the five DRA deploy labels (the
driver's included, for an NVIDIADriver's DaemonSet); the ClusterPolicy's own deploy
labels that are ours (`true`) go. Values that are not ours (`false`, `paused-for-*`)
are left alone, so an administrator or the driver manager can still hold an operand
off a node. Without a GPU the node keeps none of ours.
"""

from __future__ import annotations

from collections.abc import Mapping

from components.keys import (
    DEPLOY_DRIVER_LABEL,
    DEPLOY_LABEL_PREFIX,
    FALSE,
    GPU_PRESENT_LABEL,
    PAUSED_PREFIX,
    TRUE,
    is_gpu_node,
)
from components.labels import LabelChanges
from components.registry import DEPLOY_LABELS

DRA_DEPLOY_LABELS: tuple[str, ...] = (
    DEPLOY_DRIVER_LABEL,
    f"{DEPLOY_LABEL_PREFIX}dra-driver",
    f"{DEPLOY_LABEL_PREFIX}dra-validator",
    f"{DEPLOY_LABEL_PREFIX}dcgm-dra",
    f"{DEPLOY_LABEL_PREFIX}dcgm-exporter-dra",
)


def _not_ours(value: str | None) -> bool:
    return value == FALSE or (value is not None and value.startswith(PAUSED_PREFIX))


def gpucluster_label_changes(labels: Mapping[str, str], active: bool = True) -> LabelChanges:
    """The label patch for one node while no ClusterPolicy is active: with a GPUCluster
    (`active`) its labels, without one none of ours (the DRA labels included); empty at
    the fixed point."""
    changes: LabelChanges = {}
    gpu = is_gpu_node(labels) and active
    present = labels.get(GPU_PRESENT_LABEL)
    if gpu and present != TRUE and not _not_ours(present):
        changes[GPU_PRESENT_LABEL] = TRUE
    elif not gpu and present == TRUE:
        changes[GPU_PRESENT_LABEL] = None
    for key in dict.fromkeys((*DRA_DEPLOY_LABELS, *DEPLOY_LABELS)):
        value = labels.get(key)
        if _not_ours(value):
            continue
        wanted = gpu and key in DRA_DEPLOY_LABELS
        if wanted and value != TRUE:
            changes[key] = TRUE
        elif not wanted and value == TRUE:
            changes[key] = None
    return changes
