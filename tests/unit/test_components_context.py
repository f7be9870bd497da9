"""Per-node facts reach rendering: driver image OS tag, precompiled kernels, toolkit runtime."""

from __future__ import annotations

from typing import Any

import components as c
import crd
from components import driver, toolkit
from components.context import KERNEL_LABEL, OS_ID_LABEL, OS_VERSION_LABEL, node_facts


def node(os_id: str, version: str, runtime: str, kernel: str = "5.15.0-124-generic") -> Any:
    return {
        "metadata": {
            "labels": {OS_ID_LABEL: os_id, OS_VERSION_LABEL: version, KERNEL_LABEL: kernel}
        },
        "status": {"nodeInfo": {"containerRuntimeVersion": runtime}},
    }


def ctx(*nodes: Any) -> c.RenderContext:
    return c.RenderContext(
        namespace="ns", operator_image="op:1", gpu_nodes=tuple(c.node_facts(n) for n in nodes)
    )


def spec(**sections: object) -> crd.ClusterPolicySpec:
    return crd.ClusterPolicySpec.model_validate(sections)


def daemonsets(objects: list[c.Manifest]) -> list[c.Manifest]:
    return [o for o in objects if o["kind"] == "DaemonSet"]


def env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def test_runtime_from_the_nodes_not_the_policy() -> None:
    assert ctx(node("ubuntu", "22.04", "containerd://1.7.22")).container_runtime == "containerd"
    assert ctx(node("ubuntu", "22.04", "docker://24.0")).container_runtime == "docker"
    # Any containerd node wins, as upstream decides; unknown runtimes are skipped.
    mixed = ctx(node("ubuntu", "22.04", "docker://24"), node("ubuntu", "22.04", "containerd://2"))
    assert mixed.container_runtime == "containerd"
    assert ctx(node("rhel", "9.4", "cri-o://1.30")).container_runtime == "crio"
    assert ctx().container_runtime == "containerd"
    assert ctx(node("ubuntu", "22.04", "rkt://1")).container_runtime == "containerd"


def test_os_tag() -> None:
    assert ctx(node("ubuntu", "22.04", "containerd://1")).os_tag == "ubuntu22.04"
    assert ctx(node("rhel", "9.4", "containerd://1")).os_tag == "rhel9"  # major only
    many = ctx(
        node("rocky", "9.3", "containerd://1"),
        node("ubuntu", "24.04", "containerd://1"),
        node("ubuntu", "24.04", "containerd://1"),
    )
    assert many.os_tag == "ubuntu24.04"
    assert ctx().os_tag is None


def test_driver_image_carries_the_node_os() -> None:
    (ds,) = daemonsets(driver.render(spec(), ctx(node("ubuntu", "22.04", "containerd://1"))))
    main = ds["spec"]["template"]["spec"]["containers"][0]
    assert main["image"] == "nvcr.io/nvidia/driver:595.91.07-ubuntu22.04"
    pinned = spec(driver={"image": "nvcr.io/nvidia/driver@sha256:" + "a" * 64})
    (ds,) = daemonsets(driver.render(pinned, ctx(node("ubuntu", "22.04", "containerd://1"))))
    assert ds["spec"]["template"]["spec"]["containers"][0]["image"].endswith("a" * 64)


def test_precompiled_driver_daemonset_per_kernel() -> None:
    nodes = ctx(
        node("ubuntu", "22.04", "containerd://1", "5.15.0-124-generic"),
        node("ubuntu", "22.04", "containerd://1", "6.8.0-45-generic"),
    )
    policy = spec(driver={"usePrecompiled": True, "version": "595"})
    by_name = {d["metadata"]["name"]: d for d in daemonsets(driver.render(policy, nodes))}
    assert set(by_name) == {
        "nvidia-driver-daemonset-5.15.0-124-generic-ubuntu22.04",
        "nvidia-driver-daemonset-6.8.0-45-generic-ubuntu22.04",
    }
    pod = by_name["nvidia-driver-daemonset-6.8.0-45-generic-ubuntu22.04"]["spec"]["template"]
    assert pod["spec"]["nodeSelector"][KERNEL_LABEL] == "6.8.0-45-generic"
    assert pod["metadata"]["labels"]["nvidia.com/precompiled"] == "true"
    assert pod["spec"]["containers"][0]["image"] == (
        "nvcr.io/nvidia/driver:595-6.8.0-45-generic-ubuntu22.04"
    )
    assert driver.sanitized_kernel("5.14.0-427.el9_4.x86_64") == "5.14.0-427.el9.4"


def test_toolkit_configures_the_nodes_runtime() -> None:
    def main_and_volumes(runtime: str) -> tuple[dict[str, Any], dict[str, str]]:
        (ds,) = daemonsets(toolkit.COMPONENT.render(spec(), ctx(node("ubuntu", "22.04", runtime))))
        pod = ds["spec"]["template"]["spec"]
        vols = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
        return pod["containers"][0], vols

    main, vols = main_and_volumes("containerd://1.7.22")
    variables = env(main)
    assert variables["RUNTIME"] == "containerd"
    assert variables["RUNTIME_CONFIG"] == "/runtime/config-dir/config.toml"
    assert variables["RUNTIME_DROP_IN_CONFIG_HOST_PATH"] == "/etc/containerd/conf.d/99-nvidia.toml"
    assert variables["RUNTIME_SOCKET"] == "/runtime/sock-dir/containerd.sock"
    assert variables["NVIDIA_CONTAINER_RUNTIME_MODE"] == "cdi"
    assert vols["containerd-config"] == "/etc/containerd"
    assert vols["containerd-socket"] == "/run/containerd"
    assert "/etc/docker" not in vols.values()

    main, vols = main_and_volumes("docker://24.0")
    assert env(main)["DOCKER_CONFIG"] == "/runtime/config-dir/daemon.json"
    assert "RUNTIME_DROP_IN_CONFIG" not in env(main)  # docker has no drop-in files
    assert vols["docker-socket"] == "/var/run"

    main, vols = main_and_volumes("cri-o://1.30")
    assert env(main)["RUNTIME_DROP_IN_CONFIG_HOST_PATH"] == "/etc/crio/crio.conf.d/99-nvidia.conf"
    assert "RUNTIME_SOCKET" not in env(main)


def test_toolkit_user_paths_move_the_mounts() -> None:
    policy = spec(toolkit={"env": [{"name": "CONTAINERD_CONFIG", "value": "/etc/k3s/c.toml"}]})
    (ds,) = daemonsets(
        toolkit.COMPONENT.render(policy, ctx(node("ubuntu", "22.04", "containerd://1")))
    )
    pod = ds["spec"]["template"]["spec"]
    vols = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert vols["containerd-config"] == "/etc/k3s"
    # The host path the user gave is mounted; the toolkit gets the in-container path.
    assert env(pod["containers"][0])["CONTAINERD_CONFIG"] == "/runtime/config-dir/c.toml"


def test_nodes_alike_share_one_facts_object() -> None:
    """The controller keeps every GPU node's facts; a fleet has a handful of distinct
    ones (OS image, kernel, runtime), so nodes alike hold one instance."""
    a = node_facts(node("ubuntu", "22.04", "containerd://1.7.2"))
    b = node_facts(node("ubuntu", "22.04", "containerd://1.7.2"))
    assert a is b
    assert (a.os_tag, a.runtime) == ("ubuntu22.04", "containerd")
    assert node_facts(node("rhel", "9.4", "cri-o://1.30")) is not a
