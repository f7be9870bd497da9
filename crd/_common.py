"""Building blocks shared by every ClusterPolicy section.

The base model fixes the conventions once: camelCase wire names (upstream's), snake_case
Python attributes, strict types (the API server would refuse `"true"` for a boolean, so
the model does too) and unknown keys refused (a typo must not silently fall back to a
default). Sections that deliberately keep unknown keys say so with `extra="allow"`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema
from pydantic.alias_generators import to_camel

PERCENT_PATTERN = r"^(100|[1-9]?[0-9])%$"
"""A percentage from 0% to 100%, as Kubernetes int-or-percent fields accept it."""

COUNT_OR_PERCENT_PATTERN = r"^([0-9]+|(100|[1-9]?[0-9])%)$"
"""A whole number written as a string ("1", upstream's chart style) or a percentage."""

QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
"""Kubernetes resource.Quantity syntax (what `kubectl` accepts for cpu/memory)."""

LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"


def _int_or_string(pattern: str, description: str) -> WithJsonSchema:
    """Schema for an int-or-string field; `minimum` only binds integers, `pattern` strings."""
    return WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "minimum": 0,
            "pattern": pattern,
            "description": description,
        }
    )


IntOrPercent = Annotated[
    Annotated[int, Field(ge=0)] | Annotated[str, Field(pattern=PERCENT_PATTERN)],
    _int_or_string(PERCENT_PATTERN, "A non-negative integer or a percentage (0%-100%)."),
]
"""A count of nodes, or a percentage of them (rounded up)."""

IntOrCountOrPercent = Annotated[
    Annotated[int, Field(ge=0)] | Annotated[str, Field(pattern=COUNT_OR_PERCENT_PATTERN)],
    _int_or_string(
        COUNT_OR_PERCENT_PATTERN,
        'A non-negative integer, the same written as a string ("1"), or a percentage.',
    ),
]
"""Like :data:`IntOrPercent` but also the quoted whole numbers upstream's chart writes."""

Quantity = Annotated[
    int | Annotated[str, Field(pattern=QUANTITY_PATTERN)],
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
        }
    ),
]
"""A Kubernetes resource quantity such as `500m` or `1Gi`."""

JsonObject = dict[str, Any]
"""Free-form object kept as written (schema: `x-kubernetes-preserve-unknown-fields`)."""

ImagePullPolicy = Literal["Always", "IfNotPresent", "Never"]


class K8sModel(BaseModel):
    """Base of every model: upstream camelCase on the wire, strict, no unknown keys."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        strict=True,
        extra="forbid",
        use_attribute_docstrings=True,
        validate_default=False,
    )


class EnvVar(K8sModel):
    """An environment variable for an operand container (core/v1 EnvVar)."""

    name: Annotated[str, Field(min_length=1)]
    """Variable name."""
    value: str | None = None
    """Literal value."""
    value_from: JsonObject | None = None
    """Source of the value (core/v1 EnvVarSource), passed through unchanged."""


class ResourceRequirements(K8sModel):
    """Compute resources of an operand container (core/v1 ResourceRequirements)."""

    limits: dict[str, Quantity] | None = None
    """Maximum resources, e.g. `{cpu: 500m, memory: 1Gi}`."""
    requests: dict[str, Quantity] | None = None
    """Minimum resources the scheduler reserves."""


class Toleration(K8sModel):
    """A taint toleration added to every operand pod (core/v1 Toleration)."""

    key: str | None = None
    """Taint key; empty with operator Exists matches every taint."""
    operator: Literal["Exists", "Equal"] | None = None
    """How key and value are compared; Equal when omitted."""
    value: str | None = None
    """Taint value to match (must be empty with Exists)."""
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect to match; empty matches every effect."""
    toleration_seconds: int | None = None
    """How long a NoExecute taint is tolerated before eviction."""
