"""Building blocks shared by every ClusterPolicy section.

The base model fixes the conventions once: camelCase wire names (upstream's), snake_case
Python attributes, strict types (the API server would refuse `"true"` for a boolean, so
the model does too) and unknown keys refused (a typo must not silently fall back to a
default). Sections that deliberately keep unknown keys say so with `extra="allow"`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema
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
PULL_POLICIES: dict[str, ImagePullPolicy] = {p: p for p in ("Always", "IfNotPresent", "Never")}
"""The pull policies Kubernetes knows, by name."""

Runtime = Literal["docker", "crio", "containerd"]
RUNTIMES: dict[str, Runtime] = {r: r for r in ("docker", "crio", "containerd")}
"""The container runtimes the toolkit can configure, by name."""


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


DURATION_PATTERN = (
    r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?"
    r"(([0-9]+)ms)?)$"
)
"""A Prometheus duration (`15s`, `1m30s`, `0`); the Prometheus Operator's own pattern."""

Duration = Annotated[str, Field(pattern=DURATION_PATTERN)]


class RelabelConfig(K8sModel):
    """One Prometheus relabel rule (the Prometheus Operator's RelabelConfig)."""

    action: (
        Literal[
            "replace",
            "Replace",
            "keep",
            "Keep",
            "drop",
            "Drop",
            "hashmod",
            "HashMod",
            "labelmap",
            "LabelMap",
            "labeldrop",
            "LabelDrop",
            "labelkeep",
            "LabelKeep",
            "lowercase",
            "Lowercase",
            "uppercase",
            "Uppercase",
            "keepequal",
            "KeepEqual",
            "dropequal",
            "DropEqual",
        ]
        | None
    ) = None
    """What to do with a match; Prometheus treats an omitted action as `replace`."""
    modulus: Annotated[int, Field(ge=0)] | None = None
    """Modulus of the hash of the source values (hashmod only)."""
    regex: str | None = None
    """Regular expression matched against the joined source values."""
    replacement: str | None = None
    """Value written on a match (capture groups available)."""
    separator: str | None = None
    """Joins the source label values."""
    source_labels: list[str] | None = None
    """Labels whose values are joined and matched."""
    target_label: str | None = None
    """Label the result is written to."""


def _checked_rule(rule: JsonObject) -> JsonObject:
    """Validate a rule like the API server would, but keep the plain dict: renderers pass
    relabel rules into the ServiceMonitor as written."""
    RelabelConfig.model_validate(rule)
    return rule


Relabelings = Annotated[
    list[Annotated[JsonObject, AfterValidator(_checked_rule)]],
    WithJsonSchema({"type": "array", "items": RelabelConfig.model_json_schema(by_alias=True)}),
]
"""Prometheus relabel rules: schema and checks of :class:`RelabelConfig`, values as dicts."""


class SELinuxOptions(K8sModel):
    """SELinux labels for a pod (core/v1 SELinuxOptions)."""

    level: str | None = None
    """SELinux level."""
    role: str | None = None
    """SELinux role."""
    type: str | None = None
    """SELinux type."""
    user: str | None = None
    """SELinux user."""


class SecurityProfile(K8sModel):
    """A seccomp or AppArmor profile (core/v1 SeccompProfile / AppArmorProfile)."""

    type: str
    """RuntimeDefault, Unconfined or Localhost."""
    localhost_profile: str | None = None
    """Profile on the node, with type Localhost."""


class Sysctl(K8sModel):
    """A namespaced sysctl set for a pod (core/v1 Sysctl)."""

    name: str
    """Sysctl name."""
    value: str
    """Sysctl value."""


class WindowsSecurityContextOptions(K8sModel):
    """Windows-only security settings (core/v1 WindowsSecurityContextOptions)."""

    gmsa_credential_spec: str | None = None
    """GMSA credential spec content."""
    gmsa_credential_spec_name: str | None = None
    """Name of the GMSA credential spec."""
    host_process: bool | None = None
    """Run as a host process container."""
    run_as_user_name: str | None = None
    """User name of the entrypoint."""


class PodSecurityContext(K8sModel):
    """Pod-level security settings for operand pods (core/v1 PodSecurityContext)."""

    app_armor_profile: SecurityProfile | None = None
    """AppArmor profile."""
    fs_group: int | None = None
    """Supplemental group owning volumes."""
    fs_group_change_policy: str | None = None
    """OnRootMismatch or Always."""
    run_as_group: int | None = None
    """GID of the entrypoint."""
    run_as_non_root: bool | None = None
    """Refuse to start as root."""
    run_as_user: int | None = None
    """UID of the entrypoint."""
    se_linux_change_policy: str | None = None
    """How the SELinux label is applied to volumes."""
    se_linux_options: SELinuxOptions | None = None
    """SELinux context."""
    seccomp_profile: SecurityProfile | None = None
    """Seccomp profile."""
    supplemental_groups: (
        Annotated[list[int], Field(json_schema_extra={"x-kubernetes-list-type": "atomic"})] | None
    ) = None
    """Extra groups of the first process."""
    supplemental_groups_policy: str | None = None
    """Merge or Strict."""
    sysctls: (
        Annotated[list[Sysctl], Field(json_schema_extra={"x-kubernetes-list-type": "atomic"})]
        | None
    ) = None
    """Namespaced sysctls."""
    windows_options: WindowsSecurityContextOptions | None = None
    """Windows settings."""
