"""Per-operand sections of the ClusterPolicy spec.

Every operand shares the same image and container knobs (:class:`ComponentSpec`); the
sections below add only what is particular to one operand. Image coordinates carry no
default here: they fall back to the operator's built-in images at reconcile time (see
`crd._images`), so upgrading the operator moves unpinned operands to its tested versions.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from crd._common import (
    PULL_POLICIES,
    RUNTIMES,
    Duration,
    EnvVar,
    ImagePullPolicy,
    K8sModel,
    Relabelings,
    ResourceRequirements,
    Runtime,
)
from crd._image_defaults import (
    CLOUD_NATIVE,
    DEVICE_PLUGIN_IMAGE,
    NVIDIA,
    VALIDATOR_IMAGE,
    DefaultImage,
)


class ImageSpec(K8sModel):
    """Where an image comes from; each part overrides the operator's default separately."""

    default_image: ClassVar[DefaultImage | None] = None
    """The operator's image for this section (None: the user must name one), which
    `crd._images.DEFAULT_IMAGES` collects."""

    repository: str | None = None
    """Registry and path, e.g. `nvcr.io/nvidia`; for private registries."""
    image: str | None = None
    """Image name, or a full reference with registry and tag (then used as is)."""
    version: str | None = None
    """Image tag (or a `sha256:` digest)."""
    pull_policy_as_written: str = Field(default="IfNotPresent", alias="imagePullPolicy")
    """When the kubelet pulls the image: Always, IfNotPresent or Never (any other value
    is kept as written but means IfNotPresent, as upstream treats it)."""
    image_pull_secrets: list[str] | None = None
    """Names of Secrets in the operator namespace used to pull the image."""

    @property
    def image_pull_policy(self) -> ImagePullPolicy:
        """The pull policy operand pods get."""
        return PULL_POLICIES.get(self.pull_policy_as_written, "IfNotPresent")


class _Switch(K8sModel):
    """The on/off switch, a base of its own so it comes first in every section."""

    enabled: bool = True
    """Deploy this operand."""


class ComponentSpec(ImageSpec, _Switch):
    """Knobs every operand has: on/off, image, resources, arguments and environment."""

    honours_host_network: ClassVar[bool] = True
    """Whether `hostNetwork` moves the operand's pods into the node's network (False: a
    set `hostNetwork` is reported as having no effect, `crd._unsupported`)."""

    resources: ResourceRequirements | None = None
    """Compute resources of the operand's main container."""
    args: list[str] | None = None
    """Extra arguments for the operand's main container."""
    env: list[EnvVar] | None = None
    """Extra environment variables for the operand's main container."""
    host_network: bool | None = None
    """Run the operand's pods in the host network namespace."""


class InitContainerSpec(ImageSpec):
    """Image of the init container that waits for the driver in operand pods."""

    default_image = DefaultImage(NVIDIA, "cuda", "13.0.1-base-ubi9")


class ServiceMonitorSpec(K8sModel):
    """A Prometheus Operator ServiceMonitor for a metrics endpoint."""

    enabled: bool = False
    """Create a ServiceMonitor."""
    interval: Duration | None = None
    """Scrape interval, e.g. `15s`."""
    scrape_timeout: Duration | None = None
    """Scrape timeout, e.g. `10s`; at most the interval."""
    honor_labels: bool = False
    """Keep the target's labels when they clash with server-side ones."""
    additional_labels: dict[str, str] | None = None
    """Extra labels on the ServiceMonitor (to match a Prometheus selector); on the
    operator's and the node status exporter's also on their PrometheusRules."""
    relabelings: Relabelings | None = None
    """Prometheus relabel rules for the scraped targets."""


class OperatorMetricsSpec(K8sModel):
    """Scraping of the operator's own metrics."""

    service_monitor: ServiceMonitorSpec | None = None
    """ServiceMonitor for the operator's metrics Service."""


