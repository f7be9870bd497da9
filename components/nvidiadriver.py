"""NVIDIADriver operands: one driver DaemonSet per node pool of each resource.

A pool is the resource's nodes of one OS (and, with precompiled drivers, one kernel), as
upstream partitions them, so each DaemonSet's image tag fits every node it selects. The
pod is the ClusterPolicy driver's (:mod:`components.driver`), rendered from a policy whose
driver section is the resource's: one pod definition, two ways to ask for it. A pool
adds the host's subscription files by its own OS, and ``driverType: vgpu-host-manager``
turns the pod into the vGPU manager's, as upstream's NVIDIADriver template does.

Each DaemonSet selects ``nvidia.com/gpu.deploy.driver=true`` (the vGPU manager's
``nvidia.com/gpu.deploy.vgpu-manager=true``), the owner label naming its
resource and the pool's NFD OS labels, so a node moves between resources only by its
owner label changing. Not the resource's own ``nodeSelector``: the owner label already
says the resource selected the node, and a node whose labels stop matching must keep
its driver until the hand-over (``statemachine.driver_owner``) takes it away.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from components import driver, driver_digest
from components._k8s import daemonset
from components.context import (
    KERNEL_LABEL,
    OS_ID_LABEL,
    OS_VERSION_LABEL,
    Manifest,
    NodeFacts,
    RenderContext,
    node_facts,
)
from components.driver_config import (
    DRIVER_CONTAINER,
    GPUDIRECT_CONTAINERS,
    PEERMEM_CONTAINER,
    site_config,
    subscription_files,
)
from components.keys import DEPLOY_DRIVER_LABEL, GPU_PRESENT_LABEL, TRUE
from crd import (
    OWNER_LABEL,
    ClusterDriverUpgradePolicySpec,
    ClusterPolicySpec,
    DriverCertConfigSpec,
    DriverLicensingConfigSpec,
    DriverRepoConfigSpec,
    DriverSpec,
    GDRCopySpec,
    GPUDirectStorageSpec,
    NVIDIADriverSpec,
    Toleration,
    VirtualTopologyConfigSpec,
    component_image,
)

OS_MAJOR_LABEL = "feature.node.kubernetes.io/system-os_release.VERSION_ID.major"
OS_VERSION_POD_LABEL = "nvidia.com/node.os-version"
KERNEL_POD_LABEL = "nvidia.com/precompiled.kernel-version"
DEPLOY_VGPU_MANAGER_LABEL = "nvidia.com/gpu.deploy.vgpu-manager"
VGPU_HOST_MANAGER = "vgpu-host-manager"
"""The driver type that runs the vGPU manager (the vGPU host driver) on its nodes."""
_SAFE = "bcdfghjklmnpqrstvwxz2456789"
"""Kubernetes' rand.SafeEncodeString alphabet (no vowels, no look-alikes)."""


class NVIDIADriverRenderError(ValueError):
    """The resource cannot be rendered (its status says why)."""


@dataclass(frozen=True)
class NodePool:
    """Nodes of one resource that share a driver image."""

    name: str
    os_tag: str
    kernel: str | None
    node_selector: Mapping[str, str]
    facts: NodeFacts


def _safe_hash(text: str) -> str:
    """upstream's GetStringHash: FNV-1a 32-bit, printed in decimal, safe-encoded."""
    value = 0x811C9DC5
    for byte in text.encode():
        value = ((value ^ byte) * 0x01000193) & 0xFFFFFFFF
    return "".join(_SAFE[ord(c) % len(_SAFE)] for c in str(value))


def app_name(driver_type: str, os_tag: str, uid: str, kernel: str | None = None) -> str:
    """The DaemonSet name (and its `app` label): `nvidia-<type>-driver-<os>-<hash>`, the
    hash of the resource's uid (and kernel), at most 63 characters."""
    prefix = f"nvidia-{driver_type}-driver-{os_tag}"
    digest = _safe_hash(uid + (f"-{kernel}" if kernel else ""))
    name = f"{prefix}-{digest}"
    if len(name) > 63:
        name = f"{prefix[: 63 - len(digest) - 1]}-{digest}"
    return name


def driver_name(owner: str, driver_type: str, os_tag: str) -> str:
    """upstream's per-pool driver name (the `openshift.io/scc` annotation)."""
    if driver_type == VGPU_HOST_MANAGER:
        return f"nvidia-vgpu-manager-{owner}-{os_tag}"[:253]
    return f"nvidia-{driver_type}-driver-{owner}-{os_tag}"[:253]


