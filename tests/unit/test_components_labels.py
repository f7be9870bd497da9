"""Node labelling rules: what we add, what we remove, and what is never ours to touch."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import components as c
import crd
from components.keys import MIG_CONFIG_LABEL

NFD = "feature.node.kubernetes.io/pci-10de.present"
KERNEL = "feature.node.kubernetes.io/kernel-version.full"
ALL_DEFAULT = {
    c.DEPLOY_DRIVER_LABEL,
    c.DEPLOY_TOOLKIT_LABEL,
    c.DEPLOY_VALIDATOR_LABEL,
    c.DEPLOY_DEVICE_PLUGIN_LABEL,
    c.DEPLOY_DCGM_LABEL,
    c.DEPLOY_DCGM_EXPORTER_LABEL,
    c.DEPLOY_GFD_LABEL,
    c.DEPLOY_NODE_STATUS_EXPORTER_LABEL,
    "nvidia.com/gpu.deploy.client",
}
"""Deploy labels on a GPU node that is not MIG-capable: upstream sets every operand's,
enabled or not (dcgm and node-status-exporter are off by default)."""
MIG_CONFIG = "nvidia.com/mig.config"


def spec(**sections: object) -> crd.ClusterPolicySpec:
    return crd.ClusterPolicySpec.model_validate(sections)


def converge(labels: dict[str, str], policy: crd.ClusterPolicySpec | None) -> dict[str, str]:
    return c.apply_label_changes(labels, c.node_label_changes(labels, policy))


@pytest.mark.parametrize("key", c.NFD_GPU_LABELS)
def test_gpu_node_gets_present_and_default_deploy_labels(key: str) -> None:
    changes = c.node_label_changes({key: "true"}, spec())
    assert changes == {c.GPU_PRESENT_LABEL: "true", **dict.fromkeys(ALL_DEFAULT, "true")}


def test_cpu_node_gets_nothing() -> None:
    assert c.node_label_changes({"kubernetes.io/os": "linux"}, spec()) == {}
    assert c.node_label_changes({NFD: "false"}, spec()) == {}


def test_converged_node_needs_no_change() -> None:
    labels = converge({NFD: "true"}, spec())
    assert c.node_label_changes(labels, spec()) == {}


def test_dcgm_and_node_status_exporter_follow_their_switches() -> None:
    policy = spec(dcgm={"enabled": True}, nodeStatusExporter={"enabled": True})
    changes = c.node_label_changes({NFD: "true"}, policy)
    assert changes[c.DEPLOY_DCGM_LABEL] == "true"
    assert changes[c.DEPLOY_NODE_STATUS_EXPORTER_LABEL] == "true"


def test_mig_manager_only_on_mig_capable_nodes() -> None:
    plain = c.node_label_changes({NFD: "true"}, spec())
    mig = c.node_label_changes({NFD: "true", c.MIG_CAPABLE_LABEL: "true"}, spec())
    assert c.DEPLOY_MIG_MANAGER_LABEL not in plain
    assert mig[c.DEPLOY_MIG_MANAGER_LABEL] == "true"
    # A node that stops being MIG-capable loses our label.
    labels = {NFD: "true", c.MIG_CAPABLE_LABEL: "false", c.DEPLOY_MIG_MANAGER_LABEL: "true"}
    assert c.node_label_changes(labels, spec())[c.DEPLOY_MIG_MANAGER_LABEL] is None


def test_mig_node_gets_the_mig_manager_label_and_the_default_layout() -> None:
    changes = c.node_label_changes({NFD: "true", c.MIG_CAPABLE_LABEL: "true"}, spec())
    assert changes[c.DEPLOY_MIG_MANAGER_LABEL] == "true"
    assert changes[MIG_CONFIG] == "all-disabled"
    other = c.node_label_changes({NFD: "true", c.MIG_CAPABLE_LABEL: "false"}, spec())
    assert c.DEPLOY_MIG_MANAGER_LABEL not in other
    assert MIG_CONFIG not in other


def test_mig_layout_of_the_user_is_kept() -> None:
    labels = {NFD: "true", c.MIG_CAPABLE_LABEL: "true", MIG_CONFIG: "all-1g.10gb"}
    assert MIG_CONFIG not in c.node_label_changes(labels, spec())


def test_no_default_layout_without_mig_manager_or_default() -> None:
    labels = {NFD: "true", c.MIG_CAPABLE_LABEL: "true"}
    for policy in (
        spec(migManager={"enabled": False}),
        spec(migManager={"config": {"default": ""}}),
    ):
        assert MIG_CONFIG not in c.node_label_changes(labels, policy)


def test_mig_manager_disabled_keeps_its_label_like_upstream() -> None:
    labels = converge({NFD: "true", c.MIG_CAPABLE_LABEL: "true"}, spec())
    assert c.node_label_changes(labels, spec(migManager={"enabled": False})) == {}


def test_user_false_is_never_overwritten() -> None:
    labels = {NFD: "true", c.DEPLOY_DRIVER_LABEL: "false"}
    changes = c.node_label_changes(labels, spec())
    assert c.DEPLOY_DRIVER_LABEL not in changes
    assert changes[c.DEPLOY_TOOLKIT_LABEL] == "true"


def test_user_false_survives_disable_operands_and_cpu_node() -> None:
    for labels in (
        {NFD: "true", c.DEPLOY_DRIVER_LABEL: "false", c.DEPLOY_OPERANDS_LABEL: "false"},
        {c.DEPLOY_DRIVER_LABEL: "false"},
    ):
        assert c.DEPLOY_DRIVER_LABEL not in c.node_label_changes(labels, spec())


def test_paused_values_are_left_alone() -> None:
    paused = "paused-for-mig-change"
    labels = converge({NFD: "true"}, spec())
    labels[c.DEPLOY_DEVICE_PLUGIN_LABEL] = paused
    assert c.node_label_changes(labels, spec()) == {}
    # Not even when the component is disabled or operands are switched off.
    assert c.DEPLOY_DEVICE_PLUGIN_LABEL not in c.node_label_changes(
        labels, spec(devicePlugin={"enabled": False})
    )
    labels[c.DEPLOY_OPERANDS_LABEL] = "false"
    assert c.DEPLOY_DEVICE_PLUGIN_LABEL not in c.node_label_changes(labels, spec())


def test_operands_false_removes_all_our_deploy_labels() -> None:
    labels = converge({NFD: "true", c.MIG_CAPABLE_LABEL: "true"}, spec())
    labels[c.DEPLOY_OPERANDS_LABEL] = "false"
    labels[c.DEPLOY_DCGM_LABEL] = "false"
    changes = c.node_label_changes(labels, spec())
    removed = {k for k, v in changes.items() if v is None}
    assert removed == (ALL_DEFAULT - {c.DEPLOY_DCGM_LABEL}) | {c.DEPLOY_MIG_MANAGER_LABEL}
    assert c.DEPLOY_OPERANDS_LABEL not in changes  # the user's switch
    assert c.GPU_PRESENT_LABEL not in changes  # still a GPU node


def test_disabling_a_component_keeps_its_deploy_label() -> None:
    """Upstream labels every operand state; enabling it again needs no relabelling."""
    labels = converge({NFD: "true"}, spec())
    assert c.node_label_changes(labels, spec(dcgmExporter={"enabled": False})) == {}


def test_node_that_loses_its_gpu_is_cleaned() -> None:
    """NFD still labels the node (its kernel), without an NVIDIA device: the GPU left."""
    labels = converge({NFD: "true", KERNEL: "5.15", c.MIG_CAPABLE_LABEL: "true"}, spec())
    labels[c.DEPLOY_DCGM_LABEL] = "false"
    labels[c.DEPLOY_GFD_LABEL] = "paused-for-mig-change"
    del labels[NFD]
    after = converge(labels, spec())
    assert c.GPU_PRESENT_LABEL not in after
    assert {k: v for k, v in after.items() if k.startswith(c.DEPLOY_LABEL_PREFIX)} == {
        c.DEPLOY_DCGM_LABEL: "false",
        c.DEPLOY_GFD_LABEL: "paused-for-mig-change",
    }


def test_a_gpu_node_stays_one_while_nfds_labels_are_away() -> None:
    """NFD's uninstall prunes every label it (and GFD through it) published: a node we
    found a GPU node keeps its deploy labels, the MIG manager's included, until NFD
    labels it again; then NFD's word counts."""
    found = {NFD: "true", KERNEL: "5.15", c.MIG_CAPABLE_LABEL: "true"}
    labels = converge(found, spec())
    pruned = {k: v for k, v in labels.items() if k not in found}
    assert c.nfd_labels_away(pruned)
    assert c.is_gpu_node(pruned)
    assert c.is_mig_capable(pruned)
    assert c.any_mig_capable([pruned])
    assert c.node_label_changes(pruned, spec()) == {}
    # The user's switch still acts meanwhile.
    assert set(c.node_label_changes({**pruned, c.DEPLOY_OPERANDS_LABEL: "false"}, spec())) == (
        ALL_DEFAULT | {c.DEPLOY_MIG_MANAGER_LABEL}
    )
    # No policy: ours go as ever (the MIG layout is a request, never removed).
    assert converge(pruned, None) == {MIG_CONFIG: "all-disabled"}
    # NFD labels the node again, without the GPU: no longer a GPU node.
    assert c.GPU_PRESENT_LABEL not in converge({**pruned, KERNEL: "5.15"}, spec())
    # Never ours (a user's false), or never found a GPU node: NFD's absence is no GPU.
    assert not c.is_gpu_node({c.GPU_PRESENT_LABEL: "false"})
    assert not c.nfd_labels_away({})


