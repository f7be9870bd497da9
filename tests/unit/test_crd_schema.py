"""The generated CRD: checked-in copies are current, the schema is structural, and the
schema's defaults and constraints agree with the models."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

import crd

ROOT = Path(__file__).resolve().parents[2]
REGENERATE = (
    "out of date: regenerate with `gpuop crd > crd/nvidia.com_clusterpolicies.yaml` "
    "and copy it to deploy/crds/nvidia.com_clusterpolicies.yaml and "
    "deploy/helm/gpu-operator/crds/nvidia.com_clusterpolicies.yaml"
)
HELM_CHART_CRD_FILE = "deploy/helm/gpu-operator/crds/nvidia.com_clusterpolicies.yaml"
"""The copy Helm installs (crds/: created on install, never upgraded or deleted)."""


@pytest.mark.parametrize("path", [crd.CRD_FILE, crd.CHART_CRD_FILE, HELM_CHART_CRD_FILE])
def test_checked_in_crd_is_generated(path: str) -> None:
    assert (ROOT / path).read_text() == crd.render_crd_yaml(), f"{path} {REGENERATE}"


def test_checked_in_sample_policy_is_generated() -> None:
    assert (ROOT / crd.SAMPLE_POLICY_FILE).read_text() == crd.render_sample_policy_yaml(), (
        f"{crd.SAMPLE_POLICY_FILE} out of date: regenerate it from crd.render_sample_policy_yaml()"
    )


def test_rendering_is_deterministic() -> None:
    assert crd.render_crd_yaml() == crd.render_crd_yaml()
    assert yaml.safe_load(crd.render_crd_yaml()) == crd.crd_manifest()


def test_sample_policy_is_the_model_defaults_with_the_chart_choices() -> None:
    sample = yaml.safe_load(crd.render_sample_policy_yaml())
    policy = crd.ClusterPolicy.model_validate(sample)
    assert policy.name == crd.DEFAULT_POLICY_NAME
    assert crd.validate_spec(policy.spec) == []
    defaults = crd.default_policy().spec
    assert policy.spec != defaults
    assert policy.spec.driver.upgrade_policy.auto_upgrade
    assert not defaults.driver.upgrade_policy.auto_upgrade
    unchanged = set(crd.ClusterPolicySpec.model_fields) - {
        name
        for name, info in crd.ClusterPolicySpec.model_fields.items()
        if (info.alias or name) in crd.CHART_CHOICES
    }
    for name in unchanged:
        assert getattr(policy.spec, name) == getattr(defaults, name), name


def test_sample_policy_matches_upstream_chart_default_but_for_images() -> None:
    """deploy/clusterpolicy.yaml and upstream's chart-default policy mean the same, except
    that images are left to the operator's built-in defaults and ours spells out defaults."""
    upstream = yaml.safe_load((ROOT / "tests/conformance/upstream/default/policy.yaml").read_text())
    ours = crd.ClusterPolicy.model_validate(yaml.safe_load(crd.render_sample_policy_yaml())).spec
    theirs = crd.ClusterPolicy.model_validate(upstream).spec
    image_keys = {"repository", "image", "version", "imagePullPolicy"}  # IfNotPresent both
    mismatched = [
        path
        for path in _leaf_paths(theirs.model_dump(by_alias=True, exclude_unset=True))
        if path[-1] not in image_keys and not _same(_at(ours, path), _at(theirs, path))
    ]
    assert mismatched == KNOWN_SAMPLE_DIFFERENCES


def test_crd_identity() -> None:
    manifest = crd.crd_manifest()
    spec = manifest["spec"]
    assert manifest["metadata"]["name"] == "clusterpolicies.nvidia.com"
    assert spec["group"] == "nvidia.com"
    assert spec["scope"] == "Cluster"
    assert spec["names"]["kind"] == "ClusterPolicy"
    assert spec["names"]["singular"] == "clusterpolicy"
    assert spec["names"]["shortNames"] == ["cp"]
    (version,) = spec["versions"]
    assert version["name"] == "v1"
    assert version["storage"]
    assert version["served"]
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["State"] == ".status.state"
    assert columns["Age"] == ".metadata.creationTimestamp"


def walk(node: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = [(path, node)]
    for name, child in node.get("properties", {}).items():
        found.extend(walk(child, f"{path}.{name}"))
    if isinstance(node.get("items"), dict):
        found.extend(walk(node["items"], f"{path}[]"))
    if isinstance(node.get("additionalProperties"), dict):
        found.extend(walk(node["additionalProperties"], f"{path}{{}}"))
    return found


NODES = walk(crd.openapi_schema())


def test_schema_is_structural() -> None:
    forbidden_anywhere = {"$ref", "$defs", "title", "nullable", "allOf", "oneOf", "not"}
    for path, node in NODES:
        assert not forbidden_anywhere & set(node), path
        if node.get("x-kubernetes-int-or-string"):
            assert "type" not in node, path
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], path
            continue
        assert "anyOf" not in node, path
        assert node.get("type") in {"object", "array", "string", "integer", "boolean"}, path
        if "properties" in node:
            assert "additionalProperties" not in node, path
        if node["type"] == "array":
            assert isinstance(node["items"], dict), path


