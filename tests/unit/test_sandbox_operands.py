"""The sandbox operands (GPUs for VMs): when each runs, and the policy fields each one
follows (upstream's transforms: images, modes, layouts, arguments, the driver manager)."""

from __future__ import annotations

from typing import Any

import pytest

import components as c
import crd
from components.registry import NODE_ORDER
from tests.unit.test_components_render import ctx, everything, main_container, pod

SANDBOX = (
    "vgpu-manager",
    "vgpu-device-manager",
    "vfio-manager",
    "sandbox-validation",
    "sandbox-device-plugin",
    "kata-device-plugin",
    "cc-manager",
)


def with_sandbox(mode: str = "kubevirt", **sections: Any) -> crd.ClusterPolicySpec:
    base = everything(mode).model_dump(by_alias=True, exclude_none=True)
    for key, value in sections.items():
        base[key] = {**base.get(key, {}), **value}
    return crd.ClusterPolicySpec.model_validate(base)


def objects(name: str, policy: crd.ClusterPolicySpec, **kw: Any) -> list[c.Manifest]:
    return c.component_by_name(name).objects(policy, ctx(**kw))


def daemonset(name: str, policy: crd.ClusterPolicySpec, **kw: Any) -> c.Manifest:
    (ds,) = [o for o in objects(name, policy, **kw) if o["kind"] == "DaemonSet"]
    return ds


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {v["name"]: v.get("value", v.get("valueFrom")) for v in container.get("env", [])}


def test_nothing_sandbox_runs_without_sandbox_workloads() -> None:
    """Upstream's chart switches most sandbox sections on by default: they act only
    once `sandboxWorkloads.enabled` is set."""
    policy = with_sandbox(sandboxWorkloads={"enabled": False})
    assert not set(SANDBOX) & set(c.enabled_components(policy))
    for name in SANDBOX:
        assert objects(name, policy) == []


@pytest.mark.parametrize(
    ("mode", "runs", "not_runs"),
    [
        ("kubevirt", "sandbox-device-plugin", {"kata-device-plugin", "cc-manager"}),
        ("kata", "kata-device-plugin", {"sandbox-device-plugin"}),
    ],
)
def test_the_mode_picks_the_vm_device_plugin(mode: str, runs: str, not_runs: set[str]) -> None:
    enabled = set(c.enabled_components(with_sandbox(mode)))
    assert runs in enabled
    assert not enabled & not_runs


def test_vgpu_manager_image_carries_the_nodes_os() -> None:
    facts = (c.NodeFacts(os_id="ubuntu", os_version="22.04"),)
    ds = daemonset("vgpu-manager", with_sandbox(), gpu_nodes=facts)
    assert main_container(ds)["image"] == "example.com/vgpu-manager:1.0-ubuntu22.04"
    assert pod(ds)["terminationGracePeriodSeconds"] == 120
    pinned = with_sandbox(vgpuManager={"version": "sha256:" + "a" * 64})
    image = main_container(daemonset("vgpu-manager", pinned, gpu_nodes=facts))["image"]
    assert image.endswith("@sha256:" + "a" * 64)


def test_vgpu_manager_kernel_module_parameters_are_mounted_file_by_file() -> None:
    policy = with_sandbox(vgpuManager={"kernelModuleConfig": {"name": "modules"}})
    assert "modules" in c.driver_config.referenced_config_maps(policy)
    ds = daemonset("vgpu-manager", policy, config_map_keys={"modules": ("nvidia.conf",)})
    mounts = {m["mountPath"]: m for m in main_container(ds)["volumeMounts"]}
    assert mounts["/drivers/nvidia.conf"]["subPath"] == "nvidia.conf"
    assert "/drivers" not in mounts  # the image's own /drivers stays visible
    missing = daemonset("vgpu-manager", policy)
    assert not any(
        m["mountPath"].startswith("/drivers") for m in main_container(missing)["volumeMounts"]
    )


def test_driver_manager_env_is_the_policys() -> None:
    manager = {"driverManager": {"env": [{"name": "ENABLE_GPU_POD_EVICTION", "value": "true"}]}}
    for name, section in (("vgpu-manager", "vgpuManager"), ("vfio-manager", "vfioManager")):
        ds = daemonset(name, with_sandbox(**{section: manager}))
        (init,) = pod(ds)["initContainers"]
        assert init["name"] == "k8s-driver-manager"
        assert init["args"] == ["uninstall_driver"]
        assert env_of(init)["ENABLE_GPU_POD_EVICTION"] == "true"
        assert env_of(init)["ENABLE_AUTO_DRAIN"] == "false"


def test_vgpu_device_manager_layouts() -> None:
    ds = daemonset("vgpu-device-manager", with_sandbox())
    assert env_of(main_container(ds))["DEFAULT_VGPU_CONFIG"] == "default"
    names = {o["metadata"]["name"] for o in objects("vgpu-device-manager", with_sandbox())}
    assert "default-vgpu-devices-config" in names
    own = with_sandbox(vgpuDeviceManager={"config": {"name": "mine", "default": "A10-4Q"}})
    ds = daemonset("vgpu-device-manager", own)
    assert env_of(main_container(ds))["DEFAULT_VGPU_CONFIG"] == "A10-4Q"
    volume = next(v for v in pod(ds)["volumes"] if v["name"] == "vgpu-config")
    assert volume["configMap"]["name"] == "mine"
    names = {o["metadata"]["name"] for o in objects("vgpu-device-manager", own)}
    assert "default-vgpu-devices-config" not in names


