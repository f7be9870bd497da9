"""Semantic checks a schema cannot express.

The API server's schema refuses malformed policies before we see them; what remains are
combinations that are well-formed but would fail later, far from their cause (a DaemonSet
the API server refuses, an upgrade that can never start, a selector that does not parse).
Each problem names the field so the operator can put it in an `Error` condition rather
than crash or retry forever. Checks that the CRD also states as CEL rules are repeated here
so a policy read from a file gets the same answers without an API server.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from pydantic import ValidationError

from crd._common import QUANTITY_PATTERN, EnvVar, ResourceRequirements, Toleration
from crd._components import ComponentSpec
from crd._images import ImageRefError, component_image, has_tag_or_digest
from crd._policy import ClusterPolicy, ClusterPolicySpec


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a policy: the field path and what is wrong with it."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
_DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_KEY_RE = re.compile(rf"^({_DNS_SUBDOMAIN}/)?{_NAME}$")
_VALUE_RE = re.compile(rf"^({_NAME})?$")
_SET_RE = re.compile(r"^(?P<key>[^\s!=<>(),]+)\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)$")
_BINARY_RE = re.compile(r"^(?P<key>[^\s!=<>(),]+)\s*(?P<op>==|=|!=|<|>)\s*(?P<value>[^\s,]*)$")
_EXISTS_RE = re.compile(r"^(?P<neg>!?)\s*(?P<key>[^\s!=<>(),]+)$")
_QUANTITY_RE = re.compile(QUANTITY_PATTERN)
_SUFFIX = {
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}


def label_key_problem(key: str) -> str | None:
    """Why `key` is not a valid label/annotation key, or None."""
    if not _KEY_RE.match(key):
        return f"invalid key {key!r}"
    prefix, _, name = key.rpartition("/")
    if len(name) > 63:
        return f"key {key!r}: name part longer than 63 characters"
    if len(prefix) > 253:
        return f"key {key!r}: prefix longer than 253 characters"
    return None


def label_value_problem(value: str) -> str | None:
    """Why `value` is not a valid label value, or None."""
    if len(value) > 63 or not _VALUE_RE.match(value):
        return f"invalid label value {value!r}"
    return None


def _split_requirements(selector: str) -> list[str]:
    """Split on commas that are not inside `in (...)` value lists."""
    parts: list[str] = []
    depth = 0
    current = ""
    for char in selector:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [part.strip() for part in parts]


def label_selector_problem(selector: str) -> str | None:
    """Why `selector` is not a Kubernetes label selector string, or None (empty is fine)."""
    if not selector.strip():
        return None
    for requirement in _split_requirements(selector):
        if not requirement:
            return f"empty requirement in selector {selector!r}"
        values: list[str]
        if match := _SET_RE.match(requirement):
            values = [value.strip() for value in match["values"].split(",")]
        elif match := _BINARY_RE.match(requirement):
            values = [match["value"]]
            if match["op"] in "<>" and not values[0].isdigit():
                return f"{requirement!r}: {match['op']} needs a whole number"
        elif match := _EXISTS_RE.match(requirement):
            values = []
        else:
            return f"cannot parse {requirement!r} in selector {selector!r}"
        if problem := label_key_problem(match["key"]):
            return problem
        for value in values:
            if problem := label_value_problem(value):
                return problem
    return None


def parse_quantity(value: int | str) -> Decimal | None:
    """A resource quantity as a number (`500m` -> 0.5, `1Gi` -> 1073741824), or None."""
    if isinstance(value, int):
        return Decimal(value)
    if not _QUANTITY_RE.match(value):
        return None
    match = re.match(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9.]+)?)([A-Za-z]*)$", value)
    if match is None:
        return None
    number, suffix = match.groups()
    if suffix not in _SUFFIX:
        return None
    try:
        return Decimal(number) * _SUFFIX[suffix]
    except ArithmeticError:  # InvalidOperation, or Overflow for exponents like 1E1000000
        return None


def _zero(value: int | str) -> bool:
    """True for 0, "0", "00", "0%": every spelling of none at all."""
    return value == 0 or (isinstance(value, str) and value.rstrip("%").strip("0") == "")


def _env_problems(path: str, env: Sequence[EnvVar] | None) -> Iterator[Problem]:
    seen: set[str] = set()
    for index, var in enumerate(env or ()):
        if var.name in seen:
            yield Problem(f"{path}[{index}].name", f"duplicate variable {var.name!r}")
        seen.add(var.name)
        if var.value is not None and var.value_from is not None:
            yield Problem(f"{path}[{index}]", "set either value or valueFrom, not both")


def _resource_problems(path: str, resources: ResourceRequirements | None) -> Iterator[Problem]:
    if resources is None:
        return
    limits = resources.limits or {}
    for name, request in (resources.requests or {}).items():
        if name not in limits:
            continue
        low, high = parse_quantity(request), parse_quantity(limits[name])
        if low is not None and high is not None and low > high:
            yield Problem(
                f"{path}.requests.{name}",
                f"request {request} is above the limit {limits[name]}",
            )


def _toleration_problems(path: str, tolerations: Sequence[Toleration]) -> Iterator[Problem]:
    for index, toleration in enumerate(tolerations):
        where = f"{path}[{index}]"
        exists = toleration.operator == "Exists"
        if exists and toleration.value:
            yield Problem(f"{where}.value", "must be empty when operator is Exists")
        if not toleration.key and not exists:
            yield Problem(f"{where}.operator", "must be Exists when key is empty")
        if toleration.toleration_seconds is not None and toleration.effect != "NoExecute":
            yield Problem(f"{where}.tolerationSeconds", "only applies to effect NoExecute")
        if toleration.key and (problem := label_key_problem(toleration.key)):
            yield Problem(f"{where}.key", problem)


def _components(spec: ClusterPolicySpec) -> Iterator[tuple[str, ComponentSpec]]:
    for name, info in type(spec).model_fields.items():
        section = getattr(spec, name)
        if isinstance(section, ComponentSpec):
            yield info.alias or name, section


def _image_problems(spec: ClusterPolicySpec) -> Iterator[Problem]:
    for alias, section in _components(spec):
        path = f"spec.{alias}"
        if section.image and has_tag_or_digest(section.image):
            if section.version:
                yield Problem(f"{path}.version", "ignored: image already carries a tag or digest")
            if section.repository:
                yield Problem(f"{path}.repository", "ignored: image is a full reference")
        elif section.image and "/" in section.image and section.repository:
            yield Problem(f"{path}.repository", "ignored: image already includes a repository")
        if section.enabled:
            try:
                component_image(spec, alias)
            except ImageRefError as error:
                yield Problem(error.path, f"required when {alias} is enabled (no default)")


def _section_problems(spec: ClusterPolicySpec) -> Iterator[Problem]:
    driver = spec.driver
    policy = driver.upgrade_policy
    upgrade = "spec.driver.upgradePolicy"
    if policy.auto_upgrade and _zero(policy.max_unavailable):
        yield Problem(f"{upgrade}.maxUnavailable", "0 lets no node upgrade; use autoUpgrade=false")
    for path, selector in (
        (f"{upgrade}.waitForCompletion.podSelector", policy.wait_for_completion.pod_selector),
        (f"{upgrade}.drain.podSelector", policy.drain.pod_selector),
    ):
        if selector and (problem := label_selector_problem(selector)):
            yield Problem(path, problem)
    # GDS, GDRCopy and RDMA without a driver of ours: upstream accepts and ignores them,
    # so they are reported as not acted on (crd._unsupported), not refused.
    # Upstream refuses these two at reconcile time (validateClusterPolicySpec).
    if spec.cdi.nri_plugin_enabled and not spec.cdi.enabled:
        yield Problem("spec.cdi.nriPluginEnabled", "the NRI plugin needs spec.cdi.enabled")
    if spec.cdi.nri_plugin_enabled and not spec.toolkit.enabled:
        yield Problem("spec.cdi.nriPluginEnabled", "the NRI plugin needs spec.toolkit.enabled")
    daemonsets = spec.daemonsets
    if daemonsets.update_strategy == "RollingUpdate" and _zero(
        daemonsets.rolling_update.max_unavailable
    ):
        yield Problem(
            "spec.daemonsets.rollingUpdate.maxUnavailable",
            "must be at least 1 (or 1%): DaemonSets refuse 0",
        )
    for key, value in daemonsets.labels.items():
        if problem := label_key_problem(key) or label_value_problem(value):
            yield Problem(f"spec.daemonsets.labels[{key}]", problem)
    for key in daemonsets.annotations:
        if problem := label_key_problem(key):
            yield Problem(f"spec.daemonsets.annotations[{key}]", problem)
    yield from _toleration_problems("spec.daemonsets.tolerations", daemonsets.tolerations)


def validate_spec(spec: ClusterPolicySpec) -> list[Problem]:
    """Every semantic problem of a spec that parsed, in a stable order; empty when fine."""
    problems = list(_section_problems(spec))
    problems.extend(_image_problems(spec))
    for alias, section in _components(spec):
        problems.extend(_env_problems(f"spec.{alias}.env", section.env))
        problems.extend(_resource_problems(f"spec.{alias}.resources", section.resources))
    return problems


_UNION_TAGS = frozenset({"int", "str", "bool", "float", "list", "dict"})


def _location(loc: tuple[int | str, ...]) -> str:
    """A pydantic error location as a field path, without its union-branch tags."""
    path = ""
    for part in loc:
        tag = isinstance(part, str) and (part in _UNION_TAGS or part.startswith("constrained-"))
        if tag or (isinstance(part, str) and "[" in part):
            continue
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def parse_policy(obj: Mapping[str, Any]) -> tuple[ClusterPolicy | None, list[Problem]]:
    """Parse a ClusterPolicy object and check it; never raises on bad input.

    Returns the model (None when it does not parse) and the problems, each with its path.
    """
    try:
        policy = ClusterPolicy.model_validate(obj)
    except ValidationError as error:
        return None, validation_problems(error)
    return policy, validate_spec(policy.spec)


def validation_problems(error: ValidationError) -> list[Problem]:
    """A model's refusal (any of the CRD models) as problems, each with its field path."""
    return [
        Problem(_location(tuple(item["loc"])) or "<root>", item["msg"])
        for item in error.errors(include_url=False)
    ]
