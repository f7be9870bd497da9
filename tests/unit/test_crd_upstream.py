"""Our ClusterPolicy CRD accepts everything upstream v26.7's CRD accepts.

Walks upstream's openAPIV3Schema (tests/data/upstream, a copy of NVIDIA/gpu-operator's
deployments/gpu-operator/crds/nvidia.com_clusterpolicies.yaml at v26.7.0) and checks that
each of its property paths exists in ours with the same type, a superset of its enum and
its default. Every place where ours is stricter, or fills a default upstream's schema
does not, is listed below with the reason; an entry that no longer matches anything fails
too, so the lists stay honest.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings

import crd
from tests.unit.test_crd_schema import walk
from tests.unit.test_crd_strategies import from_schema

DATA = Path(__file__).resolve().parent.parent / "data"
ROOT = Path(__file__).resolve().parents[2]
UPSTREAM_CRD = yaml.safe_load((DATA / "upstream" / "nvidia.com_clusterpolicies.yaml").read_text())
UPSTREAM = dict(walk(UPSTREAM_CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]))
OURS = dict(walk(crd.openapi_schema()))
CONFORMANCE = sorted(
    p
    for p in (ROOT / "tests" / "conformance" / "upstream").glob("*/policy.yaml")
    if yaml.safe_load(p.read_text())["kind"] == "ClusterPolicy"
)
"""The recorded ClusterPolicies (a GPUCluster scenario is tested by test_gpucluster_crd)."""

STRICTER: dict[str, str] = {
    ".spec.daemonsets.tolerations[].operator": "a pod refuses any other operator",
    ".spec.daemonsets.tolerations[].effect": "a pod refuses any other effect",
    ".spec.dcgmExporter.service.type": (
        "ClusterIP/NodePort/LoadBalancer: a Service refuses unknown types, and ExternalName"
        " without externalName (which the spec has no field for)"
    ),
    ".spec.dcgmExporter.service.internalTrafficPolicy": "a Service refuses other values",
    ".spec.driver.*Probe.initialDelaySeconds": "a pod refuses a negative delay",
    ".spec.daemonsets.rollingUpdate.maxUnavailable": (
        "a whole number (int or string) or a percentage: any other string is refused by"
        " the DaemonSets upstream would create (ours also takes an integer, a widening)"
    ),
    ".spec.driver.upgradePolicy.maxUnavailable": (
        "non-negative, strings only as percentages: upstream fails the upgrade pass on"
        " anything else (intstr scaling refuses non-percent strings)"
    ),
    ".spec.**.env[].name": "minLength 1: a pod refuses an empty variable name",
}
"""Constraints (enum, pattern, bounds, required, CEL) ours adds, each with why upstream
would refuse or fail on the same value anyway (a pod, Service or DaemonSet it renders
is refused, or its reconcile fails)."""

ADDED_DEFAULTS: dict[str, str] = {
    ".spec.**.enabled": "what upstream's IsEnabled() returns for an unset switch",
    ".spec.dcgm.enabled": (
        "KNOWN GAP: false, while upstream's DCGMSpec.IsEnabled() treats unset as true; its"
        " chart always writes false, and ours keeps the chart's value"
    ),
    ".spec.**.imagePullPolicy": "upstream's ImagePullPolicy() uses IfNotPresent when unset",
    ".spec.daemonsets.priorityClassName": "the class upstream's operand manifests carry",
    ".spec.daemonsets.tolerations": "the nvidia.com/gpu toleration upstream's manifests carry",
    ".spec.daemonsets.rollingUpdate.maxUnavailable": "the DaemonSet default (1)",
    ".spec.dcgm.hostPort": "5555, the port upstream's DCGM manifests use",
    ".spec.dcgmExporter.serviceMonitor.honorLabels": "unset is false in the ServiceMonitor",
    ".spec.operator.metrics.serviceMonitor.honorLabels": "unset is false in the ServiceMonitor",
    ".spec.driver.useNvidiaDriverCRD": "upstream's UseNvidiaDriverCRDType(): unset is false",
    ".spec.driver.usePrecompiled": "upstream's UsePrecompiledDrivers(): unset is false",
    ".spec.driver.useOpenKernelModules": "deprecated and unread upstream; false is inert",
    ".spec.driver.rdma.useHostMofed": "upstream's IsHostMOFED(): unset is false",
    ".spec.driver.licensingConfig.nlsEnabled": "upstream's IsNLSEnabled(): unset is false",
    ".spec.hostPaths.rootFS": "upstream's default host root",
    ".spec.hostPaths.driverInstallDir": "upstream's default driver install directory",
    ".spec.mig.strategy": (
        "KNOWN GAP: single, the value upstream's chart always writes; unset upstream"
        " passes no MIG_STRATEGY, so its plugins fall back to none"
    ),
    ".spec.operator.defaultRuntime": "docker, upstream's historical default runtime",
    ".spec.operator.use_ocp_driver_toolkit": "unset is false upstream",
    ".spec.ccManager.defaultMode": "off: no CC mode is forced on nodes without the label",
}
"""Leaf defaults ours fills where upstream's schema has none. Objects defaulting to `{}`
need no entry: they only make nested defaults apply, which are checked themselves."""

OTHER_DEFAULTS: dict[str, str] = {
    ".spec.**.relabelings[].action": (
        "no schema default: relabel rules stay exactly as written, and the Prometheus"
        " Operator treats an omitted action as replace, so the outcome is the same"
    ),
}
"""Upstream defaults ours does not fill, with why that changes nothing."""

SCALAR_KEYS = ("pattern", "minimum", "maximum", "minLength", "maxLength")


def _regex(pattern: str) -> re.Pattern[str]:
    """`**` is any run of path, `*` one name part."""
    parts = [re.escape(p).replace(r"\*", "[^.]*") for p in pattern.split("**")]
    return re.compile(".*".join(parts) + "$")


def _listed(table: dict[str, str], path: str, used: set[str]) -> bool:
    hits = {pattern for pattern in table if _regex(pattern).match(path)}
    used |= hits
    return bool(hits)


def _kind(node: dict[str, Any]) -> str | None:
    return "int-or-string" if node.get("x-kubernetes-int-or-string") else node.get("type")


def _differences() -> tuple[list[str], set[str], set[str]]:
    problems: list[str] = []
    stricter: set[str] = set()
    defaults: set[str] = set()
    for path, theirs in UPSTREAM.items():
        ours = OURS.get(path)
        if ours is None:
            problems.append(f"{path}: missing")
            continue
        if _kind(ours) != _kind(theirs) and not (
            _kind(theirs) == "string" and _kind(ours) == "int-or-string"
        ):
            problems.append(f"{path}: type {_kind(ours)} != {_kind(theirs)}")
        if theirs.get("x-kubernetes-preserve-unknown-fields") and not ours.get(
            "x-kubernetes-preserve-unknown-fields"
        ):
            problems.append(f"{path}: upstream keeps unknown fields, ours prunes them")
        if "enum" in ours and "enum" in theirs and not set(theirs["enum"]) <= set(ours["enum"]):
            problems.append(f"{path}: enum {ours['enum']} refuses part of {theirs['enum']}")
        elif "enum" in ours and "enum" not in theirs and not _listed(STRICTER, path, stricter):
            problems.append(f"{path}: enum {ours['enum']} where upstream takes any value")
        added = [k for k in SCALAR_KEYS if k in ours and ours[k] != theirs.get(k)]
        added += [r for r in ours.get("required", []) if r not in theirs.get("required", [])]
        added += ["CEL"] * bool(ours.get("x-kubernetes-validations"))
        if added and not _listed(STRICTER, path, stricter):
            problems.append(f"{path}: stricter than upstream ({', '.join(added)})")
        if "default" in theirs:
            if ours.get("default") != theirs["default"] and not _listed(
                OTHER_DEFAULTS, path, defaults
            ):
                problems.append(f"{path}: default {ours.get('default')!r} != {theirs['default']!r}")
        elif (
            "default" in ours
            and ours["default"] != {}
            and not _listed(ADDED_DEFAULTS, path, defaults)
        ):
            problems.append(f"{path}: default {ours['default']!r} where upstream has none")
    return problems, stricter, defaults


def test_every_upstream_field_is_accepted_alike() -> None:
    problems, _, _ = _differences()
    assert problems == []


def test_every_listed_difference_is_still_needed() -> None:
    _, stricter, defaults = _differences()
    assert set(STRICTER) - stricter == set()
    assert set(ADDED_DEFAULTS) - defaults == set()
    assert set(OTHER_DEFAULTS) - defaults == set()


def test_upstream_copy_is_the_v26_7_crd() -> None:
    """The stored copy is upstream's CRD, not something edited to make the test pass."""
    assert UPSTREAM_CRD["metadata"]["name"] == crd.CRD_NAME
    spec = UPSTREAM[".spec"]
    assert "kataSandboxDevicePlugin" in spec["properties"]
    assert UPSTREAM[".spec.sandboxWorkloads.mode"]["enum"] == ["kubevirt", "kata"]


