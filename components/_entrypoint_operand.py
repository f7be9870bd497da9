"""The operands that run our `entrypoint.sh` (toolkit, MIG manager, device plugin): the
script (wait for the driver's validation, export its facts, become the operand), its
ConfigMap, the container that runs it, and the host directories it finds the driver
through, each named once (the script reads the driver's files under /driver-root, the
host's under /host, and writes CDI specs to /var/run/cdi). Each operand keeps its own
mount order."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any

from components._host_paths import VALIDATIONS_DIR, host_path, mount
from components._k8s import config_map, container, with_app_label
from components.context import Manifest, RenderContext
from components.operand import Objects
from crd import ClusterPolicySpec, ComponentSpec, ImageSpec

ENTRYPOINT_DRIVER_ROOT = "/driver-root"
CDI_DIR = "/var/run/cdi"


def entrypoint_config_map(
    name: str,
    component: str,
    script: str,
    spec: ClusterPolicySpec,
    ctx: RenderContext,
    *,
    app: str,
) -> Manifest:
    """A ConfigMap holding an operand's `entrypoint.sh` (mounted at /bin/entrypoint.sh),
    labelled `app=<its DaemonSet>` as upstream's."""
    return with_app_label(config_map(name, component, spec, ctx, {"entrypoint.sh": script}), app)


def entrypoint_objects(name: str, component: str, script: str, *, app: str) -> Objects:
    """An operand's `before` objects: the ConfigMap `name` of its `script`."""

    def objects(spec: ClusterPolicySpec, ctx: RenderContext) -> list[Manifest]:
        return [entrypoint_config_map(name, component, script, spec, ctx, app=app)]

    return objects


def entrypoint_volume(config_map: str) -> dict[str, Any]:
    return {"name": config_map, "configMap": {"name": config_map, "defaultMode": 0o700}}


def entrypoint_mount(config_map: str) -> dict[str, Any]:
    return {
        "name": config_map,
        "mountPath": "/bin/entrypoint.sh",
        "subPath": "entrypoint.sh",
        "readOnly": True,
    }


def entrypoint_args(section: ImageSpec) -> list[str]:
    """`sh -c` args running /bin/entrypoint.sh with the section's args for the process."""
    user = list(section.args or ()) if isinstance(section, ComponentSpec) else []
    return [" ".join(["/bin/entrypoint.sh", *(shlex.quote(a) for a in user)])]


def entrypoint_script(process: str, *, extra: str = "") -> str:
    """Our entrypoint for an operand that needs the driver's facts: wait for the
    validator's `driver-ready`, export what it says (IS_HOST_DRIVER,
    NVIDIA_DRIVER_ROOT...), then become `process`."""
    ready = f"{VALIDATIONS_DIR}/driver-ready"
    return (
        "#!/bin/sh\n"
        f"until [ -f {ready} ]; do\n"
        '  echo "waiting for the driver validation to pass"\n'
        "  sleep 5\n"
        "done\n"
        "set -o allexport\n"
        f". {ready}\n"
        "set +o allexport\n"
        f"{extra}"
        f'exec {process} "$@"\n'
    )


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


def cdi_mount() -> dict[str, Any]:
    return mount("cdi-root", CDI_DIR)


def cdi_volume() -> dict[str, Any]:
    return host_path("cdi-root", CDI_DIR, "DirectoryOrCreate")