def test_every_spec_field_is_described_for_kubectl_explain() -> None:
    for path, node in NODES:
        if path.startswith(".spec") and not path.endswith(("[]", "{}")):
            assert node.get("description"), path


def test_unknown_fields_are_preserved_only_where_documented() -> None:
    documented = (".env[].valueFrom",)
    preserved = [p for p, node in NODES if node.get("x-kubernetes-preserve-unknown-fields")]
    for path in preserved:
        assert path.endswith(documented), path
    for suffix in documented:
        assert any(path.endswith(suffix) for path in preserved), suffix
    assert ".spec.driver.env[].valueFrom" in preserved


def node_at(path: str) -> dict[str, Any]:
    return dict(NODES)[path]


def test_upgrade_policy_constraints() -> None:
    base = ".spec.driver.upgradePolicy"
    parallel = node_at(f"{base}.maxParallelUpgrades")
    assert (parallel["type"], parallel["minimum"], parallel["default"]) == ("integer", 0, 1)
    unavailable = node_at(f"{base}.maxUnavailable")
    assert unavailable["x-kubernetes-int-or-string"] is True
    assert unavailable["default"] == "25%"
    pattern = re.compile(unavailable["pattern"])
    assert all(pattern.match(v) for v in ("0%", "5%", "25%", "100%"))
    assert not any(pattern.match(v) for v in ("150%", "101%", "abc", "5", "-1%", "05%"))
    assert node_at(f"{base}.podDeletion.timeoutSeconds")["default"] == 300
    assert node_at(f"{base}.drain.timeoutSeconds")["default"] == 300
    assert node_at(".spec.mig.strategy")["enum"] == ["none", "single", "mixed"]


def test_no_cel_rules_in_the_spec() -> None:
    """Upstream's CRD has none, and every cross-field combination we used to refuse
    (open modules vs proprietary, config.default without name, cdi.default without
    enabled) is one upstream accepts and ignores; refusing it would break migrations."""
    rules = [
        (path, rule) for path, node in NODES for rule in node.get("x-kubernetes-validations", [])
    ]
    assert [path for path, _ in rules if path.startswith(".spec")] == []


def test_schema_defaults_equal_model_defaults() -> None:
    spec_schema = crd.openapi_schema()["properties"]["spec"]
    defaulted = crd.apply_defaults(spec_schema, {})
    assert defaulted == crd.ClusterPolicySpec().model_dump(
        mode="json", by_alias=True, exclude_none=True
    )
    assert crd.ClusterPolicySpec.model_validate(defaulted) == crd.ClusterPolicySpec()


def test_apply_defaults_fills_nested_sections_without_touching_set_values() -> None:
    spec_schema = crd.openapi_schema()["properties"]["spec"]
    given = {"driver": {"upgradePolicy": {"maxUnavailable": 2}}, "daemonsets": {"tolerations": []}}
    defaulted = crd.apply_defaults(spec_schema, given)
    assert given == {
        "driver": {"upgradePolicy": {"maxUnavailable": 2}},
        "daemonsets": {"tolerations": []},
    }
    assert defaulted["driver"]["upgradePolicy"]["maxUnavailable"] == 2
    assert defaulted["driver"]["upgradePolicy"]["maxParallelUpgrades"] == 1
    assert defaulted["driver"]["upgradePolicy"]["drain"]["timeoutSeconds"] == 300
    assert defaulted["daemonsets"]["tolerations"] == []
    assert defaulted["mig"] == {"strategy": "single"}


KNOWN_SAMPLE_DIFFERENCES: list[tuple[str, ...]] = [
    # Upstream's chart labels operand pods with its own chart name; ours does not.
    ("daemonsets", "labels", "helm.sh/chart"),
    ("daemonsets", "labels", "app.kubernetes.io/managed-by"),
    # Upstream writes nlsEnabled: true beside empty licensing names; it only matters once
    # a licensing ConfigMap or Secret is named, and ours leaves the section out.
    ("driver", "licensingConfig", "nlsEnabled"),
    # Upstream writes these sections with their default layout; ours leaves them out,
    # and an absent section means the same default.
    ("migManager", "config", "default"),
    ("vgpuDeviceManager", "config", "default"),
]


def _leaf_paths(value: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    if isinstance(value, dict) and value:
        return [p for key, item in value.items() for p in _leaf_paths(item, (*path, key))]
    return [path]


def _same(a: Any, b: Any) -> bool:
    """Equal, or both empty (absent, false, "" and [] all mean unset upstream)."""
    return a == b or (not a and not b)


def _at(model: Any, path: tuple[str, ...]) -> Any:
    value = model.model_dump(mode="json", by_alias=True)
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value
