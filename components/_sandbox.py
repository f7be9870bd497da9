"""What the sandbox operands (GPUs handed to virtual machines) share: their switch, the
driver manager init container of the two that take GPUs from the NVIDIA driver, and
the init containers that hold a device plugin back until its node's GPUs are ready for
VMs (the sandbox validator's status files).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from components._host_paths import (
    RUN_NVIDIA,
    VALIDATIONS_DIR,
    host_root_mount,
    mount,
    validations_mount,
)
from components._k8s import container, dump_env, env, field_env, merge_env, security_context
from components.component import rule
from components.context import RenderContext
from components.operand import section_of, switched_on
from crd import ClusterPolicySpec, ComponentSpec, VFIOManagerSpec, VGPUManagerSpec, component_image

WORKLOAD_TYPE_FILE = f"{VALIDATIONS_DIR}/workload-type"
"""Written by the sandbox validator: the workload its node serves (container,
vm-passthrough, vm-vgpu), so waits elsewhere know which checks apply to the node."""
VFIO_PCI_READY = f"{VALIDATIONS_DIR}/vfio-pci-ready"
VGPU_DEVICES_READY = f"{VALIDATIONS_DIR}/vgpu-devices-ready"

MANAGER_RESOURCES = {"limits": {"memory": "200Mi"}, "requests": {"cpu": "100m", "memory": "200Mi"}}
"""Upstream's resources for the VFIO and CC managers where the policy sets none."""


def sandbox_enabled(spec: ClusterPolicySpec) -> bool:
    """Every sandbox operand needs `sandboxWorkloads.enabled` as well as its own switch."""
    return spec.sandbox_workloads.enabled


def sandbox_switch(section: str, mode: str | None = None) -> Callable[[ClusterPolicySpec], bool]:
    """A sandbox operand's switch: `sandboxWorkloads.enabled`, its `section`'s own and,
    for the operand of one `sandboxWorkloads.mode`, that mode."""
    return partial(_sandbox_on, section, mode)


def _sandbox_on(section: str, mode: str | None, spec: ClusterPolicySpec) -> bool:
    wanted = mode in (None, spec.sandbox_workloads.mode)
    return sandbox_enabled(spec) and switched_on(section, spec) and wanted


def resources(section: ComponentSpec, default: dict[str, Any] | None = None) -> dict[str, Any]:
    """The section's resources, else `default`; as upstream, for every container of the
    operand's pod that runs its image."""
    if section.resources is not None:
        return section.resources.model_dump(mode="json", exclude_none=True)
    return dict(default or {})


def operand_container(
    name: str,
    spec: ClusterPolicySpec,
    path: str,
    *,
    image: str | None = None,
    args: Sequence[str] = (),
    default_resources: dict[str, Any] | None = None,
    **options: Any,
) -> dict[str, Any]:
    """A sandbox operand's own privileged container, of its section at `path` (and its
    image, unless `image` says otherwise): the section's args replace `args` (upstream
    does not append them), and its resources, else `default_resources`, are set as
    given."""
    section = section_of(spec, path)
    main = container(
        name,
        image or component_image(spec, path),
        section,
        args=section.args or args,
        section_args=False,
        privileged=True,
        **options,
    )
    if section.resources is not None or default_resources is not None:
        main["resources"] = resources(section, default_resources)
    return main


def validations_container(
    ctx: RenderContext,
    name: str,
    script: str,
    *,
    propagation: str,
    env_vars: Sequence[dict[str, Any]] = (),
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A root shell container of the operator image running `script` with the status
    files of the validations (`/run/nvidia/validations`) mounted; `daemonset` gives it
    its pull policy and the pod its pull secrets (`operator_image_pulls`)."""
    result: dict[str, Any] = {
        "name": name,
        "image": ctx.operator_image,
        "command": ["sh", "-c"],
        "args": [script],
        **(extra or {}),
    }
    if env_vars:
        result["env"] = list(env_vars)
    result["securityContext"] = security_context(privileged=True, root=True)
    result["volumeMounts"] = [validations_mount(propagation)]
    return result


DRIVER_MANAGER_RULES = (
    rule("", "nodes", "get list patch watch"),
    rule("", "pods", "get list watch"),
    rule("", "pods/eviction", "create"),
)
"""The driver manager labels its node and may evict GPU pods before the unload."""


def driver_manager_secrets(section: VFIOManagerSpec | VGPUManagerSpec) -> list[str] | None:
    """The pull secrets of the driver manager's image, after the section's own."""
    return section.driver_manager.image_pull_secrets if section.driver_manager else None


def driver_manager_init_container(
    spec: ClusterPolicySpec, path: str, section: VFIOManagerSpec | VGPUManagerSpec
) -> dict[str, Any]:
    """The driver manager, before the vGPU manager or the VFIO manager starts: it unloads
    the NVIDIA data-centre driver so the GPUs can be handed to the vGPU host driver or
    to vfio-pci. It evicts no GPU pods itself (upstream's defaults; `driverManager.env`
    may say otherwise): a node turning into a VM host is emptied before (docs/sandbox.md)."""
    manager = section.driver_manager
    result: dict[str, Any] = {
        "name": "k8s-driver-manager",
        "image": component_image(spec, path),
        "imagePullPolicy": manager.image_pull_policy if manager else "IfNotPresent",
        "command": ["driver-manager"],
        "args": ["uninstall_driver"],
        "env": merge_env(
            [
                field_env("NODE_NAME", "spec.nodeName"),
                env("NVIDIA_VISIBLE_DEVICES", "void"),
                env("ENABLE_GPU_POD_EVICTION", "false"),
                env("ENABLE_AUTO_DRAIN", "false"),
                field_env("OPERATOR_NAMESPACE", "metadata.namespace"),
            ],
            dump_env(manager.env if manager else None),
        ),
        "securityContext": {"privileged": True},
        "volumeMounts": [
            mount("run-nvidia", RUN_NVIDIA, propagation="Bidirectional"),
            host_root_mount(),
            mount("host-sys", "/sys"),
        ],
    }
    if section.resources is not None:
        result["resources"] = resources(section)
    return result


def workload_wait(
    ctx: RenderContext, name: str, workload: str, ready_file: str, skip: str, waiting: str
) -> dict[str, Any]:
    """Init container of a sandbox device plugin: once the validator has said what the
    node serves, wait for `ready_file` only where that is `workload` (a vm-vgpu node has
    no vfio-pci devices to wait for, and the reverse)."""
    script = (
        f"until [ -f {WORKLOAD_TYPE_FILE} ]; do echo waiting for workload type status file;"
        f' sleep 5; done; if [ "$(cat {WORKLOAD_TYPE_FILE})" != "{workload}" ]; then echo'
        f" {skip}, skipping validation; exit 0; fi; until [ -f {ready_file} ]; do echo"
        f" {waiting}; sleep 5; done;"
    )
    return validations_container(
        ctx,
        name,
        script,
        propagation="HostToContainer",
        env_vars=[env("NVIDIA_VISIBLE_DEVICES", "void")],
    )


def vfio_pci_wait(ctx: RenderContext, skip: str = "vfio-pci not needed") -> dict[str, Any]:
    """Wait for every GPU of a vm-passthrough node to be bound to vfio-pci."""
    return workload_wait(
        ctx,
        "vfio-pci-validation",
        "vm-passthrough",
        VFIO_PCI_READY,
        skip,
        "waiting for vfio-pci driver ...",
    )
