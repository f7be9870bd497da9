"""The driver manager's hand-off annotation: who empties a node when its driver restarts.

NVIDIA's ``k8s-driver-manager`` runs as the first init container of every driver pod.
It reads the node annotation ``nvidia.com/gpu-driver-upgrade-enabled``
(NVIDIA/k8s-driver-manager ``cmd/driver-manager/main.go``: ``fetchAutoUpgradeAnnotation``,
``isDriverAutoUpgradePolicyEnabled``). With ``"true"`` the operator's upgrade machine owns
the node's cordon and drain and the driver manager leaves both alone
(``isGPUPodEvictionEnabled`` and ``isAutoDrainEnabled`` answer false). Without it, and
with ``ENABLE_GPU_POD_EVICTION=true`` as the driver DaemonSet is rendered, the driver
manager cordons the node, evicts its GPU pods and **uncordons it** on every driver pod
start, whoever cordoned it: an upgrade under way, an administrator or GPU-health
remediation.

So the value follows upstream's node-labelling controller exactly
(NVIDIA/gpu-operator ``controllers/nodelabeling_controller.go``,
``applyDriverAutoUpgradeAnnotation`` at a22dbf6):

- ClusterPolicy drivers (``useNvidiaDriverCRD`` off, or sandbox workloads on): every node
  labelled ``nvidia.com/gpu.present=true`` gets ``"true"`` while the driver is enabled,
  ``upgradePolicy.autoUpgrade`` is on and sandbox workloads are off; otherwise the
  annotation is removed.
- NVIDIADriver drivers: a node owned by an NVIDIADriver follows that resource's
  ``upgradePolicy.autoUpgrade``; a node no NVIDIADriver owns is left as it is. Ours reads
  the owner a node is moving to while a move is recorded, as the upgrade machine does:
  the new owner's driver pod is the one that starts next there.

One difference, kept on purpose: with no active policy (deleted, or the operator being
uninstalled) the annotation is removed, as every label of ours is, so an uninstall
leaves nodes as found (upstream leaves it).
"""

from __future__ import annotations

from collections.abc import Mapping

from components.keys import GPU_PRESENT_LABEL, TRUE
from crd import ClusterPolicySpec
from statemachine.driver_owner import NEXT_OWNER_LABEL, OWNER_LABEL

HANDOFF_ANNOTATION = "nvidia.com/gpu-driver-upgrade-enabled"
HANDOFF_ON = "true"


def handoff_wanted(
    node_labels: Mapping[str, str],
    spec: ClusterPolicySpec | None,
    nvd_auto_upgrade: Mapping[str, bool] | None,
) -> bool | None:
    """Whether the node should carry the annotation (True), not carry it (False), or be
    left as it is (None: not ours to say, or not known yet).

    ``node_labels`` are the labels after this pass's label patch; ``nvd_auto_upgrade``
    maps each NVIDIADriver to its ``autoUpgrade``, None while the NVIDIADriver cache has
    not listed (then an owned node is left alone: "unknown" is never read as "off").
    """
    if spec is None:
        return False
    if spec.driver.use_nvidia_driver_crd and not spec.sandbox_workloads.enabled:
        owner = node_labels.get(NEXT_OWNER_LABEL) or node_labels.get(OWNER_LABEL)
        if not owner or nvd_auto_upgrade is None or owner not in nvd_auto_upgrade:
            return None
        return nvd_auto_upgrade[owner]
    if node_labels.get(GPU_PRESENT_LABEL) != TRUE:
        return None  # upstream lists only nodes labelled nvidia.com/gpu.present=true
    up = spec.driver.upgrade_policy
    return bool(spec.driver.enabled and up.auto_upgrade and not spec.sandbox_workloads.enabled)


def handoff_patch(annotations: Mapping[str, str], wanted: bool | None) -> dict[str, str | None]:
    """The annotation patch that brings ``annotations`` to ``wanted``; empty when they
    already agree (a pass that changes nothing writes nothing)."""
    if wanted is None:
        return {}
    present = annotations.get(HANDOFF_ANNOTATION)
    if wanted and present != HANDOFF_ON:
        return {HANDOFF_ANNOTATION: HANDOFF_ON}
    if not wanted and present is not None:
        return {HANDOFF_ANNOTATION: None}
    return {}
