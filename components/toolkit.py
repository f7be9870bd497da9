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

from components._accounts import SCC_RULE, operand_account
from components._entrypoint_operand import (
    cdi_mount,
    cdi_volume,
    driver_root_mount,
    driver_root_volume,
    entrypoint_config_map,
    entrypoint_container,
    entrypoint_script,
    entrypoint_volume,
    host_root_mount,
    host_root_volume,
)
from components._host_paths import (
    DRIVER_ROOT,
    HOST_ROOT_MOUNT,
    VALIDATIONS_DIR,
    host_path,
    mount,
    validations_volume,
)
from components._k8s import (
    daemonset,
    dump_env,
    env,
    field_env,
    merge_env,
    pull_secrets,
    security_context,
)
from components.component import Component, Permissions
from components.context import CONTAINERD, CRIO, DOCKER, Manifest, RenderContext
from components.keys import DEPLOY_TOOLKIT_LABEL, TRUE
from components.kinds import CONFIG_MAP, DAEMONSET, NAMESPACED_RBAC
from components.validator import driver_check_script
from crd import ClusterPolicySpec, component_image

NAME = "container-toolkit"
DAEMONSET_NAME = "nvidia-container-toolkit-daemonset"
SERVICE_ACCOUNT = "nvidia-container-toolkit"
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

_RULES = [SCC_RULE, {"apiGroups": ["apps"], "resources": ["daemonsets"], "verbs": ["list"]}]


def enabled(spec: ClusterPolicySpec) -> bool:
    return spec.toolkit.enabled


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
            mount("run-nvidia-validations", VALIDATIONS_DIR, propagation="Bidirectional"),
            mount("host-root", HOST_ROOT_MOUNT, read_only=True, propagation="HostToContainer"),
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


def render(spec: ClusterPolicySpec, ctx: RenderContext) -> list[Manifest]:
    toolkit = spec.toolkit
    runtime = ctx.container_runtime
    runtime_env, runtime_mounts, runtime_volumes = runtime_settings(spec, runtime)
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
    main = entrypoint_container(
        CONTAINER_NAME,
        component_image(spec, "toolkit"),
        toolkit,
        ENTRYPOINT,
        env_vars=env_vars,
        mounts=[
            mount("toolkit-root", TOOLKIT_ROOT),
            mount("run-nvidia-validations", VALIDATIONS_DIR),
            mount("toolkit-install-dir", toolkit.install_dir),
            mount("crio-hooks", "/usr/share/containers/oci/hooks.d"),
            driver_root_mount(),
            host_root_mount(),
            cdi_mount(),
            *runtime_mounts,
        ],
        selinux_s0=True,
    )
    # A path the user gave is the host's; the container sees it where it is mounted.
    main["env"] = merge_env(main["env"], runtime_env)
    pod = {
        "serviceAccountName": SERVICE_ACCOUNT,
        "hostPID": True,
        "initContainers": [driver_wait(spec, ctx)],
        "containers": [main],
        "imagePullSecrets": pull_secrets(toolkit.image_pull_secrets),
        "volumes": [
            entrypoint_volume(ENTRYPOINT),
            host_path("toolkit-root", TOOLKIT_ROOT, "DirectoryOrCreate"),
            validations_volume(),
            driver_root_volume(spec),
            host_root_volume(spec),
            host_path("toolkit-install-dir", toolkit.install_dir),
            host_path("crio-hooks", "/run/containers/oci/hooks.d"),
            host_path("host-dev-char", "/dev/char"),
            cdi_volume(),
            *runtime_volumes,
        ],
    }
    return [
        *operand_account(SERVICE_ACCOUNT, NAME, spec, ctx, _RULES),
        entrypoint_config_map(ENTRYPOINT, NAME, _SCRIPT, spec, ctx, app=DAEMONSET_NAME),
        daemonset(
            DAEMONSET_NAME,
            NAME,
            spec,
            ctx,
            pod,
            node_selector={DEPLOY_TOOLKIT_LABEL: TRUE},
            host_network=spec.toolkit.host_network,
        ),
    ]


_SCRIPT = entrypoint_script(
    "nvidia-toolkit",
    # containerd >= 1.6.9 may send the toolkit a SIGTERM just after it restarts the
    # runtime; a short pause before installing avoids that crash loop.
    extra="sleep 5\n",
)

COMPONENT = Component(
    name=NAME,
    deploy_label=DEPLOY_TOOLKIT_LABEL,
    is_enabled=enabled,
    render=render,
    kinds=(*NAMESPACED_RBAC, CONFIG_MAP, DAEMONSET),
    permissions=Permissions(role=tuple(_RULES)),
)
