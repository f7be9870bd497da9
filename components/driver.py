"""driver: the containerised NVIDIA driver, one pod per GPU node.

The pod template is built from `spec.driver` (and the GPUDirect sections that add
sidecars to it), the pod-wide `spec.daemonsets` settings and the GPU nodes' OS (the
image tag): any other change to the policy must leave the template, and so the running
drivers, alone. With automatic upgrades the DaemonSet is `OnDelete`: the upgrade state
machine decides when each node's pod goes.

Image tags carry the node OS as NFD reports it (`595.91.07-ubuntu22.04`); precompiled
drivers also carry the kernel (`595-5.15.0-124-generic-ubuntu22.04`), one DaemonSet per
kernel, selected by NFD's kernel label, as upstream names them.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from components import driver_digest
from components._accounts import CLUSTER_VERSION_RULE, SCC_RULE, operand_account
from components._host_paths import VALIDATIONS_DIR, host_path, host_root_volume, mount
from components._k8s import (
    config_map,
    container,
    daemonset,
    env,
    field_env,
    pull_secrets,
    rolling_update_strategy,
    with_app_label,
)
from components.component import Component, Permissions, rule
from components.context import KERNEL_LABEL, Manifest, RenderContext
from components.driver_config import apply_site_config
from components.driver_sidecars import (
    gpudirect_sidecars,
    manager_init_container,
    rdma_enabled,
    with_os_tag,
)
from components.keys import DEPLOY_DRIVER_LABEL, TRUE
from components.kinds import CLUSTER_RBAC, CONFIG_MAP, DAEMONSET, NAMESPACED_RBAC
from crd import ClusterPolicySpec, ContainerProbeSpec, DriverSpec, component_image

NAME = "driver"
DAEMONSET_NAME = "nvidia-driver-daemonset"
SERVICE_ACCOUNT = "nvidia-driver"
CONTAINER_NAME = "nvidia-driver-ctr"
STARTUP_PROBE_CONFIG_MAP = "nvidia-driver-startup-probe"
STARTUP_PROBE_PATH = "/usr/local/bin/startup-probe.sh"
PRECOMPILED_LABEL = "nvidia.com/precompiled"
COMPONENT_POD_LABEL = "app.kubernetes.io/component"
READY_FILE = f"{VALIDATIONS_DIR}/.driver-ctr-ready"
"""Written by the startup probe once `nvidia-smi` works; removed when the pod stops."""
DAEMONS_STATUS_FILE = f"{VALIDATIONS_DIR}/.driver-daemons-status"

_STARTUP_DEFAULTS = ContainerProbeSpec(
    initial_delay_seconds=60, period_seconds=10, timeout_seconds=60, failure_threshold=120
)
"""Builds can take many minutes on a fresh kernel: allow up to ~20 minutes."""

_CLUSTER_RULES = [
    CLUSTER_VERSION_RULE,
    rule("", "nodes", "get list patch update watch"),
    rule("", "pods", "get list watch"),
    rule("", "pods/eviction", "create"),
    rule("resource.k8s.io", "resourceclaims", "get list"),
    rule("apps", "daemonsets", "get"),
]


def enabled(spec: ClusterPolicySpec) -> bool:
    return spec.driver.enabled


def startup_budget_seconds(driver: DriverSpec) -> int:
    """How long the kubelet gives a new driver container to start before it restarts it:
    the startup probe's initial delay plus its period times its failure threshold
    (60 + 10 x 120 = 1,260 s by default; a driver compiled on a fresh kernel takes
    minutes). The upgrade machine waits at least this long for a new driver pod to turn
    Ready, so it never fails a node whose driver the kubelet still lets start."""
    merged = _STARTUP_DEFAULTS.model_copy(
        update=driver.startup_probe.model_dump(exclude_none=True) if driver.startup_probe else {}
    )
    delay = merged.initial_delay_seconds or 0
    period = merged.period_seconds or 10
    threshold = merged.failure_threshold or 3
    return int(delay + period * threshold)


def _probe(command: list[str], timing: ContainerProbeSpec | None) -> dict[str, Any]:
    probe: dict[str, Any] = {"exec": {"command": command}}
    merged = {
        **_STARTUP_DEFAULTS.model_dump(by_alias=True, exclude_none=True),
        **(timing.model_dump(by_alias=True, exclude_none=True) if timing else {}),
    }
    probe.update(merged)
    return probe


def _module_type(driver: DriverSpec) -> str:
    return "open" if driver.use_open_kernel_modules else driver.kernel_module_type


def image(spec: ClusterPolicySpec, ctx: RenderContext, kernel: str | None = None) -> str:
    """The driver image for the GPU nodes' OS (and `kernel` for precompiled drivers)."""
    base = component_image(spec, "driver")
    os_tag = ctx.kernels.get(kernel, ctx.os_tag) if kernel else ctx.os_tag
    if kernel:
        base = f"{base}-{kernel}"
    return with_os_tag(base, os_tag)


