"""Hypothesis strategies for ClusterPolicy specs, derived from the generated CRD schema.

Generating from the schema (not the models) makes every round-trip test also a check that
the models accept whatever the API server would accept. Shared with the integration tests.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from crd import openapi_schema

_TEXT = st.text(
    alphabet=st.characters(min_codepoint=32, max_codepoint=126), min_size=0, max_size=12
)
_ASCII = st.characters(min_codepoint=32, max_codepoint=126)
_KEYS = st.from_regex(r"[a-z][a-z0-9.-]{0,8}[a-z0-9](/[a-z][a-z0-9]{0,6})?", fullmatch=True)
_JSON_SCALARS = st.one_of(st.booleans(), st.integers(-1000, 1000), _TEXT)
_JSON_OBJECTS = st.dictionaries(
    _KEYS,
    st.one_of(_JSON_SCALARS, st.lists(_JSON_SCALARS, max_size=2)),
    max_size=3,
)


def _string(schema: dict[str, Any]) -> st.SearchStrategy[str]:
    pattern = schema.get("pattern")
    if pattern:
        full = pattern.endswith("$")
        return st.from_regex(pattern, fullmatch=full, alphabet=_ASCII).filter(
            lambda value: len(value) <= schema.get("maxLength", 10_000)
        )
    return st.text(
        alphabet=_ASCII,
        min_size=schema.get("minLength", 0),
        max_size=min(schema.get("maxLength", 12), 12),
    )


def from_schema(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values valid under a structural schema (it has no CEL rules to honour)."""
    if schema.get("x-kubernetes-int-or-string"):
        low = schema.get("minimum", -1000)
        return st.one_of(st.integers(low, 10_000), _string(schema))
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if kind == "boolean":
        return st.booleans()
    if kind == "integer":
        return st.integers(schema.get("minimum", -100_000), schema.get("maximum", 100_000))
    if kind == "string":
        return _string(schema)
    if kind == "array":
        return st.lists(from_schema(schema["items"]), max_size=2)
    if kind == "object":
        properties: dict[str, Any] = schema.get("properties", {})
        if properties:
            required = set(schema.get("required", ()))
            return st.fixed_dictionaries(
                {name: from_schema(properties[name]) for name in required},
                optional={
                    name: from_schema(prop)
                    for name, prop in properties.items()
                    if name not in required
                },
            )
        if isinstance(schema.get("additionalProperties"), dict):
            return st.dictionaries(_KEYS, from_schema(schema["additionalProperties"]), max_size=2)
        return _JSON_OBJECTS
    raise AssertionError(f"schema node without a type: {schema}")


SPEC_SCHEMA: dict[str, Any] = openapi_schema()["properties"]["spec"]

specs: st.SearchStrategy[dict[str, Any]] = from_schema(SPEC_SCHEMA)
"""ClusterPolicy specs (wire format) the API server accepts."""
