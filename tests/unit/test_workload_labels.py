"""Per-node GPU workloads (`sandboxWorkloads`, `nvidia.com/gpu.workload.config`): which
workload a node serves and exactly which deploy labels each workload gets (upstream's
`gpuStateLabels`, with the vm-passthrough device plugin following `sandboxWorkloads.mode`)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import components as c
import crd
from components.keys import (
    DEPLOY_CLIENT_LABEL,
    MIG_CAPABLE_LABEL,
    MIG_CONFIG_LABEL,
    WORKLOAD_CONFIG_LABEL,
)

NFD = "feature.node.kubernetes.io/pci-10de.present"


def deploy(*names: str) -> set[str]:
    return {f"nvidia.com/gpu.deploy.{n}" for n in names}


CONTAINER = deploy(
    "driver",
    "container-toolkit",
    "operator-validator",
    "device-plugin",
    "dcgm",
    "dcgm-exporter",
    "gpu-feature-discovery",
    "node-status-exporter",
    "client",
)
"""Upstream's container set (the MIG manager's is added on MIG-capable nodes)."""
EXPECTED = {
    ("container", "kubevirt"): CONTAINER,
    ("container", "kata"): CONTAINER,
    ("vm-passthrough", "kubevirt"): deploy(
        "sandbox-device-plugin",
        "sandbox-validator",
        "vfio-manager",
        "kata-manager",
        "cc-manager",
        "client",
    ),
    ("vm-passthrough", "kata"): deploy(
        "kata-sandbox-device-plugin",
        "sandbox-validator",
        "vfio-manager",
        "kata-manager",
        "cc-manager",
        "client",
    ),
    ("vm-vgpu", "kubevirt"): deploy(
        "sandbox-device-plugin",
        "vgpu-manager",
        "vgpu-device-manager",
        "sandbox-validator",
        "cc-manager",
        "client",
    ),
    ("vm-vgpu", "kata"): deploy(
        "sandbox-device-plugin",
        "vgpu-manager",
        "vgpu-device-manager",
        "sandbox-validator",
        "cc-manager",
        "client",
    ),
}
"""Upstream v26.7's per-workload deploy labels (controllers/state_manager.go)."""


def sandbox(default: str = "container", mode: str = "kubevirt") -> crd.ClusterPolicySpec:
    return crd.ClusterPolicySpec.model_validate(
        {"sandboxWorkloads": {"enabled": True, "defaultWorkload": default, "mode": mode}}
    )


def converge(labels: dict[str, str], policy: crd.ClusterPolicySpec | None) -> dict[str, str]:
    after = c.apply_label_changes(labels, c.node_label_changes(labels, policy))
    assert c.node_label_changes(after, policy) == {}, "the labeller is a fixed point"
    return after


def deploy_labels_of(labels: dict[str, str]) -> set[str]:
    return {k for k, v in labels.items() if k.startswith(c.DEPLOY_LABEL_PREFIX) and v == "true"}


@pytest.mark.parametrize(("workload", "mode"), sorted(EXPECTED))
def test_each_workload_gets_exactly_upstreams_deploy_labels(workload: str, mode: str) -> None:
    node = {NFD: "true", WORKLOAD_CONFIG_LABEL: workload}
    assert deploy_labels_of(converge(node, sandbox(mode=mode))) == EXPECTED[workload, mode]


@pytest.mark.parametrize("workload", c.WORKLOADS)
def test_default_workload_applies_to_unlabelled_nodes(workload: str) -> None:
    policy = sandbox(default=workload)
    assert c.node_workload({NFD: "true"}, policy) == c.NodeWorkload(workload)
    assert deploy_labels_of(converge({NFD: "true"}, policy)) == EXPECTED[workload, "kubevirt"]


def test_without_sandbox_workloads_every_node_serves_containers() -> None:
    """The label means nothing unless the policy enables sandbox workloads (upstream)."""
    for policy in (crd.ClusterPolicySpec(), None):
        found = c.node_workload({WORKLOAD_CONFIG_LABEL: "vm-vgpu"}, policy)
        assert found == c.NodeWorkload("container")
    node = {NFD: "true", WORKLOAD_CONFIG_LABEL: "vm-passthrough"}
    assert deploy_labels_of(converge(node, crd.ClusterPolicySpec())) == CONTAINER


@pytest.mark.parametrize("value", ["vm", "", "VM-VGPU", "container "])
def test_invalid_label_falls_back_to_the_default_and_is_reported(value: str) -> None:
    policy = sandbox(default="vm-vgpu")
    found = c.node_workload({NFD: "true", WORKLOAD_CONFIG_LABEL: value}, policy)
    assert found.name == "vm-vgpu"
    assert found.invalid_value == value
    assert found.problem is not None
    assert repr(value) in found.problem
    assert WORKLOAD_CONFIG_LABEL in found.problem
    node = {NFD: "true", WORKLOAD_CONFIG_LABEL: value}
    assert deploy_labels_of(converge(node, policy)) == EXPECTED["vm-vgpu", "kubevirt"]