def test_cc_manager_default_mode() -> None:
    ds = daemonset("cc-manager", with_sandbox("kata", ccManager={"defaultMode": "devtools"}))
    assert env_of(main_container(ds))["DEFAULT_CC_MODE"] == "devtools"
    assert ds["spec"]["selector"]["matchLabels"] == {"name": "nvidia-cc-manager"}


def test_vfio_manager_arguments_replace_its_command() -> None:
    ds = daemonset("vfio-manager", with_sandbox(vfioManager={"args": ["sleep infinity"]}))
    assert main_container(ds)["args"] == ["sleep infinity"]
    default = main_container(daemonset("vfio-manager", with_sandbox()))
    assert default["args"] == ["vfio-manage bind --all && while true; do sleep 86400; done"]
    stop = default["lifecycle"]["preStop"]["exec"]["command"]
    assert stop == ["/bin/sh", "-c", "vfio-manage unbind --all"]


def test_sandbox_validator_follows_the_default_workload() -> None:
    ds = daemonset(
        "sandbox-validation", with_sandbox(sandboxWorkloads={"defaultWorkload": "vm-vgpu"})
    )
    checks = {i["name"]: env_of(i) for i in pod(ds)["initContainers"]}
    assert list(checks) == [f"{x}-validation" for x in c.sandbox_validator.CHECKS]
    for name in ("vfio-pci-validation", "vgpu-manager-validation", "vgpu-devices-validation"):
        assert checks[name]["DEFAULT_GPU_WORKLOAD_CONFIG"] == "vm-vgpu"
    assert "DEFAULT_GPU_WORKLOAD_CONFIG" not in checks["cc-manager-validation"]


@pytest.mark.parametrize(
    "workload_order",
    [
        ("vfio-manager", "sandbox-validation", "sandbox-device-plugin"),
        ("vfio-manager", "sandbox-validation", "kata-device-plugin"),
        ("vgpu-manager", "vgpu-device-manager", "sandbox-validation", "sandbox-device-plugin"),
    ],
)
def test_a_vm_host_takes_its_operands_in_order(workload_order: tuple[str, ...]) -> None:
    """The per-node machine's order on a VM host: what takes the GPUs from the NVIDIA
    driver, then the vGPU devices, the validator, and the device plugin last."""
    positions = [NODE_ORDER.index(name) for name in workload_order]
    assert positions == sorted(positions)


@pytest.mark.parametrize(
    ("workload", "mode", "expected"),
    [
        # The CC manager's label goes on every VM host (upstream's); the component itself
        # runs in mode kata only, so here the node machine observes it absent.
        (
            "vm-passthrough",
            "kubevirt",
            ("vfio-manager", "sandbox-validation", "sandbox-device-plugin", "cc-manager"),
        ),
        (
            "vm-passthrough",
            "kata",
            ("vfio-manager", "sandbox-validation", "kata-device-plugin", "cc-manager"),
        ),
        (
            "vm-vgpu",
            "kata",
            (
                "vgpu-manager",
                "vgpu-device-manager",
                "sandbox-validation",
                "sandbox-device-plugin",
                "cc-manager",
            ),
        ),
    ],
)
def test_workload_node_order(workload: str, mode: str, expected: tuple[str, ...]) -> None:
    assert c.registry.workload_node_order(workload, mode) == expected


def test_container_node_order_has_no_sandbox_operand() -> None:
    order = c.registry.workload_node_order("container")
    assert order[:4] == ("driver", "container-toolkit", "operator-validation", "device-plugin")
    assert not set(order) & set(SANDBOX)
    assert set(order) | {
        n
        for w in ("vm-passthrough", "vm-vgpu")
        for m in ("kubevirt", "kata")
        for n in c.registry.workload_node_order(w, m)
    } == set(NODE_ORDER)


def test_validator_sections_env_reaches_their_sandbox_checks_as_upstream() -> None:
    """`validator.vfioPCI.env`, `.vgpuManager.env` and `.vgpuDevices.env` go to the
    sandbox validator's check of the same name, overriding ours by name (upstream's
    TransformValidatorComponent); `cc-manager` has no such section."""
    policy = with_sandbox(
        validator={
            "vfioPCI": {"env": [{"name": "A", "value": "1"}]},
            "vgpuManager": {"env": [{"name": "B", "value": "2"}]},
            "vgpuDevices": {"env": [{"name": "WITH_WAIT", "value": "false"}]},
        }
    )
    checks = {
        ctr["name"]: env_of(ctr)
        for ctr in pod(daemonset("sandbox-validation", policy))["initContainers"]
    }
    assert checks["vfio-pci-validation"]["A"] == "1"
    assert "B" not in checks["vfio-pci-validation"]
    assert checks["vgpu-manager-validation"]["B"] == "2"
    assert checks["vgpu-devices-validation"]["WITH_WAIT"] == "false"
    assert checks["cc-manager-validation"]["WITH_WAIT"] == "true"
    assert not {"A", "B"} & set(checks["cc-manager-validation"])
