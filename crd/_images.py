"""Operand images: the operator's defaults and how a section's fields become a reference.

Each part (repository, image, version) falls back to the default on its own, so a private
registry needs only `repository` and a pinned driver only `version`. An `image` that
already carries a tag or digest is used as is, as upstream does with full references.
"""

from __future__ import annotations

from dataclasses import dataclass

from crd._components import ImageSpec
from crd._policy import ClusterPolicySpec


@dataclass(frozen=True)
class DefaultImage:
    """An operand image the operator ships with."""

    repository: str
    image: str
    version: str

    @property
    def ref(self) -> str:
        """The full reference."""
        return f"{self.repository}/{self.image}:{self.version}"


CUDA_SAMPLE_IMAGE = "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda11.7.1-ubuntu20.04"
"""Workload the validator runs to prove a GPU can be used (overridable)."""

_NVIDIA = "nvcr.io/nvidia"
_CLOUD_NATIVE = "nvcr.io/nvidia/cloud-native"
_DEVICE_PLUGIN = DefaultImage(_NVIDIA, "k8s-device-plugin", "v0.20.0")
_DRIVER_MANAGER = DefaultImage(_CLOUD_NATIVE, "k8s-driver-manager", "v0.12.0")
_VALIDATOR = DefaultImage(_CLOUD_NATIVE, "gpu-operator-validator", "v25.10.0")

DEFAULT_IMAGES: dict[str, DefaultImage] = {
    "driver": DefaultImage(_NVIDIA, "driver", "595.91.07"),
    "driver.manager": _DRIVER_MANAGER,
    "toolkit": DefaultImage(f"{_NVIDIA}/k8s", "container-toolkit", "v1.20.0"),
    "devicePlugin": _DEVICE_PLUGIN,
    "gfd": _DEVICE_PLUGIN,
    "dcgm": DefaultImage(_CLOUD_NATIVE, "dcgm", "4.6.0-1-ubuntu24.04"),
    "dcgmExporter": DefaultImage(f"{_NVIDIA}/k8s", "dcgm-exporter", "4.6.0-4.8.3-distroless"),
    "migManager": DefaultImage(_CLOUD_NATIVE, "k8s-mig-manager", "v0.15.0"),
    "validator": _VALIDATOR,
    "nodeStatusExporter": _VALIDATOR,
    "operator.initContainer": DefaultImage(_NVIDIA, "cuda", "13.0.1-base-ubi9"),
    "vgpuManager.driverManager": _DRIVER_MANAGER,
    "vgpuDeviceManager": DefaultImage(_CLOUD_NATIVE, "vgpu-device-manager", "v0.5.0"),
    "vfioManager": _DRIVER_MANAGER,
    "vfioManager.driverManager": _DRIVER_MANAGER,
    "sandboxDevicePlugin": DefaultImage(_NVIDIA, "kubevirt-gpu-device-plugin", "v1.6.0"),
    "kataSandboxDevicePlugin": DefaultImage(
        _CLOUD_NATIVE, "nvidia-sandbox-device-plugin", "v0.0.5"
    ),
    "kataManager": DefaultImage(_CLOUD_NATIVE, "k8s-kata-manager", "v0.2.3"),
    "ccManager": DefaultImage(_CLOUD_NATIVE, "k8s-cc-manager", "v0.4.3"),
    "gds": DefaultImage(_CLOUD_NATIVE, "nvidia-fs", "2.29.4"),
    "gdrcopy": DefaultImage(_CLOUD_NATIVE, "gdrdrv", "v2.6"),
}
"""Default image per section path (wire names). vgpuManager has none: its image is
built by the user from NVIDIA's licensed vGPU host driver."""


class ImageRefError(ValueError):
    """A section names no usable image; `path` is the missing field."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


def has_tag_or_digest(image: str) -> bool:
    """True when the reference already pins a tag or digest (a registry port is not a tag)."""
    return "@" in image or ":" in image.rsplit("/", 1)[-1]


def image_ref(spec: ImageSpec | None, default: DefaultImage | None, path: str = "") -> str:
    """The full image reference for a section, falling back part by part to `default`.

    `image` with a tag or digest is returned unchanged; `image` with a path but no tag
    gets only the version; a bare name gets repository and version.
    """
    image = (spec.image if spec else None) or (default.image if default else None)
    if not image:
        raise ImageRefError(f"{path}.image", "no image set and no default image")
    if has_tag_or_digest(image):
        return image
    version = (spec.version if spec else None) or (default.version if default else None)
    if not version:
        raise ImageRefError(f"{path}.version", "no version set and no default version")
    separator = "@" if version.startswith("sha256:") else ":"
    if "/" in image:
        return f"{image}{separator}{version}"
    repository = (spec.repository if spec else None) or (default.repository if default else None)
    if not repository:
        raise ImageRefError(f"{path}.repository", "no repository set and no default")
    return f"{repository.rstrip('/')}/{image}{separator}{version}"


def _section(spec: ClusterPolicySpec, component: str) -> ImageSpec | None:
    """The ImageSpec at a wire path such as `driver.manager`."""
    node: object = spec
    for part in component.split("."):
        name = _attribute(type(node), part)
        node = getattr(node, name) if name else None
        if node is None:
            return None
    if not isinstance(node, ImageSpec):
        raise KeyError(component)
    return node


def _attribute(model: type, alias: str) -> str | None:
    fields = getattr(model, "model_fields", {})
    for name, info in fields.items():
        if (info.alias or name) == alias:
            return str(name)
    return None


def component_image(spec: ClusterPolicySpec, component: str) -> str:
    """Full image of a section by wire path (`driver`, `driver.manager`, `gfd`...)."""
    if _attribute(type(spec), component.split(".", 1)[0]) is None:
        raise KeyError(component)
    default = DEFAULT_IMAGES.get(component)
    return image_ref(_section(spec, component), default, f"spec.{component}")