def node_pools(
    owner: str, spec: NVIDIADriverSpec, nodes: Iterable[Mapping[str, Any]]
) -> list[NodePool]:
    """The pools of the nodes labelled as owned by ``owner``; nodes without NFD's OS
    labels (or, precompiled, kernel label) cannot be given an image and are left out."""
    base = {GPU_PRESENT_LABEL: TRUE, OWNER_LABEL: owner}
    pools: dict[str, NodePool] = {}
    for node in nodes:
        labels: Mapping[str, str] = (node.get("metadata") or {}).get("labels") or {}
        if any(labels.get(k) != v for k, v in base.items()):
            continue
        facts = node_facts(node)
        os_id, os_version, os_tag = facts.os_id, facts.os_version, facts.os_tag
        if not os_id or not os_version or not os_tag:
            continue
        selector = {**base, OS_ID_LABEL: os_id}
        if os_tag.endswith(os_version):
            selector[OS_VERSION_LABEL] = os_version
        elif OS_MAJOR_LABEL in labels:
            selector[OS_MAJOR_LABEL] = labels[OS_MAJOR_LABEL]
        else:
            continue
        name, kernel = os_tag, None
        if spec.precompiled:
            kernel = labels.get(KERNEL_LABEL)
            if not kernel:
                continue
            selector[KERNEL_LABEL] = kernel
            name = f"{os_tag}-{driver.sanitized_kernel(kernel)}"
        pools.setdefault(name, NodePool(name, os_tag, kernel, selector, facts))
    return [pools[name] for name in sorted(pools)]


def deploy_label(spec: NVIDIADriverSpec) -> str:
    """The node label (``true``) that the resource's driver DaemonSets select on."""
    if spec.driver_type == VGPU_HOST_MANAGER:
        return DEPLOY_VGPU_MANAGER_LABEL
    return DEPLOY_DRIVER_LABEL


def policy_for(spec: NVIDIADriverSpec, base: ClusterPolicySpec) -> ClusterPolicySpec:
    """The ClusterPolicy whose driver section says what ``spec`` says; the rest of
    ``base`` (host paths, ...) is kept."""
    section = DriverSpec(
        enabled=True,
        use_precompiled=spec.precompiled,
        use_open_kernel_modules=bool(spec.use_open_kernel_modules),
        kernel_module_type=spec.kernel_module_type,
        startup_probe=spec.startup_probe,
        liveness_probe=spec.liveness_probe,
        readiness_probe=spec.readiness_probe,
        rdma=spec.rdma,
        upgrade_policy=ClusterDriverUpgradePolicySpec.model_validate(
            spec.upgrade_policy_with_defaults().model_dump(by_alias=True)
        ),
        manager=spec.manager,
        repository=spec.repository,
        image=spec.image,
        version=spec.version,
        imagePullPolicy=spec.image_pull_policy or "IfNotPresent",
        image_pull_secrets=spec.image_pull_secrets,
        resources=spec.resources,
        args=spec.args,
        env=spec.env,
        repo_config=DriverRepoConfigSpec(config_map_name=spec.repo_config.name)
        if spec.repo_config
        else None,
        cert_config=DriverCertConfigSpec(name=spec.cert_config.name) if spec.cert_config else None,
        licensing_config=DriverLicensingConfigSpec(
            config_map_name=spec.licensing_config.name,
            secret_name=spec.licensing_config.secret_name,
            nls_enabled=spec.licensing_config.nls_enabled is not False,
        )
        if spec.licensing_config
        else None,
        virtual_topology=VirtualTopologyConfigSpec(config=spec.virtual_topology_config.name)
        if spec.virtual_topology_config
        else None,
        kernel_module_config=spec.kernel_module_config,
        secret_env=spec.secret_env,
    )
    gpu = Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")
    extra = [t for t in spec.tolerations or [] if t != gpu]
    daemonsets = base.daemonsets.model_copy(
        update={
            "labels": dict(spec.labels or {}),
            "annotations": dict(spec.annotations or {}),
            "tolerations": [gpu, *extra],
            "priority_class_name": spec.priority_class_name or "system-node-critical",
            # upstream's NVIDIADriver template takes the pod security context from the
            # resource only (render_pool sets it), never from the ClusterPolicy
            "pod_security_context": None,
        }
    )
    return base.model_copy(
        update={
            "driver": section,
            "daemonsets": daemonsets,
            "gds": spec.gds or GPUDirectStorageSpec(),
            "gdrcopy": spec.gdrcopy or GDRCopySpec(),
        }
    )


@functools.cache
def gpucluster_base() -> ClusterPolicySpec:
    """The policy an NVIDIADriver renders over beside a GPUCluster, where no ClusterPolicy
    exists: upstream's defaults, drivers delegated to NVIDIADrivers, the host's root at
    `/`. Upstream's NVIDIADriver controller reads a ClusterPolicy only for
    `hostPaths.rootFS` and uses `/` beside a GPUCluster (`nvidiadriver_controller.go`).
    Shared and never changed: every reader copies what it alters (``policy_for``)."""
    return ClusterPolicySpec.model_validate({"driver": {"useNvidiaDriverCRD": True}})


