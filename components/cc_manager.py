"""cc-manager: sets the confidential-computing mode of a VM host's GPUs (Kata mode only).

A node's `nvidia.com/cc.mode` label picks the mode (`on`, `off`, `devtools`), else
`ccManager.defaultMode`; the manager applies it, labels the node with what it did, and
marks itself ready in `.cc-manager-ctr-ready`, which the sandbox validator waits for
(the file goes when the pod stops).
"""

from __future__ import annotations

from typing import Any

from components._accounts import SCC_RULE
from components._host_paths import RUN_NVIDIA, VALIDATIONS_DIR, host_path, mount
from components._k8s import env, field_env, pull_secrets
from components._sandbox import (
    MANAGER_RESOURCES,
    Operand,
    operand_container,
    operand_objects,
    sandbox_enabled,
)
from components.component import VM_HOSTS, Component, Permissions
from components.context import Manifest, RenderContext
from components.keys import DEPLOY_CC_MANAGER_LABEL, KATA_MODE
from components.kinds import CLUSTER_RBAC, DAEMONSET, NAMESPACED_RBAC
from crd import ClusterPolicySpec, component_image

NAME = "cc-manager"
DAEMONSET_NAME = "nvidia-cc-manager"
SERVICE_ACCOUNT = "nvidia-cc-manager"
CONTAINER_NAME = "nvidia-cc-manager"
SELECTOR_KEY = "name"
"""Upstream's DaemonSet selects its pods by `name` (selectors are immutable)."""
READY_FILE = f"{VALIDATIONS_DIR}/.cc-manager-ctr-ready"
DEFAULT_MODE_ENV = "DEFAULT_CC_MODE"

_ROLE_RULES = [
    SCC_RULE,
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
]
_CLUSTER_RULES = [
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch", "watch"]},
]
"""It reads its node's `nvidia.com/cc.mode` and labels the node with the mode set."""


def enabled(spec: ClusterPolicySpec) -> bool:
    """Upstream runs the CC manager only for Kata (confidential containers)."""
    return (
        sandbox_enabled(spec)
        and spec.cc_manager.enabled
        and spec.sandbox_workloads.mode == KATA_MODE
    )


_OPERAND = Operand(
    NAME, DAEMONSET_NAME, SERVICE_ACCOUNT, DEPLOY_CC_MANAGER_LABEL, _ROLE_RULES, _CLUSTER_RULES
)


def render(spec: ClusterPolicySpec, ctx: RenderContext) -> list[Manifest]:
    manager = spec.cc_manager
    main = operand_container(
        CONTAINER_NAME,
        component_image(spec, "ccManager"),
        manager,
        default_resources=MANAGER_RESOURCES,
        env_vars=[
            field_env("NODE_NAME", "spec.nodeName"),
            env("NVIDIA_VISIBLE_DEVICES", "void"),
            env(DEFAULT_MODE_ENV, manager.default_mode),
        ],
        mounts=[mount("host-sys", "/sys"), mount("run-nvidia", RUN_NVIDIA)],
        selinux_s0=True,
        extra={"lifecycle": {"preStop": {"exec": {"command": ["/bin/rm", "-f", READY_FILE]}}}},
    )
    pod: dict[str, Any] = {
        "containers": [main],
        "imagePullSecrets": pull_secrets(manager.image_pull_secrets),
        "volumes": [
            host_path("host-sys", "/sys", "Directory"),
            host_path("run-nvidia", RUN_NVIDIA, "DirectoryOrCreate"),
        ],
    }
    return operand_objects(spec, ctx, manager, pod, _OPERAND, selector_key=SELECTOR_KEY)


COMPONENT = Component(
    name=NAME,
    deploy_label=DEPLOY_CC_MANAGER_LABEL,
    is_enabled=enabled,
    render=render,
    kinds=(*NAMESPACED_RBAC, *CLUSTER_RBAC, DAEMONSET),
    permissions=Permissions(role=tuple(_ROLE_RULES), cluster=tuple(_CLUSTER_RULES)),
    placement=VM_HOSTS,
)
