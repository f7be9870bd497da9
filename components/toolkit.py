"""container-toolkit: installs the NVIDIA runtime on each GPU node and configures the
node's container runtime to know it (the `nvidia` RuntimeClass handler).

The runtime it configures is the one the GPU nodes run (`status.nodeInfo.
containerRuntimeVersion`, via the render context), not `operator.defaultRuntime`: a
containerd node given docker's config paths would never get the `nvidia` handler.
It starts only once the driver works: its init container runs our driver check, which
also writes `driver-ready` for the operands after it.
"""

from __future__ import annotations

import posixpath
from typing import Any

from components import _entrypoint_operand as entry
from components._accounts import SCC_RULE
from components._host_paths import (
    DRIVER_ROOT,
    host_path,
    host_root_mount,
    host_root_volume,
    mount,
    validations_mount,
    validations_volume,
)
from components._k8s import dump_env, env, field_env, merge_env, security_context
from components.component import rule
from components.context import CONTAINERD, CRIO, DOCKER, RenderContext
from components.keys import DEPLOY_TOOLKIT_LABEL
from components.kinds import CONFIG_MAP
from components.operand import Operand, Pod
from components.validator import driver_check_script
from crd import ClusterPolicySpec, component_image

NAME = "container-toolkit"
SECTION = "toolkit"
DAEMONSET_NAME = "nvidia-container-toolkit-daemonset"
CONTAINER_NAME = "nvidia-container-toolkit-ctr"
ENTRYPOINT = "nvidia-container-toolkit-entrypoint"
TOOLKIT_ROOT = "/run/nvidia/toolkit"
CONFIG_TARGET = "/runtime/config-dir/"
DROP_IN_TARGET = "/runtime/config-dir.d/"
SOCKET_TARGET = "/runtime/sock-dir/"
NRI_SOCKET = "/var/run/nri/nri.sock"
"""The container runtime's NRI socket on the host (upstream's default)."""
NRI_SOCKET_TARGET = "/runtime/nri-sock-dir/"

_DEFAULT_FILES: dict[str, tuple[str, str | None, str | None]] = {
    CONTAINERD: (
        "/etc/containerd/config.toml",
        "/etc/containerd/conf.d/99-nvidia.toml",
        "/run/containerd/containerd.sock",
    ),
    DOCKER: ("/etc/docker/daemon.json", None, "/var/run/docker.sock"),
    CRIO: ("/etc/crio/config.toml", "/etc/crio/crio.conf.d/99-nvidia.conf", None),
}
"""Per runtime: top-level config, drop-in config (none for docker), socket (none for
CRI-O, which reloads its config by itself)."""
_CONFIG_ENV = {CONTAINERD: "CONTAINERD_CONFIG", DOCKER: "DOCKER_CONFIG", CRIO: "CRIO_CONFIG"}
_SOCKET_ENV = {CONTAINERD: "CONTAINERD_SOCKET", DOCKER: "DOCKER_SOCKET"}


def driver_wait(spec: ClusterPolicySpec, ctx: RenderContext) -> dict[str, Any]:
    """Init container: retry our driver check until it passes (writes `driver-ready`).
    It gets `validator.driver.env` (e.g. DISABLE_DEV_CHAR_SYMLINK_CREATION), as
    upstream's driver-validation init containers do."""
    section = spec.validator.driver
    return {
        "name": "driver-validation",
        "image": ctx.operator_image,
        "command": ["sh", "-c"],
        "args": [driver_check_script(spec)],
        "env": merge_env(
            [field_env("NODE_NAME", "spec.nodeName")], dump_env(section.env if section else None)
        ),
        "securityContext": security_context(privileged=True, root=True, selinux_s0=True),
        "volumeMounts": [
            mount("driver-install-dir", DRIVER_ROOT, propagation="HostToContainer"),
            validations_mount("Bidirectional"),
            host_root_mount(),
            mount("host-dev-char", "/host-dev-char"),
        ],
    }


def _user_env(spec: ClusterPolicySpec, name: str) -> str | None:
    for var in spec.toolkit.env or ():
        if var.name == name and var.value:
            return var.value
    return None


