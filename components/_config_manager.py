"""The config-manager pair the device plugin image ships, shared by the device plugin,
GPU feature discovery and the MPS control daemon.

`devicePlugin.config.name` names the user's ConfigMap (one config file per key). An init
container copies the key selected by the node's `nvidia.com/device-plugin.config` label
(or `devicePlugin.config.default`) into a shared emptyDir before the operand starts; a
sidecar watches the label, swaps the file and signals the operand to reload.
"""

from __future__ import annotations

from typing import Any

from components._accounts import (
    READ_NODES,
    operand_account,
)
from components._host_paths import config_map_volume, mount
from components._k8s import daemonset, env, field_env, gpu_access, pull_secrets
from components.component import Permissions, Rule
from components.context import Manifest, RenderContext
from components.keys import DEVICE_PLUGIN_CONFIG_LABEL
from crd import ClusterPolicySpec, ComponentSpec, component_image

CONFIG_DIR = "/config"
CONFIG_FILE = f"{CONFIG_DIR}/config.yaml"
AVAILABLE_DIR = "/available-configs"


def configured(spec: ClusterPolicySpec) -> bool:
    """Whether the policy names a device plugin ConfigMap."""
    config = spec.device_plugin.config
    return bool(config and config.name)


def _container(
    spec: ClusterPolicySpec, name: str, process: str, *, oneshot: bool
) -> dict[str, Any]:
    config = spec.device_plugin.config
    default = (config.default if config else None) or ""
    result: dict[str, Any] = {
        "name": name,
        "image": component_image(spec, "devicePlugin"),
        "imagePullPolicy": spec.device_plugin.image_pull_policy,
        "command": ["config-manager"],
        "env": [
            env("ONESHOT", str(oneshot).lower()),
            env("KUBECONFIG", ""),
            field_env("NODE_NAME", "spec.nodeName"),
            env("NODE_LABEL", DEVICE_PLUGIN_CONFIG_LABEL),
            env("CONFIG_FILE_SRCDIR", AVAILABLE_DIR),
            env("CONFIG_FILE_DST", CONFIG_FILE),
            env("DEFAULT_CONFIG", default),
            env("SEND_SIGNAL", str(not oneshot).lower()),
            # Only the sidecar signals the operand (SIGHUP) after swapping its config.
            env("SIGNAL", "" if oneshot else "1"),
            env("PROCESS_TO_SIGNAL", "" if oneshot else process),
            # No label and no default: an empty config, i.e. the operand's defaults.
            env("FALLBACK_STRATEGIES", "empty"),
        ],
        "volumeMounts": [mount("config", CONFIG_DIR), mount("available-configs", AVAILABLE_DIR)],
    }
    if not oneshot:
        result["securityContext"] = {"privileged": True}
    return result


def init_container(spec: ClusterPolicySpec, process: str) -> dict[str, Any]:
    """Writes the node's config file once, before the operand starts."""
    return _container(spec, "config-manager-init", process, oneshot=True)


def sidecar(spec: ClusterPolicySpec, process: str) -> dict[str, Any]:
    """Follows label changes and signals `process` to reload."""
    return _container(spec, "config-manager", process, oneshot=False)


def volumes(spec: ClusterPolicySpec) -> list[dict[str, Any]]:
    config = spec.device_plugin.config
    name = config.name if config and config.name else ""
    return [config_map_volume("available-configs", name), {"name": "config", "emptyDir": {}}]


def operand_mounts() -> list[dict[str, Any]]:
    """The operand sees the selected config and every available one."""
    return [mount("config", CONFIG_DIR), mount("available-configs", AVAILABLE_DIR)]


def operand_daemonset(
    spec: ClusterPolicySpec,
    ctx: RenderContext,
    section: ComponentSpec,
    *,
    component: str,
    daemonset_name: str,
    service_account_name: str,
    process: str,
    init: list[dict[str, Any]],
    main: dict[str, Any],
    operand_volumes: list[dict[str, Any]],
    node_selector: dict[str, str],
    pod: dict[str, Any] | None = None,
    selector_labels: dict[str, str] | None = None,
) -> Manifest:
    """The DaemonSet of an operand that can run under the config manager: with a config,
    the init container, the sidecar and their volumes join the pod, and the pod shares
    its process namespace (unless it uses the host's) so the sidecar can signal the
    operand. `main` reaches every GPU (`gpu_access`); the policy's `section` gives pull
    secrets and host networking."""
    with_config = configured(spec)
    init = list(init)
    containers = [main]
    all_volumes = list(operand_volumes)
    runtime, nri = gpu_access(spec, main["name"])
    pod = {
        "serviceAccountName": service_account_name,
        **runtime,
        **(pod or {}),
        "imagePullSecrets": pull_secrets(section.image_pull_secrets),
    }
    if with_config:
        init.append(init_container(spec, process))
        containers.append(sidecar(spec, process))
        all_volumes += volumes(spec)
        if not pod.get("hostPID"):
            # In the host's PID namespace (MPS) the sidecar already sees the operand;
            # the API server refuses a pod that sets both.
            pod["shareProcessNamespace"] = True
    pod.update({"initContainers": init, "containers": containers, "volumes": all_volumes})
    return daemonset(
        daemonset_name,
        component,
        spec,
        ctx,
        pod,
        node_selector=node_selector,
        pod_annotations=nri,
        host_network=section.host_network,
        selector_labels=selector_labels,
    )


def permissions(role_rules: list[Rule]) -> Permissions:
    """What `operand_rbac` grants, for the operand's `Component.permissions`."""
    return Permissions(role=tuple(role_rules), cluster=(READ_NODES,))


def operand_rbac(
    name: str,
    component: str,
    spec: ClusterPolicySpec,
    ctx: RenderContext,
    *,
    role_rules: list[dict[str, Any]],
) -> list[Manifest]:
    """ServiceAccount `name`, its Role and a ClusterRole reading Nodes (the config
    manager follows its node's label; the operands read their node)."""
    return [
        *operand_account(name, component, spec, ctx, role_rules, [READ_NODES]),
    ]
