"""driver: the containerised NVIDIA driver, one pod per GPU node.

The pod template is built from `spec.driver` and the pod-wide `spec.daemonsets` settings
only (never from the render context or other sections): any other change to the policy
must leave the template, and so the running drivers, alone. With automatic upgrades the
DaemonSet is `OnDelete`: the upgrade state machine decides when each node's pod goes.
"""

from __future__ import annotations

from typing import Any

from components._k8s import (
    container,
    daemonset,
    env,
    host_path,
    mount,
    pull_secrets,
    rolling_update_strategy,
    service_account,
)
from components.component import Component
from components.context import Manifest, RenderContext
from components.keys import DEPLOY_DRIVER_LABEL, TRUE
from crd import ClusterPolicySpec, ContainerProbeSpec, DriverSpec, component_image

NAME = "driver"
DAEMONSET_NAME = "nvidia-driver-daemonset"
SERVICE_ACCOUNT = "nvidia-driver"
CONTAINER_NAME = "nvidia-driver-ctr"
READY_FILE = "/run/nvidia/validations/.driver-ctr-ready"
"""Written by the startup probe once `nvidia-smi` works; removed when the pod stops."""

_STARTUP_DEFAULTS = ContainerProbeSpec(
    initial_delay_seconds=60, period_seconds=10, timeout_seconds=60, failure_threshold=120
)
"""Builds can take many minutes on a fresh kernel: allow up to ~20 minutes."""


def enabled(spec: ClusterPolicySpec) -> bool:
    return spec.driver.enabled


def _probe(command: list[str], timing: ContainerProbeSpec | None) -> dict[str, Any]:
    probe: dict[str, Any] = {"exec": {"command": command}}
    merged = {
        **_STARTUP_DEFAULTS.model_dump(by_alias=True, exclude_none=True),
        **(timing.model_dump(by_alias=True, exclude_none=True) if timing else {}),
    }
    probe.update(merged)
    return probe


def _module_type(driver: DriverSpec) -> str:
    return "open" if driver.use_open_kernel_modules else driver.kernel_module_type


def _driver_container(spec: ClusterPolicySpec) -> dict[str, Any]:
    driver = spec.driver
    ready = (
        f"nvidia-smi -L >/dev/null && mkdir -p {READY_FILE.rsplit('/', 1)[0]} && touch {READY_FILE}"
    )
    extra: dict[str, Any] = {
        "startupProbe": _probe(["sh", "-c", ready], driver.startup_probe),
        "lifecycle": {"preStop": {"exec": {"command": ["sh", "-c", f"rm -f {READY_FILE}"]}}},
    }
    if driver.liveness_probe is not None:
        extra["livenessProbe"] = _probe(["nvidia-smi", "-L"], driver.liveness_probe)
    if driver.readiness_probe is not None:
        extra["readinessProbe"] = _probe(["test", "-f", READY_FILE], driver.readiness_probe)
    return container(
        CONTAINER_NAME,
        component_image(spec, "driver"),
        driver,
        command=["nvidia-driver"],
        args=["init"],
        env_vars=[env("KERNEL_MODULE_TYPE", _module_type(driver))],
        mounts=[
            mount("run-nvidia", "/run/nvidia", propagation="Bidirectional"),
            mount("var-log", "/var/log"),
            mount("dev-log", "/dev/log"),
            mount("host-os-release", "/host-etc/os-release", read_only=True),
            mount("firmware-search-path", "/sys/module/firmware_class/parameters/path"),
            mount("lib-firmware", "/lib/firmware"),
        ],
        privileged=True,
        extra=extra,
    )


def pod_spec(spec: ClusterPolicySpec) -> dict[str, Any]:
    """The driver pod spec (before the pod-wide settings); exposed for tests."""
    return {
        "serviceAccountName": SERVICE_ACCOUNT,
        "hostPID": True,
        "containers": [_driver_container(spec)],
        "imagePullSecrets": pull_secrets(spec.driver.image_pull_secrets),
        "volumes": [
            host_path("run-nvidia", "/run/nvidia", "DirectoryOrCreate"),
            host_path("var-log", "/var/log"),
            host_path("dev-log", "/dev/log"),
            host_path("host-os-release", "/etc/os-release"),
            host_path("firmware-search-path", "/sys/module/firmware_class/parameters/path"),
            host_path("lib-firmware", "/lib/firmware", "DirectoryOrCreate"),
        ],
    }


def update_strategy(spec: ClusterPolicySpec) -> dict[str, Any]:
    """OnDelete under automatic upgrades (the upgrade machine replaces pods node by node)."""
    if spec.driver.upgrade_policy.auto_upgrade:
        return {"type": "OnDelete"}
    return rolling_update_strategy(spec)


def render(spec: ClusterPolicySpec, ctx: RenderContext) -> list[Manifest]:
    if spec.driver.use_nvidia_driver_crd:
        return []  # NVIDIADriver resources own the driver DaemonSets then
    return [
        service_account(SERVICE_ACCOUNT, NAME, spec, ctx),
        daemonset(
            DAEMONSET_NAME,
            NAME,
            spec,
            ctx,
            pod_spec(spec),
            node_selector={DEPLOY_DRIVER_LABEL: TRUE},
            update_strategy=update_strategy(spec),
            pod_annotations={"kubectl.kubernetes.io/default-container": CONTAINER_NAME},
        ),
    ]


COMPONENT = Component(
    name=NAME, deploy_label=DEPLOY_DRIVER_LABEL, is_enabled=enabled, render=render
)