def runtime_settings(
    spec: ClusterPolicySpec, runtime: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Env, mounts and volumes that let the toolkit edit `runtime`'s config and signal
    it. Paths set in `toolkit.env` (CONTAINERD_CONFIG, RUNTIME_DROP_IN_CONFIG...) win
    over the defaults, and the mounts follow them.

    With `cdi.nriPluginEnabled` the toolkit runs as the runtime's NRI plugin and leaves
    its config alone (read-only hosts such as Talos refuse those mounts): it gets the
    NRI socket's directory (NRI_SOCKET in `toolkit.env` moves it) instead."""
    if spec.cdi.nri_plugin_enabled:
        nri = _user_env(spec, "NRI_SOCKET") or NRI_SOCKET
        return (
            [
                env("RUNTIME", runtime),
                env("NRI_SOCKET", NRI_SOCKET_TARGET + posixpath.basename(nri)),
            ],
            [mount("nri-socket", NRI_SOCKET_TARGET)],
            [host_path("nri-socket", posixpath.dirname(nri), "DirectoryOrCreate")],
        )
    top, drop_in, socket = _DEFAULT_FILES[runtime]
    top = _user_env(spec, _CONFIG_ENV[runtime]) or _user_env(spec, "RUNTIME_CONFIG") or top
    if drop_in is not None:
        drop_in = _user_env(spec, "RUNTIME_DROP_IN_CONFIG") or drop_in
    if runtime in _SOCKET_ENV:
        socket = _user_env(spec, _SOCKET_ENV[runtime]) or socket
    env_vars = [env("RUNTIME", runtime)]
    if runtime == CONTAINERD:
        env_vars.append(env("CONTAINERD_RUNTIME_CLASS", spec.operator.runtime_class))
    mounts: list[dict[str, Any]] = []
    volumes: list[dict[str, Any]] = []
    in_ctr = CONFIG_TARGET + posixpath.basename(top)
    env_vars += [env("RUNTIME_CONFIG", in_ctr), env(_CONFIG_ENV[runtime], in_ctr)]
    mounts.append(mount(f"{runtime}-config", CONFIG_TARGET))
    volumes.append(host_path(f"{runtime}-config", posixpath.dirname(top), "DirectoryOrCreate"))
    if drop_in:
        env_vars += [
            env("RUNTIME_DROP_IN_CONFIG", DROP_IN_TARGET + posixpath.basename(drop_in)),
            env("RUNTIME_DROP_IN_CONFIG_HOST_PATH", drop_in),
        ]
        mounts.append(mount(f"{runtime}-drop-in-config", DROP_IN_TARGET))
        volumes.append(
            host_path(f"{runtime}-drop-in-config", posixpath.dirname(drop_in), "DirectoryOrCreate")
        )
    if socket:
        in_ctr = SOCKET_TARGET + posixpath.basename(socket)
        env_vars += [env("RUNTIME_SOCKET", in_ctr), env(_SOCKET_ENV[runtime], in_ctr)]
        mounts.append(mount(f"{runtime}-socket", SOCKET_TARGET))
        volumes.append(host_path(f"{runtime}-socket", posixpath.dirname(socket)))
    return env_vars, mounts, volumes


def pod(spec: ClusterPolicySpec, ctx: RenderContext) -> Pod:
    toolkit = spec.toolkit
    runtime_env, runtime_mounts, runtime_volumes = runtime_settings(spec, ctx.container_runtime)
    cdi = spec.cdi.enabled
    env_vars = [
        env("ROOT", toolkit.install_dir),
        env("NVIDIA_CONTAINER_RUNTIME_MODES_CDI_DEFAULT_KIND", "management.nvidia.com/gpu"),
        env("NVIDIA_VISIBLE_DEVICES", "void"),
        env("TOOLKIT_PID_FILE", f"{TOOLKIT_ROOT}/toolkit.pid"),
        field_env("NRI_NAMESPACE", "metadata.namespace"),
        env("CDI_ENABLED", str(cdi).lower()),
        env("NVIDIA_RUNTIME_SET_AS_DEFAULT", "false"),
    ]
    if cdi:
        env_vars.append(env("NVIDIA_CONTAINER_RUNTIME_MODE", "cdi"))
        if spec.cdi.nri_plugin_enabled:
            env_vars.append(env("ENABLE_NRI_PLUGIN", "true"))
    env_vars += [env("CRIO_CONFIG_MODE", "config"), *runtime_env]
    main = entry.entrypoint_container(
        CONTAINER_NAME,
        component_image(spec, SECTION),
        toolkit,
        ENTRYPOINT,
        env_vars=env_vars,
        mounts=[
            mount("toolkit-root", TOOLKIT_ROOT),
            validations_mount(),
            mount("toolkit-install-dir", toolkit.install_dir),
            mount("crio-hooks", "/usr/share/containers/oci/hooks.d"),
            entry.driver_root_mount(),
            host_root_mount(),
            entry.cdi_mount(),
            *runtime_mounts,
        ],
        selinux_s0=True,
    )
    # A path the user gave is the host's; the container sees it where it is mounted.
    main["env"] = merge_env(main["env"], runtime_env)
    volumes = [
        entry.entrypoint_volume(ENTRYPOINT),
        host_path("toolkit-root", TOOLKIT_ROOT, "DirectoryOrCreate"),
        validations_volume(),
        entry.driver_root_volume(spec),
        host_root_volume(spec),
        host_path("toolkit-install-dir", toolkit.install_dir),
        host_path("crio-hooks", "/run/containers/oci/hooks.d"),
        host_path("host-dev-char", "/dev/char"),
        entry.cdi_volume(),
        *runtime_volumes,
    ]
    init = [driver_wait(spec, ctx)]
    return Pod(containers=[main], init=init, volumes=volumes, fields={"hostPID": True})


_SCRIPT = entry.entrypoint_script(
    "nvidia-toolkit",
    # containerd >= 1.6.9 may send the toolkit a SIGTERM just after it restarts the
    # runtime; a short pause before installing avoids that crash loop.
    extra="sleep 5\n",
)

OPERAND = Operand(
    name=NAME,
    section=SECTION,
    daemonset=DAEMONSET_NAME,
    deploy_label=DEPLOY_TOOLKIT_LABEL,
    pod=pod,
    role=(SCC_RULE, rule("apps", "daemonsets", "list")),
    before=entry.entrypoint_objects(ENTRYPOINT, NAME, _SCRIPT, app=DAEMONSET_NAME),
    kinds=(CONFIG_MAP,),
)
COMPONENT = OPERAND.component()
