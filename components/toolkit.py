"""container-toolkit: installs the NVIDIA runtime on each GPU node and configures the
node's container runtime to know it (the `nvidia` RuntimeClass handler).

It starts only once the driver works: its init container runs our driver check, which
also writes `driver-ready` for the operands after it.
"""

from __future__ import annotations

from typing import Any

from components._k8s import (
    DRIVER_ROOT,
    HOST_ROOT_MOUNT,
    VALIDATIONS_DIR,
    container,
    daemonset,
    driver_root,
    env,
    field_env,
    host_path,
    mount,
    pull_secrets,
    service_account,
    validations_volume,
)
from components.component import Component
from components.context import Manifest, RenderContext
from components.keys import DEPLOY_TOOLKIT_LABEL, TRUE
from crd import ClusterPolicySpec, component_image

NAME = "container-toolkit"
DAEMONSET_NAME = "nvidia-container-toolkit-daemonset"
SERVICE_ACCOUNT = "nvidia-container-toolkit"
CONTAINER_NAME = "nvidia-container-toolkit-ctr"

_RUNTIME_CONFIG = {
    "containerd": ("/etc/containerd", "/runtime/config-dir/", "/run/containerd"),
    "crio": ("/etc/crio", "/runtime/config-dir/", "/var/run/crio"),
    "docker": ("/etc/docker", "/runtime/config-dir/", "/var/run"),
}
"""Host config directory, its mount point, and the runtime's socket directory."""


def enabled(spec: ClusterPolicySpec) -> bool:
    return spec.toolkit.enabled


def driver_wait(spec: ClusterPolicySpec, ctx: RenderContext) -> dict[str, Any]:
    """Init container: retry our driver check until NVML works (writes `driver-ready`)."""
    root = DRIVER_ROOT if spec.driver.enabled else HOST_ROOT_MOUNT
    check = f"gpuop node-agent validate --checks driver --driver-root {root}"
    return {
        "name": "driver-validation",
        "image": ctx.operator_image,
        "imagePullPolicy": ctx.operator_image_pull_policy,
        "command": ["sh", "-c", f"until {check}; do sleep 5; done"],
        "env": [field_env("NODE_NAME", "spec.nodeName")],
        "securityContext": {"privileged": True},
        "volumeMounts": [
            mount("run-nvidia-validations", VALIDATIONS_DIR),
            mount("driver-root", DRIVER_ROOT, read_only=True, propagation="HostToContainer"),
            mount("host-root", HOST_ROOT_MOUNT, read_only=True, propagation="HostToContainer"),
        ],
    }


def render(spec: ClusterPolicySpec, ctx: RenderContext) -> list[Manifest]:
    toolkit = spec.toolkit
    runtime = spec.operator.default_runtime
    host_dir, mount_dir, socket_dir = _RUNTIME_CONFIG[runtime]
    main = container(
        CONTAINER_NAME,
        component_image(spec, "toolkit"),
        toolkit,
        env_vars=[
            env("RUNTIME", runtime),
            env("RUNTIME_CONFIG_DIR", mount_dir),
            env("NVIDIA_DRIVER_ROOT", driver_root(spec)),
            env("DRIVER_ROOT_CTR_PATH", "/driver-root"),
            env("TOOLKIT_INSTALL_DIR", toolkit.install_dir),
            env("CDI_ENABLED", str(spec.cdi.enabled).lower()),
            env("NVIDIA_RUNTIME_SET_AS_DEFAULT", "false"),
            field_env("NODE_NAME", "spec.nodeName"),
        ],
        mounts=[
            mount("run-nvidia", "/run/nvidia", propagation="HostToContainer"),
            mount("driver-root", "/driver-root", read_only=True, propagation="HostToContainer"),
            mount("toolkit-install-dir", toolkit.install_dir),
            mount("runtime-config", mount_dir),
            mount("runtime-socket", socket_dir),
            mount("cdi-root", "/var/run/cdi"),
            mount("host-root", HOST_ROOT_MOUNT, read_only=True, propagation="HostToContainer"),
        ],
        privileged=True,
    )
    pod = {
        "serviceAccountName": SERVICE_ACCOUNT,
        "hostPID": True,
        "initContainers": [driver_wait(spec, ctx)],
        "containers": [main],
        "imagePullSecrets": pull_secrets(
            toolkit.image_pull_secrets, ctx.operator_image_pull_secrets
        ),
        "volumes": [
            host_path("run-nvidia", "/run/nvidia", "DirectoryOrCreate"),
            validations_volume(),
            host_path("driver-root", driver_root(spec), "DirectoryOrCreate"),
            host_path("toolkit-install-dir", toolkit.install_dir, "DirectoryOrCreate"),
            host_path("runtime-config", host_dir, "DirectoryOrCreate"),
            host_path("runtime-socket", socket_dir),
            host_path("cdi-root", "/var/run/cdi", "DirectoryOrCreate"),
            host_path("host-root", spec.host_paths.root_fs),
        ],
    }
    return [
        service_account(SERVICE_ACCOUNT, NAME, spec, ctx),
        daemonset(DAEMONSET_NAME, NAME, spec, ctx, pod, node_selector={DEPLOY_TOOLKIT_LABEL: TRUE}),
    ]


COMPONENT = Component(
    name=NAME, deploy_label=DEPLOY_TOOLKIT_LABEL, is_enabled=enabled, render=render
)
