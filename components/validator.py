"""operator-validation: our node agent checks driver, toolkit, CUDA and device plugin in
order and writes the `*-ready` status files that later operands wait for.

The pod turns Ready only at `plugin-ready`, i.e. after the device plugin (a later rollout
state) advertises GPUs: the component therefore does not gate the rollout, but its pods'
readiness is what the driver upgrade's validation step waits for.
"""

from __future__ import annotations

from typing import Any

from components._accounts import (
    READ_NODES,
    SCC_RULE,
    operand_account,
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
    PART_OF,
    PART_OF_LABEL,
    container,
    daemonset,
    dump_env,
    field_env,
    gpu_access,
    merge_env,
)
from components.component import Component, Permissions
from components.context import Manifest, RenderContext
from components.keys import DEPLOY_VALIDATOR_LABEL, TRUE
from components.kinds import CLUSTER_RBAC, DAEMONSET, NAMESPACED_RBAC
from crd import CUDA_SAMPLE_IMAGE, ClusterPolicySpec, ValidatorComponentSpec

NAME = "operator-validation"
DAEMONSET_NAME = "nvidia-operator-validator"
SERVICE_ACCOUNT = "nvidia-operator-validator"
CONTAINER_NAME = "nvidia-operator-validator"
CUDA_IMAGE_ENV = "CUDA_SAMPLE_IMAGE"
"""Set in `validator.cuda.env` to replace the CUDA sample image (private registries)."""
WITH_WORKLOAD_ENV = "WITH_WORKLOAD"
"""`true` in `validator.plugin.env`: also run a pod requesting a GPU after allocatable."""
DEFAULT_TOOLKIT_DIR = "/usr/local/nvidia"

_ROLE_RULES = [
    SCC_RULE,
    {
        "apiGroups": [""],
        "resources": ["pods"],
        "verbs": ["create", "get", "list", "watch", "update", "patch", "delete"],
    },
    {"apiGroups": ["apps"], "resources": ["daemonsets"], "verbs": ["get", "list", "watch"]},
]
"""It runs (and cleans up) the CUDA and plugin workload pods and reads operand DaemonSets."""
_CLUSTER_RULES = [
    READ_NODES,
    {
        "apiGroups": ["nvidia.com"],
        "resources": ["clusterpolicies/finalizers", "nvidiadrivers/finalizers"],
        "verbs": ["create", "get", "list", "watch", "update", "patch", "delete"],
    },
]
"""Workload pods may carry owner references to the policy (blockOwnerDeletion needs
the owner's finalizers subresource where that admission check is on)."""


def enabled(spec: ClusterPolicySpec) -> bool:
    return spec.validator.enabled


def _env_value(section: ValidatorComponentSpec | None, name: str) -> str | None:
    for var in (section.env or ()) if section else ():
        if var.name == name and var.value:
            return var.value
    return None


def cuda_image(spec: ClusterPolicySpec) -> str:
    """The CUDA sample the cuda check runs: `validator.cuda.env` CUDA_SAMPLE_IMAGE or ours."""
    return _env_value(spec.validator.cuda, CUDA_IMAGE_ENV) or CUDA_SAMPLE_IMAGE


def driver_check_args(spec: ClusterPolicySpec) -> list[str]:
    """Where the driver check looks, as upstream's validator under this policy: a driver
    on the host (mounted at /host) wins, else the install directory (mounted at
    /run/nvidia/driver); with a driver DaemonSet, after its `.driver-ctr-ready`."""
    args = ["--driver-root", DRIVER_ROOT, "--host-root", HOST_ROOT_MOUNT]
    paths = spec.host_paths
    if paths.root_fs not in ("", "/"):
        args += ["--host-rootfs", paths.root_fs]
    if paths.driver_install_dir not in ("", DRIVER_ROOT):
        args += ["--driver-install-dir", paths.driver_install_dir]
    if spec.driver.enabled:
        args.append("--driver-container")
    return args


