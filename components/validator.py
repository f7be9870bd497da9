"""operator-validation: our node agent checks driver, toolkit, CUDA and device plugin in
order and writes the `*-ready` status files that later operands wait for.

As upstream's `nvidia-operator-validator`, the pod runs the driver and toolkit checks
in init containers: `driver-validation` retries the driver check until it passes, then
`toolkit-validation` is created, asking the runtime for every GPU
(`NVIDIA_VISIBLE_DEVICES=all` under the `nvidia` RuntimeClass, or the NRI plugin's
annotation), so the runtime's hook injects the now-ready driver and `nvidia-smi` runs
in it: that proves a GPU container can start (the file checks remain its fallback,
and `toolkit-ready` says which ran). Asking for GPUs in a container started before the
driver works would fail its start and back the pod off for minutes, hence the order.
The main container then runs the CUDA and plugin checks and stays up.

The pod turns Ready only at `plugin-ready`, i.e. after the device plugin (a later rollout
state) advertises GPUs: the component therefore does not gate the rollout, but its pods'
readiness is what the driver upgrade's validation step waits for.
"""

from __future__ import annotations

import shlex
from typing import Any

from components._accounts import READ_NODES, SCC_RULE
from components._host_paths import (
    DRIVER_ROOT,
    HOST_ROOT_MOUNT,
    VALIDATIONS_DIR,
    host_path,
    host_root_mount,
    host_root_volume,
    mount,
    validations_mount,
    validations_volume,
)
from components._k8s import (
    PART_OF,
    PART_OF_LABEL,
    container,
    dump_env,
    env,
    field_env,
    gpu_access,
    merge_env,
    security_context,
)
from components.component import rule
from components.context import RenderContext
from components.keys import DEPLOY_VALIDATOR_LABEL, TRUE
from components.operand import Operand, Pod
from crd import CUDA_SAMPLE_IMAGE, ClusterPolicySpec, ValidatorComponentSpec

NAME = "operator-validation"
SECTION = "validator"
DAEMONSET_NAME = "nvidia-operator-validator"
CONTAINER_NAME = "nvidia-operator-validator"
DRIVER_VALIDATION = "driver-validation"
TOOLKIT_VALIDATION = "toolkit-validation"
CUDA_IMAGE_ENV = "CUDA_SAMPLE_IMAGE"
"""Set in `validator.cuda.env` to replace the CUDA sample image (private registries)."""
WITH_WORKLOAD_ENV = "WITH_WORKLOAD"
"""`true` in `validator.plugin.env`: also run a pod requesting a GPU after allocatable."""
DEFAULT_TOOLKIT_DIR = "/usr/local/nvidia"


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


def driver_command(spec: ClusterPolicySpec) -> list[str]:
    """One run of our driver check: `gpuop node-agent validate --checks driver ...`."""
    return ["gpuop", "node-agent", "validate", "--checks", "driver", *driver_check_args(spec)]


def driver_check_script(spec: ClusterPolicySpec) -> str:
    """The driver check retried every 5 s until it passes (upstream's WITH_WAIT=true): a
    `sh -c` script for the driver-validation init containers (this pod's, the
    toolkit's)."""
    return f"until {shlex.join(driver_command(spec))}; do sleep 5; done"


def toolkit_command(spec: ClusterPolicySpec) -> list[str]:
    """One run of our toolkit check (upstream's WITH_WAIT=false: a failure exits, and the
    kubelet re-creates the container, so the runtime injects the driver afresh). It runs
    `nvidia-smi`; where none was injected, it looks for the runtime's files under /host."""
    cmd = [
        "gpuop",
        "node-agent",
        "validate",
        "--checks",
        "toolkit",
        "--host-root",
        HOST_ROOT_MOUNT,
        "--validations-dir",
        VALIDATIONS_DIR,
    ]
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


def command(spec: ClusterPolicySpec) -> list[str]:
    """The main container: `gpuop node-agent validate --wait --checks cuda,plugin ...`
    with this policy's settings; it stays up and rechecks the plugin."""
    validator = spec.validator
    cmd = [
        "gpuop",
        "node-agent",
        "validate",
        "--wait",
        "--checks",
        "cuda,plugin",
        "--validations-dir",
        VALIDATIONS_DIR,
        "--cuda-image",
        cuda_image(spec),
        "--runtime-class",
        # workload pods ask for the validator pod's own class, none with the NRI plugin
        gpu_access(spec, TOOLKIT_VALIDATION)[0].get("runtimeClassName", ""),
    ]
    for secret in validator.image_pull_secrets or ():
        cmd += ["--image-pull-secret", secret]
    if (_env_value(validator.plugin, WITH_WORKLOAD_ENV) or "").lower() == TRUE:
        cmd.append("--plugin-workload")
    return cmd