def test_no_policy_removes_every_label_of_ours() -> None:
    labels = converge({NFD: "true"}, spec())
    changes = c.node_label_changes(labels, None)
    assert changes == dict.fromkeys([*ALL_DEFAULT, c.GPU_PRESENT_LABEL], None)
    assert c.node_label_changes({NFD: "true"}, None) == {}
    # A user's false stays.
    assert c.node_label_changes({NFD: "true", c.GPU_PRESENT_LABEL: "false"}, None) == {}


def test_user_false_on_gpu_present_is_kept() -> None:
    changes = c.node_label_changes({NFD: "true", c.GPU_PRESENT_LABEL: "false"}, spec())
    assert c.GPU_PRESENT_LABEL not in changes
    assert changes[c.DEPLOY_DRIVER_LABEL] == "true"  # still a GPU node for the operands


def test_device_plugin_config_label_is_untouched() -> None:
    labels = {NFD: "true", c.DEVICE_PLUGIN_CONFIG_LABEL: "time-sliced"}
    assert c.DEVICE_PLUGIN_CONFIG_LABEL not in c.node_label_changes(labels, spec())
    assert converge(labels, None)[c.DEVICE_PLUGIN_CONFIG_LABEL] == "time-sliced"


def test_odd_values_are_corrected_when_wanted_and_kept_otherwise() -> None:
    labels = {NFD: "true", c.DEPLOY_DRIVER_LABEL: "yes", c.DEPLOY_DCGM_LABEL: "yes"}
    changes = c.node_label_changes(labels, spec())
    assert changes[c.DEPLOY_DRIVER_LABEL] == "true"
    labels[c.DEPLOY_OPERANDS_LABEL] = "false"
    changes = c.node_label_changes(labels, spec())
    assert c.DEPLOY_DCGM_LABEL not in changes  # not wanted, not ours to remove