def command(spec: ClusterPolicySpec) -> list[str]:
    """`gpuop node-agent validate --wait ...` with this policy's settings."""
    validator = spec.validator
    cmd = [
        "gpuop",
        "node-agent",
        "validate",
        "--wait",
        *driver_check_args(spec),
        "--validations-dir",
        VALIDATIONS_DIR,
        "--cuda-image",
        cuda_image(spec),
        "--runtime-class",
        # workload pods ask for the validator pod's own class, none with the NRI plugin
        gpu_access(spec, CONTAINER_NAME)[0].get("runtimeClassName", ""),
    ]
    for secret in validator.image_pull_secrets or ():
        cmd += ["--image-pull-secret", secret]
    if (_env_value(validator.plugin, WITH_WORKLOAD_ENV) or "").lower() == TRUE:
        cmd.append("--plugin-workload")
    install_dir = spec.toolkit.install_dir.rstrip("/")
    if install_dir != DEFAULT_TOOLKIT_DIR:
        toolkit = f"{install_dir}/toolkit"
        cmd += [
            "--toolkit-runtime-dirs",
            f"{toolkit},/usr/bin,/usr/local/bin",
            "--toolkit-config-paths",
            f"{toolkit}/.config/nvidia-container-runtime/config.toml,"
            "/etc/nvidia-container-runtime/config.toml",
        ]
    return cmd


def render(spec: ClusterPolicySpec, ctx: RenderContext) -> list[Manifest]:
    validator = spec.validator
    steps = (validator.driver, validator.toolkit, validator.cuda, validator.plugin)
    main = container(
        CONTAINER_NAME,
        ctx.operator_image,
        validator,
        command=command(spec),
        env_vars=merge_env(
            [
                field_env("NODE_NAME", "spec.nodeName"),
                field_env("POD_NAME", "metadata.name"),
                field_env("POD_NAMESPACE", "metadata.namespace"),
                field_env("POD_UID", "metadata.uid"),
            ],
            *(dump_env(step.env) for step in steps if step is not None),
        ),
        # One container does what upstream's four validation init containers do, so it
        # carries their mounts: validations shared back to the host, the driver root,
        # the host's root and /dev/char.
        mounts=[
            mount("run-nvidia-validations", VALIDATIONS_DIR, propagation="Bidirectional"),
            mount("driver-install-dir", DRIVER_ROOT, propagation="HostToContainer"),
            mount("host-root", HOST_ROOT_MOUNT, read_only=True, propagation="HostToContainer"),
            mount("host-dev-char", "/host-dev-char"),
        ],
        privileged=True,
        root=True,
        selinux_s0=True,  # as upstream's driver-validation: it links /dev/char
        extra={
            "readinessProbe": {
                "exec": {"command": ["test", "-f", f"{VALIDATIONS_DIR}/plugin-ready"]},
                "periodSeconds": 5,
            },
            # Operands wait on these files: a stopped validator must not leave them.
            "lifecycle": {
                "preStop": {"exec": {"command": ["sh", "-c", f"rm -f {VALIDATIONS_DIR}/*-ready"]}}
            },
        },
    )
    # our one container runs upstream's toolkit-validation, the one it annotates
    runtime, nri = gpu_access(spec, CONTAINER_NAME)
    pod: dict[str, Any] = {
        "serviceAccountName": SERVICE_ACCOUNT,
        **runtime,
        "containers": [main],
        "volumes": [
            validations_volume(),
            host_path("driver-install-dir", spec.host_paths.driver_install_dir),
            host_path("host-root", spec.host_paths.root_fs),
            host_path("host-dev-char", "/dev/char"),
        ],
    }
    return [
        *operand_account(SERVICE_ACCOUNT, NAME, spec, ctx, _ROLE_RULES, _CLUSTER_RULES),
        daemonset(
            DAEMONSET_NAME,
            NAME,
            spec,
            ctx,
            pod,
            node_selector={DEPLOY_VALIDATOR_LABEL: TRUE},
            pod_annotations=nri,
            host_network=spec.validator.host_network,
            selector_labels={PART_OF_LABEL: PART_OF},  # upstream's selector (immutable)
        ),
    ]


COMPONENT = Component(
    name=NAME,
    deploy_label=DEPLOY_VALIDATOR_LABEL,
    is_enabled=enabled,
    render=render,
    kinds=(*NAMESPACED_RBAC, *CLUSTER_RBAC, DAEMONSET),
    permissions=Permissions(role=tuple(_ROLE_RULES), cluster=tuple(_CLUSTER_RULES)),
)