def check(spec: NVIDIADriverSpec, base: ClusterPolicySpec) -> None:
    """Raise :class:`NVIDIADriverRenderError` for what upstream refuses to deploy."""
    policy = policy_for(spec, base)
    if spec.precompiled:
        if "sha256:" in component_image(policy, "driver"):
            raise NVIDIADriverRenderError(
                "precompiled driver images are tagged per kernel and OS; a digest is not allowed"
            )
        if policy.gds.enabled or policy.gdrcopy.enabled:
            raise NVIDIADriverRenderError(
                "GPUDirect Storage driver (nvidia-fs) and/or GDRCopy driver is not supported"
                " along with pre-compiled NVIDIA drivers"
            )


VISIBLE_DEVICES_VOID = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}
"""Upstream's NVIDIADriver template runs the driver container with no GPU injected by
the NVIDIA runtime ("always use runc for driver containers")."""
POOL_ANTI_AFFINITY = ["nvidia-driver", "nvidia-vgpu-manager"]
"""The pod components an NVIDIADriver's driver pod never shares a node with, as
upstream's template lists them."""


def _as_upstream_pool(pod: dict[str, Any], policy: ClusterPolicySpec) -> dict[str, Any]:
    """The ClusterPolicy driver's pod with what upstream's NVIDIADriver template does
    differently: ``NVIDIA_VISIBLE_DEVICES=void`` first in the driver container, a pod
    anti-affinity on vGPU manager pods too, and the driver's pull secrets before the
    driver manager's."""
    secrets = driver.driver_pull_secrets(policy, manager_first=False)
    if secrets:
        pod["imagePullSecrets"] = secrets
    for container in pod["containers"]:
        if container["name"] == driver.CONTAINER_NAME:
            env = [v for v in container.get("env") or () if v["name"] != "NVIDIA_VISIBLE_DEVICES"]
            container["env"] = [dict(VISIBLE_DEVICES_VOID), *env]
    anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    for term in anti:
        for expression in term["labelSelector"]["matchExpressions"]:
            if expression["key"] == driver.COMPONENT_POD_LABEL:
                expression["values"] = list(POOL_ANTI_AFFINITY)
    return pod


RESOURCE_CONFIG_CONTAINERS = (DRIVER_CONTAINER, PEERMEM_CONTAINER, *GPUDIRECT_CONTAINERS)
"""The containers upstream's NVIDIADriver template gives the resource's additional
configuration mounts (`.AdditionalConfigs.VolumeMounts`)."""
VGPU_HOST_MANAGER_GRACE_PERIOD = 120
"""Seconds a vGPU manager pod gets to unload the host driver (upstream's template)."""
_VGPU_HOST_FILES = (("cgroup", "/sys/fs/cgroup"), ("vfio", "/dev/vfio"))
"""What a vGPU manager pod adds to the driver pod (vGPUs are VFIO devices handed to
VMs, under the host's cgroups): volume name and host path, mounted at the same path."""


def _add_pool_os_files(
    pod: dict[str, Any], policy: ClusterPolicySpec, pool: NodePool, runtime: str
) -> None:
    """The host's subscription files for the pool's OS, where upstream's NVIDIADriver
    adds them (`internal/state/driver_volumes.go`, `getDriverAdditionalConfigs`):
    compiled drivers only, decided by the pool's OS and the cluster's container runtime
    (`clusterinfo.GetContainerRuntime`), on every container that gets the resource's
    additional configuration, after its repository and certificate files."""
    if policy.driver.use_precompiled:
        return
    repo = policy.driver.repo_config
    files = subscription_files(
        pool.facts.os_id, runtime, repo_config=bool(repo and repo.config_map_name)
    )
    files.add_to(pod, RESOURCE_CONFIG_CONTAINERS)


def _insert_after(items: list[dict[str, Any]], name: str, new: list[dict[str, Any]]) -> None:
    at = next((i + 1 for i, item in enumerate(items) if item["name"] == name), len(items))
    items[at:at] = new