#: The variable carrying the install digest (`driver_digest.digest`), upstream's name.
CONFIG_DIGEST_ENV = driver_digest.DIGEST_ENV


def digest_in(pod_spec: Mapping[str, Any]) -> str:
    """The install digest a pod (or pod template) spec was made with; "" when none.

    Two driver pods with the same digest install the same driver: a template change
    beyond it (labels, tolerations...) only needs the pod restarted, not the node emptied.
    """
    for c in pod_spec.get("containers") or []:
        for var in c.get("env") or []:
            if var.get("name") == CONFIG_DIGEST_ENV and var.get("value"):
                return str(var["value"])
    return ""


def _feature_env(spec: ClusterPolicySpec) -> list[dict[str, Any]]:
    variables = []
    if spec.gdrcopy.enabled:
        variables.append(env("GDRCOPY_ENABLED", "true"))
    if spec.gds.enabled:
        variables.append(env("GDS_ENABLED", "true"))
    if rdma_enabled(spec):
        variables.append(env("GPU_DIRECT_RDMA_ENABLED", "true"))
    return variables


def _driver_container(
    spec: ClusterPolicySpec, ctx: RenderContext, kernel: str | None
) -> dict[str, Any]:
    driver = spec.driver
    extra: dict[str, Any] = {
        "startupProbe": _probe(["sh", STARTUP_PROBE_PATH], driver.startup_probe),
        "lifecycle": {
            "preStop": {
                "exec": {"command": ["/bin/sh", "-c", f"rm -f {READY_FILE} {DAEMONS_STATUS_FILE}"]}
            }
        },
    }
    if driver.liveness_probe is not None:
        extra["livenessProbe"] = _probe(["nvidia-smi", "-L"], driver.liveness_probe)
    if driver.readiness_probe is not None:
        extra["readinessProbe"] = _probe(["test", "-f", READY_FILE], driver.readiness_probe)
    return container(
        CONTAINER_NAME,
        image(spec, ctx, kernel),
        driver,
        command=["nvidia-driver"],
        args=["init"],
        env_vars=[
            field_env("NODE_NAME", "spec.nodeName"),
            field_env("NODE_IP", "status.hostIP"),
            env("KERNEL_MODULE_TYPE", _module_type(driver)),
            env(CONFIG_DIGEST_ENV, ""),  # filled in by pod_spec
            *_feature_env(spec),
        ],
        mounts=[
            mount("run-nvidia", "/run/nvidia", propagation="Bidirectional"),
            mount("run-nvidia-fabricmanager", "/run/nvidia-fabricmanager"),
            mount("run-nvidia-topologyd", "/run/nvidia-topologyd"),
            mount("var-log", "/var/log"),
            mount("dev-log", "/dev/log"),
            mount("host-os-release", "/host-etc/os-release", read_only=True),
            mount(
                "mlnx-ofed-usr-src", "/run/mellanox/drivers/usr/src", propagation="HostToContainer"
            ),
            mount("run-mellanox-drivers", "/run/mellanox/drivers", propagation="HostToContainer"),
            mount("host-sys-devices-system", "/sys/devices/system"),
            mount("firmware-search-path", "/sys/module/firmware_class/parameters/path"),
            mount("nv-firmware", "/lib/firmware"),
            {
                "name": "driver-startup-probe-script",
                "mountPath": STARTUP_PROBE_PATH,
                "subPath": "startup-probe.sh",
            },
        ],
        privileged=True,
        selinux_s0=True,
        extra=extra,
    )


def pod_spec(
    spec: ClusterPolicySpec, ctx: RenderContext, kernel: str | None = None, *, os_files: bool = True
) -> dict[str, Any]:
    """The driver pod spec (before the pod-wide settings): the site configuration added
    (and, with ``os_files``, the host files of the GPU nodes' OS as a ClusterPolicy's
    driver mounts them: `components.driver_config.apply_site_config`), then its install
    digest computed over all of it (as upstream hashes the finished template)."""
    pod = _base_pod_spec(spec, ctx, kernel)
    apply_site_config(pod, spec, ctx, os_files=os_files)
    driver_digest.with_digest(pod)
    return pod


