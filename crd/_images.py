"""Operand images: the operator's defaults and how a section's fields become a reference.

Each part (repository, image, version) falls back to the default on its own, so a private
registry needs only `repository` and a pinned driver only `version`. An `image` that
already carries a tag or digest is used as is, as upstream does with full references.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel

from crd._components import ImageSpec
from crd._image_defaults import DefaultImage
from crd._policy import ClusterPolicySpec

CUDA_SAMPLE_IMAGE = "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda11.7.1-ubuntu20.04"
"""Workload the validator runs to prove a GPU can be used (overridable)."""


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The models a field holds (`X | None` holds X)."""
    if get_origin(annotation) in (Union, types.UnionType):
        return [m for arg in get_args(annotation) for m in _models(arg)]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return []


def _defaults(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, DefaultImage]]:
    """Each section under `model` whose class names a default image, by wire path."""
    for name, info in model.model_fields.items():
        path = f"{prefix}{info.alias or name}"
        for child in _models(info.annotation):
            default = child.default_image if issubclass(child, ImageSpec) else None
            if default is not None:
                yield path, default
            yield from _defaults(child, f"{path}.")


DEFAULT_IMAGES: dict[str, DefaultImage] = dict(_defaults(ClusterPolicySpec))
"""Default image per section path (wire names), read off the spec models (each section
class's `default_image`). vgpuManager has none: its image is built by the user from
NVIDIA's licensed vGPU host driver."""


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


def section_at(spec: ClusterPolicySpec, component: str) -> ImageSpec | None:
    """The ImageSpec at a wire path such as `driver.manager` (None where unset)."""
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
    return image_ref(section_at(spec, component), default, f"spec.{component}")
