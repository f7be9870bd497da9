"""The ClusterPolicy's sections for GPUs handed to virtual machines and sandboxes: vGPU,
VFIO passthrough, KubeVirt and Kata device plugins, the Kata manager and confidential
computing. They serve upstream's sandbox workloads (`sandboxWorkloads`: nodes whose GPUs
go to a VM or a Kata container), kept apart from the operands of containers on the host
driver (`crd._components`).
"""

from __future__ import annotations

from typing import Literal

from crd._common import K8sModel
from crd._components import ComponentSpec
from crd._driver_spec import DriverManagerSpec, KernelModuleConfigSpec
from crd._image_defaults import CLOUD_NATIVE, DRIVER_MANAGER_IMAGE, NVIDIA, DefaultImage


class VGPUManagerSpec(ComponentSpec):
    """vGPU host driver (user-built image; no default)."""

    enabled: bool = False
    """Deploy the vGPU manager."""
    driver_manager: DriverManagerSpec | None = None
    """Driver manager sidecar for the vGPU manager."""
    kernel_module_config: KernelModuleConfigSpec | None = None
    """Kernel module parameters for the vGPU manager."""


class VGPUDevicesConfigSpec(K8sModel):
    """vGPU device layouts."""

    name: str | None = None
    """ConfigMap holding the vGPU device configuration."""
    default: str = "default"
    """Layout applied to nodes without `nvidia.com/vgpu.config`."""


class VGPUDeviceManagerSpec(ComponentSpec):
    """vGPU device manager: creates vGPU devices on vm-vgpu nodes."""

    default_image = DefaultImage(CLOUD_NATIVE, "vgpu-device-manager", "v0.5.0")

    enabled: bool = False
    """Deploy the vGPU device manager (upstream treats unset as off)."""

    config: VGPUDevicesConfigSpec | None = None
    """vGPU device layouts."""


class VFIOManagerSpec(ComponentSpec):
    """VFIO manager: binds GPUs to vfio-pci on vm-passthrough nodes."""

    default_image = DRIVER_MANAGER_IMAGE

    enabled: bool = False
    """Deploy the VFIO manager (upstream treats unset as off)."""

    driver_manager: DriverManagerSpec | None = None
    """Driver manager sidecar that unloads the NVIDIA driver first."""


class SandboxDevicePluginSpec(ComponentSpec):
    """Device plugin advertising passthrough/vGPU devices to KubeVirt VMs."""

    default_image = DefaultImage(NVIDIA, "kubevirt-gpu-device-plugin", "v1.6.0")

    enabled: bool = False
    """Deploy the sandbox device plugin (upstream treats unset as off)."""


class KataSandboxDevicePluginSpec(ComponentSpec):
    """Device plugin advertising GPUs to Kata containers (sandboxWorkloads.mode kata)."""

    default_image = DefaultImage(CLOUD_NATIVE, "nvidia-sandbox-device-plugin", "v0.0.5")

    enabled: bool = False
    """Deploy the Kata sandbox device plugin (upstream treats unset as off)."""


class KataArtifacts(K8sModel):
    """Where the artifacts of one Kata runtime class come from."""

    url: str
    """OCI artifact holding kernel, guest image and configuration."""
    pull_secret: str | None = None
    """Secret used to pull the artifact."""


class KataRuntimeClass(K8sModel):
    """One Kata RuntimeClass the Kata manager sets up."""

    name: str
    """RuntimeClass name."""
    artifacts: KataArtifacts
    """Its artifacts."""
    node_selector: dict[str, str] | None = None
    """Nodes the RuntimeClass schedules onto."""


class KataManagerConfig(K8sModel):
    """Kata manager configuration."""

    artifacts_dir: str = "/opt/nvidia-gpu-operator/artifacts/runtimeclasses"
    """Host directory the artifacts are unpacked into."""
    runtime_classes: list[KataRuntimeClass] | None = None
    """Runtime classes to configure."""


class KataManagerSpec(ComponentSpec):
    """Kata manager: installs Kata runtime artifacts for confidential containers."""

    default_image = DefaultImage(CLOUD_NATIVE, "k8s-kata-manager", "v0.2.3")
    honours_host_network = False

    enabled: bool = False
    """Deploy the Kata manager."""
    config: KataManagerConfig | None = None
    """Kata manager configuration."""


class CCManagerSpec(ComponentSpec):
    """Confidential computing manager: sets the GPUs' CC mode."""

    default_image = DefaultImage(CLOUD_NATIVE, "k8s-cc-manager", "v0.4.3")

    enabled: bool = False
    """Deploy the CC manager."""
    default_mode: Literal["on", "off", "devtools"] = "off"
    """CC mode applied to nodes without `nvidia.com/cc.mode`."""