class OperatorSpec(K8sModel):
    """Settings of the operator itself that shape every operand."""

    runtime_as_written: str = Field(default="docker", alias="defaultRuntime")
    """Container runtime assumed on nodes that do not report one: docker, crio or
    containerd (upstream ignores the field; any other value is kept but means docker)."""
    runtime_class: str = "nvidia"
    """Name of the RuntimeClass operand and GPU pods use."""
    init_container: InitContainerSpec | None = None
    """Image for operands' init containers."""
    use_ocp_driver_toolkit: bool = Field(default=False, alias="use_ocp_driver_toolkit")
    """OpenShift only: build drivers with the Driver Toolkit image."""

    @property
    def default_runtime(self) -> Runtime:
        """The runtime the toolkit configures on nodes that report none."""
        return RUNTIMES.get(self.runtime_as_written, "docker")

    labels: dict[str, str] | None = None
    """Extra labels on the operator's own objects."""
    annotations: dict[str, str] | None = None
    """Extra annotations on the operator's own objects."""
    metrics: OperatorMetricsSpec | None = None
    """The operator's own metrics endpoint."""


class ToolkitSpec(ComponentSpec):
    """The NVIDIA Container Toolkit, which configures the node's container runtime."""

    default_image = DefaultImage(f"{NVIDIA}/k8s", "container-toolkit", "v1.20.0")

    install_dir: str = "/usr/local/nvidia"
    """Host directory the toolkit is installed into."""


class DevicePluginConfig(K8sModel):
    """Device plugin configuration files held in a ConfigMap."""

    name: str | None = None
    """ConfigMap holding one configuration file per key."""
    default: str | None = None
    """Key used on nodes without the `nvidia.com/device-plugin.config` label."""


class MPSConfig(K8sModel):
    """CUDA MPS sharing."""

    root: str = "/run/nvidia/mps"
    """Host directory for MPS pipes and logs."""


class DevicePluginSpec(ComponentSpec):
    """The Kubernetes device plugin that advertises `nvidia.com/gpu`."""

    default_image = DEVICE_PLUGIN_IMAGE

    config: DevicePluginConfig | None = None
    """Configuration files and the default one."""
    mps: MPSConfig | None = None
    """MPS settings."""


class DCGMSpec(ComponentSpec):
    """Standalone DCGM host engine (the exporter embeds one when this is off)."""

    default_image = DefaultImage(CLOUD_NATIVE, "dcgm", "4.6.0-1-ubuntu24.04")

    enabled: bool = False
    """Deploy a standalone DCGM host engine."""
    host_port: int = Field(default=5555, alias="hostPort")
    """Deprecated and unread, as upstream: the engine binds no host port (it would be
    reachable on every GPU node's IP); exporters reach it through the node-local Service."""


class DCGMExporterMetricsConfig(K8sModel):
    """Which metrics the exporter collects."""

    name: str | None = None
    """ConfigMap holding the metrics CSV."""


class DCGMExporterServiceMonitorConfig(ServiceMonitorSpec):
    """Prometheus Operator ServiceMonitor for the exporter."""


class DCGMExporterServiceConfig(K8sModel):
    """The exporter's Service."""

    type: Literal["ClusterIP", "NodePort", "LoadBalancer"] | None = None
    """Service type."""
    internal_traffic_policy: Literal["Cluster", "Local"] | None = None
    """Route in-cluster traffic to any node (Cluster) or only the local one (Local)."""


class HPCJobMappingConfig(K8sModel):
    """HPC job mapping of the DCGM exporter."""

    enabled: bool | None = None
    """Read the job mapping files."""
    directory: str | None = None
    """Directory of the mapping files (the exporter's default when empty)."""