def steps(spec: ClusterPolicySpec) -> list[list[str]]:
    """What the pod runs on a node, in order: driver-validation's check (one attempt),
    toolkit-validation's, then the main container's."""
    return [driver_command(spec), toolkit_command(spec), command(spec)]


def _resources(spec: ClusterPolicySpec) -> dict[str, Any]:
    """`validator.resources`, which upstream gives every container of the pod."""
    resources = spec.validator.resources
    if resources is None:
        return {}
    return {"resources": resources.model_dump(mode="json", exclude_none=True)}


def _step_env(section: ValidatorComponentSpec | None) -> list[dict[str, Any]]:
    return dump_env(section.env if section else None)


def driver_validation(spec: ClusterPolicySpec, ctx: RenderContext) -> dict[str, Any]:
    """Init container: wait until the node's driver works, write `driver-ready` (and
    link /dev/char: SELinux level s0, as upstream's). Upstream's env, then
    `validator.driver.env` (DISABLE_DEV_CHAR_SYMLINK_CREATION reaches the check)."""
    return {
        "name": DRIVER_VALIDATION,
        "image": ctx.operator_image,
        "command": ["sh", "-c"],
        "args": [driver_check_script(spec)],
        "env": merge_env(
            [
                env("WITH_WAIT", TRUE),
                env("COMPONENT", "driver"),
                field_env("OPERATOR_NAMESPACE", "metadata.namespace"),
            ],
            _step_env(spec.validator.driver),
        ),
        **_resources(spec),
        "securityContext": security_context(privileged=True, root=True, selinux_s0=True),
        "volumeMounts": [
            host_root_mount(),
            mount("driver-install-dir", DRIVER_ROOT, propagation="HostToContainer"),
            validations_mount("Bidirectional"),
            mount("host-dev-char", "/host-dev-char"),
        ],
    }


def toolkit_validation(spec: ClusterPolicySpec, ctx: RenderContext) -> dict[str, Any]:
    """Init container, created once driver-validation finished: it asks the runtime for
    every GPU and runs the toolkit check once, writing `toolkit-ready`. Beyond
    upstream's validations mount it has the host's / read-only, for the file fallback."""
    return {
        "name": TOOLKIT_VALIDATION,
        "image": ctx.operator_image,
        "command": toolkit_command(spec),
        "env": merge_env(
            [
                env("NVIDIA_VISIBLE_DEVICES", "all"),
                env("WITH_WAIT", "false"),
                env("COMPONENT", "toolkit"),
            ],
            _step_env(spec.validator.toolkit),
        ),
        **_resources(spec),
        "securityContext": security_context(privileged=True, root=True),
        "volumeMounts": [
            validations_mount("Bidirectional"),
            host_root_mount(),
        ],
    }


def pod(spec: ClusterPolicySpec, ctx: RenderContext) -> Pod:
    validator = spec.validator
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
            *(_step_env(step) for step in (validator.cuda, validator.plugin)),
        ),
        # the CUDA and plugin checks only talk to the API server and write their files
        mounts=[validations_mount("Bidirectional")],
        privileged=True,
        root=True,
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
    volumes = [
        validations_volume(),
        host_path("driver-install-dir", spec.host_paths.driver_install_dir),
        host_root_volume(spec),
        host_path("host-dev-char", "/dev/char"),
    ]
    init = [driver_validation(spec, ctx), toolkit_validation(spec, ctx)]
    return Pod(containers=[main], init=init, volumes=volumes)


OPERAND = Operand(
    name=NAME,
    section=SECTION,
    daemonset=DAEMONSET_NAME,
    deploy_label=DEPLOY_VALIDATOR_LABEL,
    pod=pod,
    # It runs (and cleans up) the CUDA and plugin workload pods and reads DaemonSets.
    role=(
        SCC_RULE,
        rule("", "pods", "create get list watch update patch delete"),
        rule("apps", "daemonsets", "get list watch"),
    ),
    # Workload pods may carry owner references to the policy (blockOwnerDeletion needs
    # the owner's finalizers subresource where that admission check is on).
    cluster=(
        READ_NODES,
        rule(
            "nvidia.com",
            "clusterpolicies/finalizers nvidiadrivers/finalizers",
            "create get list watch update patch delete",
        ),
    ),
    # upstream annotates toolkit-validation for the NRI plugin: the one asking for GPUs
    gpu_container=TOOLKIT_VALIDATION,
    selector_labels={PART_OF_LABEL: PART_OF},  # upstream's selector (immutable)
)
COMPONENT = OPERAND.component()
