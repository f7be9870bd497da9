"""The ClusterPolicy resource: spec sections, the object itself and its API coordinates."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from crd._common import IntOrCountOrPercent, JsonObject, K8sModel, PodSecurityContext, Toleration
from crd._components import (
    DCGMExporterSpec,
    DCGMSpec,
    DevicePluginSpec,
    GDRCopySpec,
    GPUDirectStorageSpec,
    GPUFeatureDiscoverySpec,
    MIGManagerSpec,
    NodeStatusExporterSpec,
    OperatorSpec,
    ToolkitSpec,
    ValidatorSpec,
)
from crd._driver_spec import DriverSpec
from crd._health import HealthRemediationSpec
from crd._sandbox import (
    CCManagerSpec,
    KataManagerSpec,
    KataSandboxDevicePluginSpec,
    SandboxDevicePluginSpec,
    VFIOManagerSpec,
    VGPUDeviceManagerSpec,
    VGPUManagerSpec,
)
from crd._status import ClusterPolicyStatus

GROUP = "nvidia.com"
VERSION = "v1"
API_VERSION: Literal["nvidia.com/v1"] = "nvidia.com/v1"
KIND: Literal["ClusterPolicy"] = "ClusterPolicy"
PLURAL = "clusterpolicies"
SINGULAR = "clusterpolicy"
SHORT_NAMES = ("cp",)
CRD_NAME = f"{PLURAL}.{GROUP}"
DEFAULT_POLICY_NAME = "cluster-policy"
"""The name upstream's chart gives its policy; kept so existing runbooks still work."""


