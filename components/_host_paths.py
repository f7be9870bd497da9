"""Where the driver stack lives on the host, and the volumes and mounts that reach it:
`/run/nvidia` (the driver container's root and the validations' status files), the
host's root and the kubelet's directories."""

from __future__ import annotations

from typing import Any

from crd import ClusterPolicySpec

VALIDATIONS_DIR = "/run/nvidia/validations"
DRIVER_ROOT = "/run/nvidia/driver"
HOST_ROOT_MOUNT = "/host"
RUN_NVIDIA = "/run/nvidia"


def host_path(name: str, path: str, kind: str | None = None) -> dict[str, Any]:
    source: dict[str, Any] = {"path": path}
    if kind:
        source["type"] = kind
    return {"name": name, "hostPath": source}


def config_map_volume(name: str, config_map: str, *, optional: bool = False) -> dict[str, Any]:
    source: dict[str, Any] = {"name": config_map}
    if optional:
        source["optional"] = True
    return {"name": name, "configMap": source}


def mount(
    name: str, path: str, *, read_only: bool = False, propagation: str | None = None
) -> dict[str, Any]:
    result: dict[str, Any] = {"name": name, "mountPath": path}
    if read_only:
        result["readOnly"] = True
    if propagation:
        result["mountPropagation"] = propagation
    return result


def run_nvidia_volume(kind: str | None = "Directory") -> dict[str, Any]:
    """`/run/nvidia` on the host (the driver container's and validations' parent)."""
    return host_path("run-nvidia", RUN_NVIDIA, kind)


def validations_volume() -> dict[str, Any]:
    return host_path("run-nvidia-validations", VALIDATIONS_DIR, "DirectoryOrCreate")


def validations_mount(propagation: str | None = None) -> dict[str, Any]:
    """The validations' status files, where every operand reads (or writes) them."""
    return mount("run-nvidia-validations", VALIDATIONS_DIR, propagation=propagation)


def host_root_mount(*, read_only: bool = True) -> dict[str, Any]:
    """The host's root at /host (where the checks and the entrypoints look for a
    host-installed driver), read-only unless asked."""
    return mount("host-root", HOST_ROOT_MOUNT, read_only=read_only, propagation="HostToContainer")


def host_root_volume(spec: ClusterPolicySpec) -> dict[str, Any]:
    return host_path("host-root", spec.host_paths.root_fs)


DEFAULT_KUBELET_ROOT = "/var/lib/kubelet"


def kubelet_path(spec: ClusterPolicySpec, child: str) -> str:
    """A directory of the kubelet on the host (`pod-resources`, `device-plugins`), under
    `spec.hostPaths.kubeletRootDir`; operands keep mounting it at the default path in
    their containers, where the NVIDIA binaries look for it."""
    root = spec.host_paths.kubelet_root_dir or DEFAULT_KUBELET_ROOT
    return f"{root.rstrip('/')}/{child}"


def driver_root(spec: ClusterPolicySpec) -> str:
    """Where the driver's files are on the host: the driver container's root when we run
    the driver, else the host's own root (a host-installed driver)."""
    return spec.host_paths.driver_install_dir if spec.driver.enabled else spec.host_paths.root_fs