def _base_pod_spec(
    spec: ClusterPolicySpec, ctx: RenderContext, kernel: str | None
) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "serviceAccountName": SERVICE_ACCOUNT,
        "hostPID": True,
        "affinity": {
            # Never two driver pods on one node (e.g. a precompiled and a regular one).
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "labelSelector": {
                            "matchExpressions": [
                                {
                                    "key": COMPONENT_POD_LABEL,
                                    "operator": "In",
                                    "values": ["nvidia-driver"],
                                }
                            ]
                        },
                        "topologyKey": "kubernetes.io/hostname",
                    }
                ]
            }
        },
        "initContainers": [manager_init_container(spec)],
        "containers": [
            _driver_container(spec, ctx, kernel),
            *gpudirect_sidecars(spec, ctx, image(spec, ctx)),
        ],
        "imagePullSecrets": driver_pull_secrets(spec),
        "volumes": [
            host_path("run-nvidia", "/run/nvidia", "DirectoryOrCreate"),
            host_path("var-log", "/var/log"),
            host_path("dev-log", "/dev/log"),
            host_path("host-os-release", "/etc/os-release"),
            host_path("run-nvidia-fabricmanager", "/run/nvidia-fabricmanager", "DirectoryOrCreate"),
            host_path("run-nvidia-topologyd", "/run/nvidia-topologyd", "DirectoryOrCreate"),
            host_path("mlnx-ofed-usr-src", "/run/mellanox/drivers/usr/src", "DirectoryOrCreate"),
            host_path("run-mellanox-drivers", "/run/mellanox/drivers", "DirectoryOrCreate"),
            host_path("run-nvidia-validations", VALIDATIONS_DIR, "DirectoryOrCreate"),
            host_root_volume(spec),
            host_path("host-sys", "/sys", "Directory"),
            host_path("firmware-search-path", "/sys/module/firmware_class/parameters/path"),
            host_path("host-sys-devices-system", "/sys/devices/system", "Directory"),
            # The driver container installs under /run/nvidia/driver whatever
            # hostPaths.driverInstallDir says (that is where others find it).
            host_path("nv-firmware", "/run/nvidia/driver/lib/firmware", "DirectoryOrCreate"),
            {
                "name": "driver-startup-probe-script",
                "configMap": {"name": STARTUP_PROBE_CONFIG_MAP, "defaultMode": 0o755},
            },
        ],
    }
    return pod


def driver_pull_secrets(
    spec: ClusterPolicySpec, manager_first: bool = True
) -> list[dict[str, str]]:
    """The driver pod's pull secrets: those of every image it runs, each once, as
    upstream's `TransformDriver` adds them (`controllers/object_controls.go`: the driver
    manager's, the driver's, then the GDS and GDRCopy sidecars' where enabled); an
    NVIDIADriver's template lists the driver's before the manager's
    (`manager_first=False`)."""
    manager = spec.driver.manager.image_pull_secrets if spec.driver.manager else None
    own = spec.driver.image_pull_secrets
    return pull_secrets(
        *((manager, own) if manager_first else (own, manager)),
        spec.gds.image_pull_secrets if spec.gds.enabled else None,
        spec.gdrcopy.image_pull_secrets if spec.gdrcopy.enabled else None,
    )


def update_strategy(spec: ClusterPolicySpec) -> dict[str, Any]:
    """OnDelete under automatic upgrades (the upgrade machine replaces pods node by node)."""
    if spec.driver.upgrade_policy.auto_upgrade:
        return {"type": "OnDelete"}
    return rolling_update_strategy(spec)


def sanitized_kernel(kernel: str) -> str:
    """A kernel version fit for an object name: no arch, `_` as `.`, lower case."""
    without_arch = re.sub(r"x86_64(?:_64k)?|aarch64(?:_64k)?", "", kernel)
    return without_arch.replace("_", ".").rstrip(".").lower()


@dataclass(frozen=True)
class DriverPool:
    """One driver DaemonSet as the upgrade machine sees it: the nodes it selects."""

    name: str
    node_selector: Mapping[str, str]
    created: str = ""
    """Its creationTimestamp (RFC 3339, so it orders as text)."""


def pool_for(node_labels: Mapping[str, str], pools: Iterable[DriverPool]) -> str | None:
    """The driver DaemonSet a node with ``node_labels`` runs: the one whose node selector
    its labels match. Precompiled drivers have one per kernel (NFD's kernel label), so
    each node follows its kernel's. Should two match (the policy switching between
    precompiled and compiled drivers before the old DaemonSet is pruned), the newest
    wins: it is the one the node will run. None when no pool selects the node."""
    matching = [
        p for p in pools if all(node_labels.get(k) == v for k, v in p.node_selector.items())
    ]
    if not matching:
        return None
    return max(matching, key=lambda p: (p.created, p.name)).name


