"""The ClusterPolicy CustomResourceDefinition, generated from the pydantic models.

The models are the single source: pydantic's JSON schema is rewritten into a *structural*
OpenAPI v3 schema (every node typed, references inlined, no ``nullable`` branches), and
the defaults of sections built by ``default_factory`` are added as ``default: {}`` so the
API server fills nested defaults exactly as the models do.

Unknown fields, per section:

* Rejected (pruned by the API server; ``kubectl apply`` with its default strict field
  validation refuses them): the spec itself and every typed section. A misspelt section or
  field must not silently fall back to a default, and every field upstream's ClusterPolicy
  defines is modelled, so migrating policies apply unchanged.
* Preserved (``x-kubernetes-preserve-unknown-fields``): ``env[].valueFrom`` (core/v1
  EnvVarSource, passed through as is; upstream has no such field, so this only widens),
  plus ``metadata``. Relabel rules and the Kata manager config are typed, as upstream's are.
"""

from __future__ import annotations

import copy
import types
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel

from crd._policy import (
    CRD_NAME,
    GROUP,
    KIND,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
    ClusterPolicySpec,
)
from crd._status import ClusterPolicyStatus

Schema = dict[str, Any]

_PRESERVE = "x-kubernetes-preserve-unknown-fields"


def _resolve(node: Schema, defs: dict[str, Schema]) -> Schema:
    """Inline a ``$ref``; the referring node's own keys (description, default) win."""
    if "$ref" not in node:
        return node
    target = defs[node["$ref"].rsplit("/", 1)[-1]]
    rest = {key: value for key, value in node.items() if key != "$ref"}
    return {**_resolve(target, defs), **rest}


def _structural(node: Schema, defs: dict[str, Schema]) -> Schema:
    """Rewrite one pydantic schema node (and its children) into structural form."""
    node = _resolve(node, defs)
    branches = node.get("anyOf")
    if branches is not None and {"type": "null"} in branches:
        others = [branch for branch in branches if branch != {"type": "null"}]
        rest = {key: value for key, value in node.items() if key != "anyOf"}
        if len(others) == 1:
            node = {**_resolve(others[0], defs), **rest}
        else:
            node = {**rest, "anyOf": others}
    result: Schema = {}
    for key, value in node.items():
        if key in ("title", "$defs") or (key == "default" and value is None):
            continue
        if key == "properties":
            result[key] = {name: _structural(child, defs) for name, child in value.items()}
        elif key == "items":
            result[key] = _structural(value, defs)
        elif key == "additionalProperties":
            if value is True:
                result[_PRESERVE] = True
            elif isinstance(value, dict):
                result[key] = _structural(value, defs)
        elif key == "const":
            result["enum"] = [value]
        else:
            result[key] = value
    if "properties" in result:
        result.setdefault("type", "object")
    return result


def _models_in(annotation: Any) -> list[tuple[str, type[BaseModel]]]:
    """Models reachable from an annotation, each with where it sits: '', 'items', 'values'."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _models_in(get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return [found for arg in get_args(annotation) for found in _models_in(arg)]
    if origin is list:
        return [("items", model) for _, model in _models_in(get_args(annotation)[0])]
    if origin is dict:
        return [("values", model) for _, model in _models_in(get_args(annotation)[1])]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [("", annotation)]
    return []


def _add_factory_defaults(model: type[BaseModel], node: Schema) -> None:
    """Add schema defaults for fields whose model default comes from a factory."""
    for name, info in model.model_fields.items():
        prop = node["properties"][info.alias or name]
        if info.default_factory is not None:
            value = info.default_factory()  # type: ignore[call-arg]
            if isinstance(value, BaseModel):
                prop["default"] = value.model_dump(mode="json", by_alias=True, exclude_unset=True)
            else:
                prop["default"] = _dump(value)
        for where, child in _models_in(info.annotation):
            target = prop
            if where == "items":
                target = prop["items"]
            elif where == "values":
                target = prop["additionalProperties"]
            _add_factory_defaults(child, target)


def _dump(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True, exclude_none=True)
    if isinstance(value, list):
        return [_dump(item) for item in value]
    if isinstance(value, dict):
        return {key: _dump(item) for key, item in value.items()}
    return value


_KEY_ORDER = (
    "description",
    "type",
    "format",
    "enum",
    "default",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
    "x-kubernetes-int-or-string",
    "anyOf",
    _PRESERVE,
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "items",
    "additionalProperties",
    "required",
    "properties",
    "x-kubernetes-validations",
)


def _ordered(node: Any) -> Any:
    """Schema keys in a fixed, readable order (description and type first)."""
    if isinstance(node, list):
        return [_ordered(item) for item in node]
    if not isinstance(node, dict):
        return node
    if "properties" in node and isinstance(node["properties"], dict):
        node = {**node, "properties": {k: _ordered(v) for k, v in node["properties"].items()}}
    rank = {key: index for index, key in enumerate(_KEY_ORDER)}
    keys = sorted(node, key=lambda key: (rank.get(key, len(rank)), key))
    return {
        key: node[key] if key in ("properties", "default", "enum") else _ordered(node[key])
        for key in keys
    }


def model_schema(model: type[BaseModel]) -> Schema:
    """The structural OpenAPI v3 schema of a model."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    schema = _structural(raw, raw.get("$defs", {}))
    _add_factory_defaults(model, schema)
    ordered: Schema = _ordered(schema)
    return ordered


def openapi_schema() -> Schema:
    """The ``openAPIV3Schema`` of the ClusterPolicy CRD."""
    return {
        "description": "ClusterPolicy configures the GPU software stack on every GPU node.",
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string", "description": "Always nvidia.com/v1."},
            "kind": {"type": "string", "description": "Always ClusterPolicy."},
            "metadata": {"type": "object"},
            "spec": {**model_schema(ClusterPolicySpec), "default": {}},
            "status": model_schema(ClusterPolicyStatus),
        },
    }


def crd_manifest() -> Schema:
    """The CustomResourceDefinition object (apiextensions.k8s.io/v1) as a plain dict."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
            },
            "scope": "Cluster",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {
                            "name": "State",
                            "type": "string",
                            "description": "ready, notReady or ignored",
                            "jsonPath": ".status.state",
                        },
                        {
                            "name": "Namespace",
                            "type": "string",
                            "description": "Namespace the operands run in",
                            "jsonPath": ".status.namespace",
                            "priority": 1,
                        },
                        {
                            "name": "Age",
                            "type": "date",
                            "jsonPath": ".metadata.creationTimestamp",
                        },
                    ],
                    "schema": {"openAPIV3Schema": openapi_schema()},
                }
            ],
        },
    }


def apply_defaults(schema: Schema, value: Any) -> Any:
    """Fill schema defaults into a copy of ``value`` the way the API server does.

    Missing properties with a default get a copy of it, then defaulting goes on inside it,
    so ``default: {}`` on a section brings in that section's own defaults.
    """
    value = copy.deepcopy(value)
    _default_into(schema, value)
    return value


def _default_into(schema: Schema, value: Any) -> None:
    if isinstance(value, dict):
        properties: dict[str, Schema] = schema.get("properties", {})
        for name, prop in properties.items():
            if name not in value and "default" in prop:
                value[name] = copy.deepcopy(prop["default"])
            if name in value:
                _default_into(prop, value[name])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key, item in value.items():
                if key not in properties:
                    _default_into(extra, item)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            _default_into(schema["items"], item)