class DCGMExporterSpec(ComponentSpec):
    """DCGM exporter: GPU metrics for Prometheus."""

    default_image = DefaultImage(f"{NVIDIA}/k8s", "dcgm-exporter", "4.6.0-4.8.3-distroless")

    config: DCGMExporterMetricsConfig | None = None
    """Custom metrics configuration."""
    service_monitor: DCGMExporterServiceMonitorConfig | None = None
    """ServiceMonitor for the Prometheus Operator."""
    service: DCGMExporterServiceConfig | None = None
    """Service settings."""
    host_pid: bool | None = Field(default=None, alias="hostPID")
    """Share the host PID namespace (to map GPU processes to pods)."""
    annotations: dict[str, str] | None = None
    """Extra annotations on the exporter's pods."""
    enable_pod_labels: bool | None = None
    """Add the labels of the pod using a GPU to its metrics."""
    enable_pod_uid: bool | None = Field(default=None, alias="enablePodUID")
    """Add the UID of the pod using a GPU to its metrics."""
    pod_label_allowlist_regex: list[str] | None = None
    """Only pod labels matching one of these regexes are added."""
    hpc_job_mapping: HPCJobMappingConfig | None = None
    """Map GPU metrics to HPC jobs from files a workload manager writes."""


class GPUFeatureDiscoverySpec(ComponentSpec):
    """GPU feature discovery: node labels describing the GPUs."""

    default_image = DEVICE_PLUGIN_IMAGE


class MIGPartedConfigSpec(K8sModel):
    """MIG layouts available to the MIG manager."""

    name: str | None = None
    """ConfigMap holding the mig-parted configuration."""
    default: Literal["", "all-disabled"] = "all-disabled"
    """Layout applied to nodes without `nvidia.com/mig.config`."""


class MIGGPUClientsConfigSpec(K8sModel):
    """Host GPU clients the MIG manager stops while it repartitions."""

    name: str | None = None
    """ConfigMap holding the clients list."""


class MIGManagerSpec(ComponentSpec):
    """MIG manager: applies MIG layouts requested by node labels."""

    default_image = DefaultImage(CLOUD_NATIVE, "k8s-mig-manager", "v0.15.0")

    config: MIGPartedConfigSpec | None = None
    """MIG layouts."""
    gpu_clients_config: MIGGPUClientsConfigSpec | None = None
    """Host clients to stop during repartitioning."""


class NodeStatusExporterSpec(ComponentSpec):
    """Node status exporter: per-node operand status as metrics."""

    default_image = VALIDATOR_IMAGE

    enabled: bool = False
    """Deploy the node status exporter."""
    service_monitor: ServiceMonitorSpec | None = None
    """Settings of its ServiceMonitor, created where the Prometheus Operator's CRDs are
    installed (a gpuop extension: upstream's takes none); `additionalLabels` also label
    its PrometheusRule."""


class ValidatorComponentSpec(K8sModel):
    """Settings of one validation step."""

    env: list[EnvVar] | None = None
    """Environment of this validation step (e.g. `WITH_WORKLOAD`)."""


class ValidatorSpec(ComponentSpec):
    """Operator validator: checks each layer works before the next one starts."""

    default_image = VALIDATOR_IMAGE

    plugin: ValidatorComponentSpec | None = None
    """Device plugin validation."""
    driver: ValidatorComponentSpec | None = None
    """Driver validation."""
    toolkit: ValidatorComponentSpec | None = None
    """Container toolkit validation."""
    cuda: ValidatorComponentSpec | None = None
    """CUDA workload validation."""
    vfio_pci: ValidatorComponentSpec | None = Field(default=None, alias="vfioPCI")
    """vfio-pci validation (sandbox workloads)."""
    vgpu_manager: ValidatorComponentSpec | None = None
    """vGPU manager validation."""
    vgpu_devices: ValidatorComponentSpec | None = None
    """vGPU devices validation."""


class GPUDirectStorageSpec(ComponentSpec):
    """GPUDirect Storage (nvidia-fs kernel module, a driver sidecar)."""

    default_image = DefaultImage(CLOUD_NATIVE, "nvidia-fs", "2.29.4")
    honours_host_network = False

    enabled: bool = False
    """Deploy the nvidia-fs sidecar with the driver."""


class GDRCopySpec(ComponentSpec):
    """GDRCopy (gdrdrv kernel module, a driver sidecar)."""

    default_image = DefaultImage(CLOUD_NATIVE, "gdrdrv", "v2.6")
    honours_host_network = False

    enabled: bool = False
    """Deploy the gdrdrv sidecar with the driver."""