def test_valid_or_missing_label_is_no_problem() -> None:
    policy = sandbox()
    assert c.node_workload({NFD: "true"}, policy).problem is None
    for workload in c.WORKLOADS:
        assert c.node_workload({WORKLOAD_CONFIG_LABEL: workload}, policy).problem is None


def test_an_invalid_label_is_no_problem_while_sandbox_workloads_are_off() -> None:
    found = c.node_workload({WORKLOAD_CONFIG_LABEL: "nonsense"}, crd.ClusterPolicySpec())
    assert found.problem is None


def test_switching_a_node_to_a_vm_host_and_back() -> None:
    """The container stack's labels go in the same patch that brings the VM host's (so
    no moment has both the NVIDIA driver's and vfio-manager's labels), and come back."""
    policy = sandbox(mode="kata")
    container = converge({NFD: "true"}, policy)
    as_vm = {**container, WORKLOAD_CONFIG_LABEL: "vm-passthrough"}
    changes = c.node_label_changes(as_vm, policy)
    assert {k for k, v in changes.items() if v is None} == CONTAINER - {DEPLOY_CLIENT_LABEL}
    assert {k for k, v in changes.items() if v == "true"} == (
        EXPECTED["vm-passthrough", "kata"] - {DEPLOY_CLIENT_LABEL}
    )
    vm = converge(as_vm, policy)
    back = converge({**vm, WORKLOAD_CONFIG_LABEL: "container"}, policy)
    assert back == {**container, WORKLOAD_CONFIG_LABEL: "container"}


def test_disabling_sandbox_workloads_takes_every_sandbox_label_off() -> None:
    vm = converge({NFD: "true", WORKLOAD_CONFIG_LABEL: "vm-vgpu"}, sandbox())
    after = converge(vm, crd.ClusterPolicySpec())
    assert deploy_labels_of(after) == CONTAINER
    assert converge(vm, None) == {NFD: "true", WORKLOAD_CONFIG_LABEL: "vm-vgpu"}


def test_mig_capable_vm_host_gets_no_mig_manager_but_keeps_its_default_layout() -> None:
    """As upstream's recorded vm-vgpu run: the MIG manager is a container operand, the
    default `nvidia.com/mig.config` is set whatever the workload."""
    node = {NFD: "true", MIG_CAPABLE_LABEL: "true", WORKLOAD_CONFIG_LABEL: "vm-vgpu"}
    after = converge(node, sandbox())
    assert c.DEPLOY_MIG_MANAGER_LABEL not in after
    assert after[MIG_CONFIG_LABEL] == "all-disabled"
    container = converge({**node, WORKLOAD_CONFIG_LABEL: "container"}, sandbox())
    assert container[c.DEPLOY_MIG_MANAGER_LABEL] == "true"


def test_values_that_are_not_ours_stay_on_a_switching_node() -> None:
    """A user's `false` (keep this operand off) and another component's pause survive a
    workload switch, as they survive everything else."""
    vfio, plugin = deploy("vfio-manager").pop(), c.DEPLOY_DEVICE_PLUGIN_LABEL
    node = {NFD: "true", WORKLOAD_CONFIG_LABEL: "vm-passthrough", vfio: "false"}
    node[plugin] = "paused-for-driver-upgrade"
    after = converge(node, sandbox())
    assert after[vfio] == "false"
    assert after[plugin] == "paused-for-driver-upgrade"


def test_operands_off_means_no_deploy_label_for_any_workload() -> None:
    for workload in c.WORKLOADS:
        node = {NFD: "true", WORKLOAD_CONFIG_LABEL: workload, c.DEPLOY_OPERANDS_LABEL: "false"}
        assert deploy_labels_of(converge(node, sandbox())) == set()


@given(
    st.sampled_from(c.WORKLOADS),
    st.sampled_from(c.WORKLOADS),
    st.sampled_from(["kubevirt", "kata"]),
    st.booleans(),
)
def test_a_node_carries_one_workloads_labels_only(
    before: str, after: str, mode: str, mig: bool
) -> None:
    """Whatever a node served before, once relabelled it carries exactly its new
    workload's set: never a container operand on a VM host, nor the reverse."""
    policy = sandbox(mode=mode)
    node = {NFD: "true", WORKLOAD_CONFIG_LABEL: before}
    if mig:
        node[MIG_CAPABLE_LABEL] = "true"
    first = converge(node, policy)
    second = converge({**first, WORKLOAD_CONFIG_LABEL: after}, policy)
    wanted = set(EXPECTED[after, mode])
    if mig and after == "container":
        wanted.add(c.DEPLOY_MIG_MANAGER_LABEL)
    assert deploy_labels_of(second) == wanted
