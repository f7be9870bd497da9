"""The config-manager pair the device plugin image ships, shared by the device plugin,
GPU feature discovery and the MPS control daemon.

`devicePlugin.config.name` names the user's ConfigMap (one config file per key). An init
container copies the key selected by the node's `nvidia.com/device-plugin.config` label
(or `devicePlugin.config.default`) into a shared emptyDir before the operand starts; a
sidecar watches the label, swaps the file and signals the operand to reload.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from components._host_paths import config_map_volume, mount
from components._k8s import env, field_env
from components.keys import DEVICE_PLUGIN_CONFIG_LABEL
from components.operand import Pod
from crd import ClusterPolicySpec, component_image

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


def operand_settings(spec: ClusterPolicySpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The env and mounts telling the operand where its config is, if there is one."""
    if not configured(spec):
        return [], []
    return [env("CONFIG_FILE", CONFIG_FILE)], operand_mounts()


def with_config(spec: ClusterPolicySpec, pod: Pod, process: str) -> Pod:
    """`pod` of an operand that can run under the config manager: with a config, the
    init container, the sidecar and their volumes join it, and it shares its process
    namespace (unless it uses the host's) so the sidecar can signal `process`."""
    if not configured(spec):
        return pod
    fields = dict(pod.fields)
    if not fields.get("hostPID"):
        # In the host's PID namespace (MPS) the sidecar already sees the operand; the
        # API server refuses a pod that sets both.
        fields["shareProcessNamespace"] = True
    return replace(
        pod,
        containers=[*pod.containers, sidecar(spec, process)],
        init=[*pod.init, init_container(spec, process)],
        volumes=[*pod.volumes, *volumes(spec)],
        fields=fields,
    )
