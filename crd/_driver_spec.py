"""The driver's section of the ClusterPolicy spec (also the base of an NVIDIADriver's):
the container and its probes, the driver manager sidecar, GPUDirect RDMA, build and
licensing configuration, and how upgrades roll across nodes."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from crd._common import EnvVar, K8sModel
from crd._components import ComponentSpec, ImageSpec
from crd._image_defaults import DRIVER_MANAGER_IMAGE, NVIDIA, DefaultImage
from crd._upgrade import ClusterDriverUpgradePolicySpec


class DriverManagerSpec(ImageSpec):
    """The k8s-driver-manager sidecar that prepares a node before a driver (re)install."""

    default_image = DRIVER_MANAGER_IMAGE

    env: list[EnvVar] | None = None
    """Environment of the driver manager (e.g. `ENABLE_GPU_POD_EVICTION`)."""


class ContainerProbeSpec(K8sModel):
    """Timing of a probe on the driver container."""

    initial_delay_seconds: Annotated[int, Field(ge=0)] | None = None
    """Seconds after start before the first probe."""
    timeout_seconds: Annotated[int, Field(ge=1)] | None = None
    """Seconds before one probe times out."""
    period_seconds: Annotated[int, Field(ge=1)] | None = None
    """Seconds between probes."""
    success_threshold: Annotated[int, Field(ge=1)] | None = None
    """Consecutive successes that count as success."""
    failure_threshold: Annotated[int, Field(ge=1)] | None = None
    """Consecutive failures that count as failure."""


class GPUDirectRDMASpec(K8sModel):
    """GPUDirect RDMA support in the driver (nvidia-peermem)."""

    enabled: bool = False
    """Load nvidia-peermem with the driver."""
    use_host_mofed: bool = False
    """MOFED is installed on the host rather than by the network operator."""


class DriverRepoConfigSpec(K8sModel):
    """Custom package repositories for driver builds."""

    config_map_name: str | None = None
    """ConfigMap holding repository files."""


class DriverCertConfigSpec(K8sModel):
    """Custom CA certificates for driver builds."""

    name: str | None = None
    """ConfigMap holding the certificates."""


class DriverLicensingConfigSpec(K8sModel):
    """vGPU guest driver licensing."""

    config_map_name: str | None = None
    """ConfigMap holding gridd.conf."""
    secret_name: str | None = None
    """Secret holding the client configuration token."""
    nls_enabled: bool = False
    """Use NVIDIA License System (rather than legacy licensing); upstream treats unset as off."""


class VirtualTopologyConfigSpec(K8sModel):
    """Virtual topology daemon configuration."""

    config: str | None = None
    """ConfigMap holding the topology file."""


class KernelModuleConfigSpec(K8sModel):
    """Kernel module parameters for the driver."""

    name: str | None = None
    """ConfigMap holding `<module>.conf` files."""


class DriverSpec(ComponentSpec):
    """The containerised NVIDIA driver and how it is upgraded."""

    default_image = DefaultImage(NVIDIA, "driver", "595.91.07")

    use_nvidia_driver_crd: bool = Field(default=False, alias="useNvidiaDriverCRD")
    """Manage drivers with NVIDIADriver resources instead of this section."""
    use_precompiled: bool = False
    """Use precompiled driver images (no build on the node)."""
    use_open_kernel_modules: bool = False
    """Deprecated: use kernelModuleType=open."""
    kernel_module_type: Literal["auto", "open", "proprietary"] = "auto"
    """Kernel module flavour; auto picks the recommended one for the driver branch and GPU."""
    startup_probe: ContainerProbeSpec | None = None
    """Startup probe of the driver container (driver builds can be slow)."""
    liveness_probe: ContainerProbeSpec | None = None
    """Liveness probe of the driver container."""
    readiness_probe: ContainerProbeSpec | None = None
    """Readiness probe of the driver container."""
    rdma: GPUDirectRDMASpec | None = None
    """GPUDirect RDMA."""
    upgrade_policy: ClusterDriverUpgradePolicySpec = Field(
        default_factory=ClusterDriverUpgradePolicySpec
    )
    """How driver upgrades roll across nodes."""
    manager: DriverManagerSpec | None = None
    """The driver manager sidecar."""
    repo_config: DriverRepoConfigSpec | None = None
    """Custom package repositories."""
    cert_config: DriverCertConfigSpec | None = None
    """Custom CA certificates."""
    licensing_config: DriverLicensingConfigSpec | None = None
    """vGPU licensing."""
    virtual_topology: VirtualTopologyConfigSpec | None = None
    """Virtual topology configuration."""
    kernel_module_config: KernelModuleConfigSpec | None = None
    """Kernel module parameters."""
    secret_env: str | None = None
    """Secret whose keys become environment variables of the driver container."""
