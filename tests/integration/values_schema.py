"""The chart's values.schema.json, generated: each key of values.yaml typed by its
default (a few keys by what they also take), `healthRemediation` (documented, not set,
in values.yaml) from the ClusterPolicy CRD our models generate, the umbrella block
`gpu-operator:` taking the same keys. Unknown top-level keys are refused (Helm names
them), nested objects stay open (labels, selectors, env, NFD's settings). Written by
``python -m tests.integration.helm_chart``; tests/integration/test_helm.py keeps it
equal to values.yaml."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

import crd

#: Keys (by name, at any depth) that take more than their default's type.
_BY_NAME: dict[str, dict[str, Any]] = {
    # An image tag written as a bare YAML number (`version: 1.2`) is a number.
    "version": {"type": ["string", "number"]},
    "tag": {"type": ["string", "number"]},
    # Kubernetes int-or-string: a count or a percentage.
    "maxUnavailable": {"type": ["integer", "string"]},
    # operator.upgradePreflight: the operator's --upgrade-preflight choices.
    "upgradePreflight": {"enum": ["hold", "proceed", "off"]},
    # monitoring.operatorDown.prometheusRule: auto, true or false.
    "prometheusRule": {"anyOf": [{"type": "boolean"}, {"enum": ["auto", "true", "false"]}]},
}

#: Top-level keys values.yaml does not set but the chart reads or tolerates.
_EXTRA_TOP_LEVEL: dict[str, dict[str, Any]] = {
    # Helm's values shared with subcharts; an umbrella chart passes it down.
    "global": {"type": "object"},
}

_UMBRELLA = "gpu-operator"


def _typed(value: Any, key: str) -> dict[str, Any]:
    if key in _BY_NAME:
        return dict(_BY_NAME[key])
    if isinstance(value, bool):
        return {"type": "boolean"}
    if isinstance(value, int):
        return {"type": "integer"}
    if isinstance(value, float):
        return {"type": "number"}
    if isinstance(value, str):
        return {"type": "string"}
    if isinstance(value, list):
        return {"type": "array"}
    if isinstance(value, dict):
        node: dict[str, Any] = {"type": "object"}
        if value:
            node["properties"] = {k: _typed(v, k) for k, v in value.items()}
        return node
    return {}  # null: anything


def _strip_kubernetes(node: Any) -> Any:
    """An OpenAPI schema of our CRD as plain JSON Schema (no x-kubernetes-* keys)."""
    if isinstance(node, dict):
        return {k: _strip_kubernetes(v) for k, v in node.items() if not k.startswith("x-")}
    if isinstance(node, list):
        return [_strip_kubernetes(v) for v in node]
    return node


def _health_remediation() -> dict[str, Any]:
    version = crd.crd_manifest()["spec"]["versions"][0]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    schema: dict[str, Any] = _strip_kubernetes(spec["healthRemediation"])
    schema["additionalProperties"] = False
    return schema


def values_schema(values_file: Path) -> dict[str, Any]:
    values = yaml.safe_load(values_file.read_text())
    properties = {key: _typed(value, key) for key, value in values.items()}
    properties["healthRemediation"] = _health_remediation()
    properties.update(_EXTRA_TOP_LEVEL)
    umbrella = {
        "description": "Every key nested under gpu-operator: (the umbrella-chart form); "
        "it overrides the top-level keys.",
        "type": "object",
        "properties": {key: {"$ref": f"#/properties/{key}"} for key in properties},
        "additionalProperties": False,
    }
    properties[_UMBRELLA] = umbrella
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "Values of the gpuop chart",
        "description": "Generated from values.yaml by `python -m tests.integration.helm_chart`;"
        " do not edit.",
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
    }


def render_values_schema(values_file: Path) -> str:
    """What the chart's values.schema.json must hold."""
    return json.dumps(values_schema(values_file), indent=2) + "\n"
