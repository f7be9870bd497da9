"""The driver pod's containers besides the driver: the driver manager's init container
(before an install it evicts GPU pods and unloads a running driver) and the GPUDirect
sidecars (nvidia-peermem, nvidia-fs, gdrdrv), each loading its kernel module next to
the driver. Split from `components.driver`, which builds the pod around them.
"""

from __future__ import annotations

from typing import Any

from components._host_paths import host_root_mount, mount
from components._k8s import container, env, field_env
from components.context import RenderContext
from components.driver_digest import DIGEST_ENV
from crd import ClusterPolicySpec, component_image

"""The driver manager evicts GPU pods and labels its node before it unloads a driver."""

_MANAGER_DEFAULT_ENV = (
    ("ENABLE_GPU_POD_EVICTION", "true"),
    ("ENABLE_AUTO_DRAIN", "false"),
    ("DRAIN_USE_FORCE", "false"),
    ("DRAIN_POD_SELECTOR_LABEL", ""),
    ("DRAIN_TIMEOUT_SECONDS", "0s"),
    ("DRAIN_DELETE_EMPTYDIR_DATA", "false"),
)
"""Before unloading a driver the manager evicts pods using GPUs but does not drain the
node (the upgrade state machine drains when the policy asks it to)."""


def rdma_enabled(spec: ClusterPolicySpec) -> bool:
    return spec.driver.rdma is not None and spec.driver.rdma.enabled


def with_os_tag(image: str, os_tag: str | None) -> str:
    """Append the OS tag, unless the image is pinned by digest (upstream's rule)."""
    if "sha256:" in image or not os_tag:
        return image
    return f"{image}-{os_tag}"


def manager_init_container(spec: ClusterPolicySpec) -> dict[str, Any]:
    """Init container: before (re)installing, evict GPU pods and unload a running driver."""
    manager = spec.driver.manager
    user_env = {v.name: v for v in (manager.env if manager and manager.env else ())}
    defaults = [env(k, v) for k, v in _MANAGER_DEFAULT_ENV if k not in user_env]
    result: dict[str, Any] = {
        "name": "k8s-driver-manager",
        "image": component_image(spec, "driver.manager"),
        "imagePullPolicy": manager.image_pull_policy if manager else "IfNotPresent",
        "command": ["driver-manager"],
        "args": ["uninstall_driver"],
        "env": [
            field_env("NODE_NAME", "spec.nodeName"),
            env("NVIDIA_VISIBLE_DEVICES", "void"),
            *defaults,
            *(
                v.model_dump(mode="json", by_alias=True, exclude_none=True)
                for v in user_env.values()
            ),
            field_env("OPERATOR_NAMESPACE", "metadata.namespace"),
            env(DIGEST_ENV, ""),  # filled in by pod_spec
            *([env("GPU_DIRECT_RDMA_ENABLED", "true")] if rdma_enabled(spec) else []),
        ],
        "securityContext": {"privileged": True},
        "volumeMounts": [
            mount("run-nvidia", "/run/nvidia", propagation="Bidirectional"),
            host_root_mount(),
            mount("host-sys", "/sys"),
            mount("run-mellanox-drivers", "/run/mellanox/drivers", propagation="HostToContainer"),
        ],
    }
    return result


_MODULE_WAIT = (
    "until [ -d /run/nvidia/driver/usr/src ] && lsmod | grep nvidia; do "
    "echo waiting for the nvidia driver to be installed; sleep 10; done; exec {}"
)


def gpudirect_sidecars(
    spec: ClusterPolicySpec, ctx: RenderContext, driver_image: str
) -> list[dict[str, Any]]:
    """GPUDirect kernel modules, each loaded next to the driver by its own container
    (nvidia-peermem runs from the driver's image)."""
    common_mounts = [
        mount("run-nvidia", "/run/nvidia", propagation="HostToContainer"),
        mount("var-log", "/var/log"),
        mount("dev-log", "/dev/log", read_only=True),
    ]
    result = []
    if rdma_enabled(spec) and not (spec.driver.rdma and spec.driver.rdma.use_host_mofed):
        probe = ["sh", "-c", "nvidia-driver probe_nvidia_peermem"]
        result.append(
            container(
                "nvidia-peermem-ctr",
                driver_image,
                spec.driver,
                command=["nvidia-driver"],
                args=["reload_nvidia_peermem"],
                mounts=[
                    *common_mounts[:1],
                    mount("run-nvidia", "/run/nvidia", propagation="Bidirectional"),
                    *common_mounts[1:],
                    mount(
                        "run-mellanox-drivers",
                        "/run/mellanox/drivers",
                        propagation="HostToContainer",
                    ),
                ][1:],
                privileged=True,
                selinux_s0=True,
                extra={
                    "livenessProbe": {
                        "exec": {"command": probe},
                        "periodSeconds": 30,
                        "failureThreshold": 1,
                        "initialDelaySeconds": 30,
                        "timeoutSeconds": 10,
                    },
                    "startupProbe": {
                        "exec": {"command": probe},
                        "periodSeconds": 10,
                        "failureThreshold": 120,
                        "initialDelaySeconds": 10,
                        "timeoutSeconds": 10,
                    },
                },
            )
        )
    for section, name, key, module, installer in (
        (spec.gds, "nvidia-fs-ctr", "gds", "nvidia_fs", "nvidia-gds-driver"),
        (spec.gdrcopy, "nvidia-gdrcopy-ctr", "gdrcopy", "gdrdrv", "nvidia-gdrcopy-driver"),
    ):
        if not section.enabled:
            continue
        result.append(
            container(
                name,
                with_os_tag(component_image(spec, key), ctx.os_tag),
                section,
                command=["bash", "-xc"],
                args=[_MODULE_WAIT.format(f"{installer} install")],
                mounts=common_mounts,
                privileged=True,
                selinux_s0=True,
                extra={
                    "startupProbe": {
                        "exec": {"command": ["sh", "-c", f"lsmod | grep {module}"]},
                        "periodSeconds": 10,
                        "failureThreshold": 120,
                        "initialDelaySeconds": 10,
                        "timeoutSeconds": 10,
                    }
                },
            )
        )
    return result
