"""sandbox-validation: our node agent checks a VM host's GPUs and writes the status files
the sandbox device plugins wait for.

One init container per check, in upstream's order, each `gpuop node-agent
validate-sandbox` for one component: `cc-manager` (the CC manager has set the mode, on
CC-capable nodes), `vfio-pci` (every GPU bound to vfio-pci, on vm-passthrough nodes),
`vgpu-manager` (the vGPU host driver answers, on vm-vgpu nodes) and `vgpu-devices` (vGPU
devices exist). Each first records the node's workload in `workload-type`; a check for
another workload passes at once. The main container then only keeps the files: they
are removed when the pod stops (a node switching workload revalidates from scratch).

`validator.vfioPCI.env`, `validator.vgpuManager.env` and `validator.vgpuDevices.env`
are set on their check's container, overriding ours by name, as upstream's
`TransformValidatorComponent` sets them on its init containers of the same names
(`cc-manager` has no such section, upstream neither).
"""

from __future__ import annotations

from typing import Any

from components._host_paths import (
    DRIVER_ROOT,
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
    dump_env,
    env,
    field_env,
    merge_env,
    security_context,
)
from components._sandbox import sandbox_enabled, validations_container
from components.component import VM_HOSTS, rule
from components.context import RenderContext
from components.keys import DEPLOY_SANDBOX_VALIDATOR_LABEL
from components.operand import Operand, Pod
from crd import ClusterPolicySpec

NAME = "sandbox-validation"
SECTION = "validator"
DAEMONSET_NAME = "nvidia-sandbox-validator"
CONTAINER_NAME = "nvidia-sandbox-validator"
COMMAND = ["gpuop", "node-agent", "validate-sandbox"]
"""Reads COMPONENT, WITH_WAIT, NODE_NAME and DEFAULT_GPU_WORKLOAD_CONFIG, as upstream's
validator does (`gpuop.nodeagent.sandbox`)."""
CHECKS = ("cc-manager", "vfio-pci", "vgpu-manager", "vgpu-devices")
"""In upstream's order: each one's init container."""
_WORKLOAD_CHECKS = ("vfio-pci", "vgpu-manager", "vgpu-devices")
"""The checks that depend on the node's workload (so read the policy's default)."""

_USER_ENV = {"vfio-pci": "vfio_pci", "vgpu-manager": "vgpu_manager", "vgpu-devices": "vgpu_devices"}
"""The `validator` section whose `env` each check's container gets."""


def _check(spec: ClusterPolicySpec, ctx: RenderContext, check: str) -> dict[str, Any]:
    variables = [
        env("WITH_WAIT", "true"),
        env("COMPONENT", check),
        field_env("NODE_NAME", "spec.nodeName"),
    ]
    mounts = [validations_mount("Bidirectional")]
    if check in _WORKLOAD_CHECKS:
        default = spec.sandbox_workloads.default_workload
        variables.append(env("DEFAULT_GPU_WORKLOAD_CONFIG", default))
    if check in ("vfio-pci", "vgpu-manager"):
        host = host_root_mount()
        mounts.insert(0, host)
    if check == "vgpu-manager":
        driver = mount("driver-install-path", DRIVER_ROOT, propagation="HostToContainer")
        mounts.insert(1, driver)
    section = getattr(spec.validator, _USER_ENV[check]) if check in _USER_ENV else None
    return {
        "name": f"{check}-validation",
        "image": ctx.operator_image,
        "command": COMMAND,
        "env": merge_env(variables, dump_env(section.env if section else None)),
        # vGPU devices are only listed in sysfs; the other checks read driver and
        # device state the way upstream's do (SELinux level s0 on enforcing hosts).
        "securityContext": security_context(
            privileged=True, root=True, selinux_s0=check != "vgpu-devices"
        ),
        "volumeMounts": mounts,
    }


def pod(spec: ClusterPolicySpec, ctx: RenderContext) -> Pod:
    main = validations_container(
        ctx,
        CONTAINER_NAME,
        "echo all validations are successful; while true; do sleep 86400; done",
        propagation="Bidirectional",
        # The status files go with the validator: what waits on them waits for it again.
        extra={
            "lifecycle": {
                "preStop": {"exec": {"command": ["sh", "-c", f"rm -f {VALIDATIONS_DIR}/*"]}}
            }
        },
    )
    volumes = [
        validations_volume(),
        host_path("driver-install-path", spec.host_paths.driver_install_dir),
        host_root_volume(spec),
    ]
    init = [_check(spec, ctx, check) for check in CHECKS]
    return Pod(containers=[main], init=init, volumes=volumes)


OPERAND = Operand(
    name=NAME,
    section=SECTION,
    daemonset=DAEMONSET_NAME,
    deploy_label=DEPLOY_SANDBOX_VALIDATOR_LABEL,
    pod=pod,
    enabled=sandbox_enabled,
    placement=VM_HOSTS,
    # It reads its node's workload and CC labels.
    cluster=(rule("", "nodes", "get"),),
    selector_labels={PART_OF_LABEL: PART_OF},  # upstream's selector (immutable)
)
COMPONENT = OPERAND.component()