def rollout_key(templates: Iterable[tuple[Mapping[str, str], Mapping[str, Any]]]) -> str:
    """What names one driver rollout over a policy's driver DaemonSets, given each one's
    (node selector, pod template spec): their install digests, a precompiled one's taken
    with its kernel left out of the images. So a node of a new kernel joining (a new
    DaemonSet) is the same rollout, while a new driver version is a new one."""
    keys = set()
    for selector, pod in templates:
        kernel = selector.get(KERNEL_LABEL)
        if kernel is None:
            keys.add(digest_in(pod))
            continue
        plain = copy.deepcopy(dict(pod))
        for c in [*(plain.get("initContainers") or ()), *(plain.get("containers") or ())]:
            if isinstance(c.get("image"), str):
                c["image"] = c["image"].replace(f"-{kernel}", "")
        keys.add(driver_digest.digest(plain))
    return ",".join(sorted(k for k in keys if k))


def _daemonset(spec: ClusterPolicySpec, ctx: RenderContext, kernel: str | None) -> Manifest:
    selector = {DEPLOY_DRIVER_LABEL: TRUE}
    name = DAEMONSET_NAME
    if kernel is not None:
        selector[KERNEL_LABEL] = kernel
        name = f"{DAEMONSET_NAME}-{sanitized_kernel(kernel)}-{ctx.kernels[kernel]}"
    ds = daemonset(
        name,
        NAME,
        spec,
        ctx,
        pod_spec(spec, ctx, kernel),
        node_selector=selector,
        update_strategy=update_strategy(spec),
        pod_annotations={"kubectl.kubernetes.io/default-container": CONTAINER_NAME},
        host_network=spec.driver.host_network,
    )
    marks = {
        COMPONENT_POD_LABEL: "nvidia-driver",
        PRECOMPILED_LABEL: str(kernel is not None).lower(),
    }
    ds["spec"]["template"]["metadata"]["labels"].update(marks)
    ds["metadata"]["labels"][PRECOMPILED_LABEL] = marks[PRECOMPILED_LABEL]
    return ds


def render(spec: ClusterPolicySpec, ctx: RenderContext) -> list[Manifest]:
    kernels: list[str | None] = list(ctx.kernels) if spec.driver.use_precompiled else [None]
    if spec.driver.use_nvidia_driver_crd:
        kernels = []  # NVIDIADriver resources own the driver DaemonSets; their pods use the rest
    probe = config_map(
        STARTUP_PROBE_CONFIG_MAP, NAME, spec, ctx, {"startup-probe.sh": _STARTUP_PROBE}
    )
    return [
        *operand_account(SERVICE_ACCOUNT, NAME, spec, ctx, [SCC_RULE], _CLUSTER_RULES),
        with_app_label(probe, DAEMONSET_NAME),  # as upstream's
        *(_daemonset(spec, ctx, kernel) for kernel in kernels),
    ]


_STARTUP_PROBE = f"""#!/bin/sh
# The driver container counts as started once its kernel module is loaded, its daemons
# report Ready and nvidia-smi works; only then may operands use the driver.
set -eu
mkdir -p {VALIDATIONS_DIR}
if [ ! -e /sys/module/nvidia/refcnt ]; then
  echo "nvidia kernel module is not loaded"
  exit 1
fi
if [ -f {DAEMONS_STATUS_FILE} ] && [ "$(cat {DAEMONS_STATUS_FILE})" != "Ready" ]; then
  echo "driver daemons not ready: $(cat {DAEMONS_STATUS_FILE})"
  exit 1
fi
nvidia-smi || {{ echo "nvidia-smi failed"; exit 1; }}
cat > {READY_FILE}.tmp <<EOF
GDRCOPY_ENABLED: ${{GDRCOPY_ENABLED:-false}}
GDS_ENABLED: ${{GDS_ENABLED:-false}}
GPU_DIRECT_RDMA_ENABLED: ${{GPU_DIRECT_RDMA_ENABLED:-false}}
EOF
mv {READY_FILE}.tmp {READY_FILE}
"""

COMPONENT = Component(
    name=NAME,
    deploy_label=DEPLOY_DRIVER_LABEL,
    is_enabled=enabled,
    render=render,
    kinds=(*NAMESPACED_RBAC, *CLUSTER_RBAC, CONFIG_MAP, DAEMONSET),
    permissions=Permissions(role=(SCC_RULE,), cluster=tuple(_CLUSTER_RULES)),
    cluster_roles=(SERVICE_ACCOUNT,),
)
