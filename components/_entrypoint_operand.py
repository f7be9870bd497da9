"""The operands that run our `entrypoint.sh` (toolkit, MIG manager, device plugin): the
container that runs it, and the host directories it finds the driver through, each
named once (the script reads the driver's files under /driver-root, the host's under
/host, and writes CDI specs to /var/run/cdi). Each operand keeps its own mount order."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from components._k8s import (
    HOST_ROOT_MOUNT,
    container,
    entrypoint_args,
    entrypoint_mount,
    host_path,
    mount,
)
from crd import ClusterPolicySpec, ComponentSpec

ENTRYPOINT_DRIVER_ROOT = "/driver-root"
CDI_DIR = "/var/run/cdi"


def entrypoint_container(
    name: str,
    image: str,
    section: ComponentSpec,
    entrypoint: str,
    *,
    env_vars: Sequence[dict[str, Any]],
    mounts: Sequence[dict[str, Any]],
    selinux_s0: bool = False,
) -> dict[str, Any]:
    """A privileged container running the `entrypoint` ConfigMap's script, which passes
    the policy section's args on to the operand's process."""
    return container(
        name,
        image,
        section,
        command=["/bin/sh", "-c"],
        args=entrypoint_args(section),
        section_args=False,
        env_vars=env_vars,
        mounts=[entrypoint_mount(entrypoint), *mounts],
        privileged=True,
        selinux_s0=selinux_s0,
    )


def driver_root_mount() -> dict[str, Any]:
    return mount("driver-install-dir", ENTRYPOINT_DRIVER_ROOT, propagation="HostToContainer")


def driver_root_volume(spec: ClusterPolicySpec) -> dict[str, Any]:
    return host_path("driver-install-dir", spec.host_paths.driver_install_dir, "DirectoryOrCreate")


def host_root_mount(*, read_only: bool = True) -> dict[str, Any]:
    return mount("host-root", HOST_ROOT_MOUNT, read_only=read_only, propagation="HostToContainer")


def host_root_volume(spec: ClusterPolicySpec) -> dict[str, Any]:
    return host_path("host-root", spec.host_paths.root_fs)


def cdi_mount() -> dict[str, Any]:
    return mount("cdi-root", CDI_DIR)


def cdi_volume() -> dict[str, Any]:
    return host_path("cdi-root", CDI_DIR, "DirectoryOrCreate")