def test_upstream_has_no_path_ours_only_keeps_unknown() -> None:
    """Ours keeps unknown fields only under env[].valueFrom, which upstream lacks."""
    preserved = [p for p, n in OURS.items() if n.get("x-kubernetes-preserve-unknown-fields")]
    assert not [p for p in preserved if p in UPSTREAM]


@pytest.mark.parametrize("path", CONFORMANCE, ids=[p.parent.name for p in CONFORMANCE])
def test_upstream_chart_policies_parse_without_problems(path: Path) -> None:
    document = yaml.safe_load(path.read_text())
    policy, problems = crd.parse_policy(document)
    assert policy is not None
    assert problems == []
    dumped = policy.model_dump(mode="json", by_alias=True, exclude_unset=True)
    assert dumped["spec"] == document["spec"]
    # ... and everything the chart's policies ask for is acted on (no Warning).
    assert [str(f) for f in crd.unsupported_fields(policy.spec)] == []


def _upstream_but_listed(node: dict[str, Any], path: str) -> dict[str, Any]:
    """Upstream's schema with each node ours deliberately narrows replaced by ours."""
    if path and path in OURS and any(_regex(p).match(path) for p in STRICTER):
        return OURS[path]
    result = dict(node)
    if "properties" in node:
        result["properties"] = {
            name: _upstream_but_listed(child, f"{path}.{name}")
            for name, child in node["properties"].items()
        }
    if isinstance(node.get("items"), dict):
        result["items"] = _upstream_but_listed(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        result["additionalProperties"] = _upstream_but_listed(
            node["additionalProperties"], f"{path}{{}}"
        )
    return result


UPSTREAM_SPECS = from_schema(_upstream_but_listed(UPSTREAM[".spec"], ".spec"))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(UPSTREAM_SPECS)
def test_specs_upstream_accepts_parse_here(document: dict[str, Any]) -> None:
    """Generated from upstream's schema (minus the listed narrowings): our models take
    every such spec and give it back as written."""
    spec = crd.ClusterPolicySpec.model_validate(document)
    assert spec.model_dump(mode="json", by_alias=True, exclude_unset=True) == document
