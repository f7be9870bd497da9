"""The images the operator ships for its operands, as values the spec models carry.

Each section model names its own default (`ImageSpec.default_image`), so a new operand's
spec class brings its image with it and `crd._images.DEFAULT_IMAGES` is read off the
models. The images several sections share are named here once.
"""

from __future__ import annotations

from dataclasses import dataclass


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


NVIDIA = "nvcr.io/nvidia"
CLOUD_NATIVE = "nvcr.io/nvidia/cloud-native"
DEVICE_PLUGIN_IMAGE = DefaultImage(NVIDIA, "k8s-device-plugin", "v0.20.0")
"""The device plugin's, which GPU feature discovery runs too."""
DRIVER_MANAGER_IMAGE = DefaultImage(CLOUD_NATIVE, "k8s-driver-manager", "v0.12.0")
"""Every driver manager's, and the VFIO manager's (the same image)."""
VALIDATOR_IMAGE = DefaultImage(CLOUD_NATIVE, "gpu-operator-validator", "v25.10.0")
"""Upstream's validator image, the default of `validator` and `nodeStatusExporter`."""