def _as_vgpu_host_manager(pod: dict[str, Any]) -> dict[str, Any]:
    """The driver pod as upstream's NVIDIADriver template renders it for `driverType:
    vgpu-host-manager` (`manifests/state-driver/0500_daemonset.yaml`): the host's
    cgroup tree and `/dev/vfio` mounted after the OS release file, no startup probe and
    no preStop hook in the driver container, and 120 s to stop (``render_pool``). No
    readiness probe either: ours tests for the driver-ready file the startup probe
    writes, which no vGPU manager pod would then ever have (upstream's template has no
    readiness probe for any driver type)."""
    volumes = [{"name": name, "hostPath": {"path": path}} for name, path in _VGPU_HOST_FILES]
    _insert_after(pod["volumes"], "host-os-release", volumes)
    for container in pod["containers"]:
        if container["name"] != DRIVER_CONTAINER:
            continue
        mounts = [{"name": name, "mountPath": path} for name, path in _VGPU_HOST_FILES]
        _insert_after(container["volumeMounts"], "host-os-release", mounts)
        for key in ("startupProbe", "lifecycle", "readinessProbe"):
            container.pop(key, None)
    return pod


def pool_digest(
    spec: NVIDIADriverSpec, pool: NodePool, base: ClusterPolicySpec, pod: dict[str, Any]
) -> str:
    """The install digest (`DRIVER_CONFIG_DIGEST`) of one pool's DaemonSet: upstream
    computes it from the resource, not from the pod (`internal/state/driver.go`,
    `ConfigDigest` over `buildDriverInstallConfig`; see
    :func:`components.driver_digest.resource_install_state`), with the pool's kernel and
    the ClusterPolicy's `hostPaths.rootFS` as host root (what the pod mounts as
    `host-root`). Upstream's controller passes `/` instead when a GPUCluster exists
    beside the ClusterPolicy (`controllers/nvidiadriver_controller.go`); we render from
    the ClusterPolicy alone, so there a `rootFS` other than `/` gives another digest."""
    return driver_digest.resource_digest(
        spec, pod, kernel=pool.kernel, host_root=base.host_paths.root_fs
    )


def render_pool(
    owner: str,
    uid: str,
    spec: NVIDIADriverSpec,
    pool: NodePool,
    base: ClusterPolicySpec,
    ctx: RenderContext,
) -> Manifest:
    """The driver DaemonSet of one pool."""
    check(spec, base)
    policy = policy_for(spec, base)
    pool_ctx = dataclasses.replace(ctx, gpu_nodes=(pool.facts,))
    problems = site_config(policy, pool_ctx).problems
    if problems:
        raise NVIDIADriverRenderError(f"pool {pool.name}: " + "; ".join(problems))
    pod = driver.pod_spec(policy, pool_ctx, pool.kernel, os_files=False)
    _add_pool_os_files(pod, policy, pool, ctx.container_runtime)
    pod = _as_upstream_pool(pod, policy)
    vgpu_host = spec.driver_type == VGPU_HOST_MANAGER
    if vgpu_host:
        pod = _as_vgpu_host_manager(pod)
    # the ClusterPolicy driver's pod-based digest, replaced by the resource's own
    driver_digest.write_digest(pod, pool_digest(spec, pool, base, pod))
    if spec.node_affinity:
        pod["affinity"] = {**pod["affinity"], "nodeAffinity": spec.node_affinity}
    if spec.pod_security_context:
        pod["securityContext"] = spec.pod_security_context
    name = app_name(spec.driver_type, pool.os_tag, uid, pool.kernel)
    selector = {deploy_label(spec): TRUE, **pool.node_selector}
    ds = daemonset(
        name,
        driver.NAME,
        policy,
        pool_ctx,
        pod,
        node_selector=selector,
        update_strategy={"type": "OnDelete"},
        pod_annotations={"kubectl.kubernetes.io/default-container": driver.CONTAINER_NAME},
        host_network=spec.host_network,
        grace_period=VGPU_HOST_MANAGER_GRACE_PERIOD if vgpu_host else None,
    )
    component = "nvidia-vgpu-host-manager" if vgpu_host else "nvidia-driver"
    marks = {
        driver.COMPONENT_POD_LABEL: component,
        driver.PRECOMPILED_LABEL: str(spec.precompiled).lower(),
        OS_VERSION_POD_LABEL: pool.os_tag,
    }
    if pool.kernel:
        marks[KERNEL_POD_LABEL] = driver.sanitized_kernel(pool.kernel)
    ds["spec"]["template"]["metadata"]["labels"].update(marks)
    ds["metadata"]["labels"].update(marks)
    ds["metadata"]["annotations"] = {
        "openshift.io/scc": driver_name(owner, spec.driver_type, pool.os_tag),
        **(spec.annotations or {}),
    }
    return ds


def render(
    owner: str,
    uid: str,
    spec: NVIDIADriverSpec,
    nodes: Iterable[Mapping[str, Any]],
    base: ClusterPolicySpec,
    ctx: RenderContext,
) -> list[Manifest]:
    """Every driver DaemonSet of one resource over ``nodes`` (a pool per OS/kernel)."""
    check(spec, base)
    return [render_pool(owner, uid, spec, p, base, ctx) for p in node_pools(owner, spec, nodes)]