def test_any_mig_capable_needs_a_gpu_node() -> None:
    assert c.any_mig_capable([{NFD: "true", c.MIG_CAPABLE_LABEL: "true"}, {}])
    assert not c.any_mig_capable([{c.MIG_CAPABLE_LABEL: "true"}, {NFD: "true"}])


def test_apply_label_changes_removes_and_sets() -> None:
    assert c.apply_label_changes({"a": "1", "b": "2"}, {"a": None, "c": "3", "z": None}) == {
        "b": "2",
        "c": "3",
    }


_KEYS = [
    *c.NFD_GPU_LABELS,
    c.GPU_PRESENT_LABEL,
    c.DEPLOY_OPERANDS_LABEL,
    c.MIG_CAPABLE_LABEL,
    c.DEVICE_PLUGIN_CONFIG_LABEL,
    *c.DEPLOY_LABELS,
    "example.com/other",
]
_VALUES = st.sampled_from(["true", "false", "paused-for-mig-change", "", "yes", "x"])
_POLICIES = st.builds(
    lambda dcgm, dp, mig, nse, operands: spec(
        dcgm={"enabled": dcgm},
        devicePlugin={"enabled": dp},
        migManager={"enabled": mig},
        nodeStatusExporter={"enabled": nse},
        driver={"enabled": operands},
    ),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.booleans(),
)


@given(
    labels=st.dictionaries(st.sampled_from(_KEYS), _VALUES),
    policy=st.one_of(st.none(), _POLICIES),
)
def test_changes_reach_a_fixed_point(
    labels: dict[str, str], policy: crd.ClusterPolicySpec | None
) -> None:
    changes = c.node_label_changes(labels, policy)
    after = c.apply_label_changes(labels, changes)
    assert c.node_label_changes(after, policy) == {}
    # Changes are real changes, and never touch values that are not ours.
    for key, value in changes.items():
        assert labels.get(key) != value
        old = labels.get(key)
        assert old != "false"
        assert not (old or "").startswith("paused-for-")
        if value is None:
            assert old == "true"
    assert set(changes) <= {c.GPU_PRESENT_LABEL, MIG_CONFIG_LABEL, *c.DEPLOY_LABELS}
    # The default MIG layout is only ever added: a layout already asked for is the user's.
    if MIG_CONFIG_LABEL in changes:
        assert MIG_CONFIG_LABEL not in labels