def _gpu_toleration() -> list[Toleration]:
    return [Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")]


class RollingUpdateSpec(K8sModel):
    """Rolling update of operand DaemonSets (not the driver: see driver.upgradePolicy)."""

    max_unavailable: IntOrCountOrPercent = "1"
    """Nodes (or percentage) whose operand pod may be down at once during an update."""


class DaemonsetsSpec(K8sModel):
    """Settings applied to every operand DaemonSet and its pods."""

    labels: dict[str, str] = Field(default_factory=dict)
    """Extra labels on every operand pod."""
    annotations: dict[str, str] = Field(default_factory=dict)
    """Extra annotations on every operand pod."""
    tolerations: list[Toleration] = Field(default_factory=_gpu_toleration)
    """Tolerations of every operand pod (default: the `nvidia.com/gpu` taint)."""
    priority_class_name: str = "system-node-critical"
    """PriorityClass of every operand pod."""
    update_strategy: Literal["RollingUpdate", "OnDelete"] = "RollingUpdate"
    """How operand DaemonSets replace their pods when their template changes."""
    rolling_update: RollingUpdateSpec = Field(default_factory=RollingUpdateSpec)
    """Rolling update parameters (used with RollingUpdate)."""
    pod_security_context: PodSecurityContext | None = None
    """Pod-level security context of every operand pod."""


class MIGSpec(K8sModel):
    """How MIG devices are exposed to workloads."""

    strategy: Literal["none", "single", "mixed"] = "single"
    """none: whole GPUs; single: one MIG profile per node as nvidia.com/gpu; mixed: per profile."""


class PSPSpec(K8sModel):
    """Deprecated PodSecurityPolicy switch; accepted for old policies, has no effect."""

    enabled: bool = False
    """Ignored: PodSecurityPolicy was removed in Kubernetes 1.25."""


class PSASpec(K8sModel):
    """Pod Security Admission labels on the operator namespace."""

    enabled: bool = False
    """Label the operator namespace for the privileged Pod Security level."""


class CDIConfigSpec(K8sModel):
    """Container Device Interface support in the toolkit and device plugin."""

    enabled: bool = True
    """Generate CDI specs and let the device plugin hand devices out through CDI."""
    default: bool = False
    """Make CDI the default way containers get GPUs (needs enabled)."""
    nri_plugin_enabled: bool = False
    """Inject CDI devices into management containers through an NRI plugin."""


class HostPathsSpec(K8sModel):
    """Host paths operands mount."""

    root_fs: str = Field(default="/", alias="rootFS")
    """The host's root filesystem."""
    driver_install_dir: str = "/run/nvidia/driver"
    """Where the driver container exposes the driver's files on the host."""
    kubelet_root_dir: str = "/var/lib/kubelet"
    """The kubelet's root directory (device plugin and pod-resources sockets live under it)."""


class SandboxWorkloadsSpec(K8sModel):
    """GPUs for virtual machines (KubeVirt, Kata) next to containers."""

    enabled: bool = False
    """Honour `nvidia.com/gpu.workload.config` node labels."""
    default_workload: Literal["container", "vm-passthrough", "vm-vgpu"] = "container"
    """Workload of nodes without the label."""
    mode: Literal["kubevirt", "kata"] = "kubevirt"
    """How VMs get GPUs: KubeVirt (passthrough/vGPU devices) or Kata containers."""


class ClusterPolicySpec(K8sModel):
    """Desired state of the GPU software stack on every GPU node."""

    operator: OperatorSpec = Field(default_factory=OperatorSpec)
    """Operator-wide settings."""
    daemonsets: DaemonsetsSpec = Field(default_factory=DaemonsetsSpec)
    """Settings shared by all operand DaemonSets."""
    driver: DriverSpec = Field(default_factory=DriverSpec)
    """NVIDIA driver."""
    toolkit: ToolkitSpec = Field(default_factory=ToolkitSpec)
    """NVIDIA Container Toolkit."""
    device_plugin: DevicePluginSpec = Field(default_factory=DevicePluginSpec)
    """Kubernetes device plugin."""
    dcgm: DCGMSpec = Field(default_factory=DCGMSpec)
    """Standalone DCGM."""
    dcgm_exporter: DCGMExporterSpec = Field(default_factory=DCGMExporterSpec)
    """DCGM exporter."""
    gfd: GPUFeatureDiscoverySpec = Field(default_factory=GPUFeatureDiscoverySpec)
    """GPU feature discovery."""
    mig_manager: MIGManagerSpec = Field(default_factory=MIGManagerSpec)
    """MIG manager."""
    node_status_exporter: NodeStatusExporterSpec = Field(default_factory=NodeStatusExporterSpec)
    """Node status exporter."""
    validator: ValidatorSpec = Field(default_factory=ValidatorSpec)
    """Operator validator."""
    mig: MIGSpec = Field(default_factory=MIGSpec)
    """MIG strategy."""
    psp: PSPSpec | None = None
    """Deprecated, ignored."""
    psa: PSASpec = Field(default_factory=PSASpec)
    """Pod Security Admission."""
    cdi: CDIConfigSpec = Field(default_factory=CDIConfigSpec)
    """Container Device Interface."""
    host_paths: HostPathsSpec = Field(default_factory=HostPathsSpec)
    """Host paths."""
    sandbox_workloads: SandboxWorkloadsSpec = Field(default_factory=SandboxWorkloadsSpec)
    """Virtual machine workloads."""
    vgpu_manager: VGPUManagerSpec = Field(default_factory=VGPUManagerSpec)
    """vGPU manager."""
    vgpu_device_manager: VGPUDeviceManagerSpec = Field(default_factory=VGPUDeviceManagerSpec)
    """vGPU device manager."""
    vfio_manager: VFIOManagerSpec = Field(default_factory=VFIOManagerSpec)
    """VFIO manager."""
    sandbox_device_plugin: SandboxDevicePluginSpec = Field(default_factory=SandboxDevicePluginSpec)
    """Sandbox device plugin."""
    kata_sandbox_device_plugin: KataSandboxDevicePluginSpec = Field(
        default_factory=KataSandboxDevicePluginSpec
    )
    """Kata sandbox device plugin."""
    kata_manager: KataManagerSpec = Field(default_factory=KataManagerSpec)
    """Kata manager."""
    cc_manager: CCManagerSpec = Field(default_factory=CCManagerSpec)
    """Confidential computing manager."""
    gds: GPUDirectStorageSpec = Field(default_factory=GPUDirectStorageSpec)
    """GPUDirect Storage."""
    gdrcopy: GDRCopySpec = Field(default_factory=GDRCopySpec)
    """GDRCopy."""
    health_remediation: HealthRemediationSpec | None = None
    """GPU health remediation (a gpuop extension; absent or disabled: off)."""


class ClusterPolicy(K8sModel):
    """A ClusterPolicy object as stored by the API server."""

    api_version: Literal["nvidia.com/v1"] = API_VERSION
    """Always nvidia.com/v1."""
    kind: Literal["ClusterPolicy"] = KIND
    """Always ClusterPolicy."""
    metadata: JsonObject = Field(default_factory=dict)
    """Object metadata, owned by the API server and kept as is."""
    spec: ClusterPolicySpec = Field(default_factory=ClusterPolicySpec)
    """Desired state (upstream's schema takes an object without one: all defaults)."""
    status: ClusterPolicyStatus | None = None
    """Observed state, written by the operator."""

    @property
    def name(self) -> str:
        """metadata.name, or empty for an object not yet named."""
        value = self.metadata.get("name", "")
        return value if isinstance(value, str) else ""
