"""Property tests: any spec the CRD schema accepts parses into the models and comes back
unchanged (model -> JSON-able dict -> model), and server-side defaulting agrees with the
model defaults."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings

import crd
from tests.unit.test_crd_strategies import SPEC_SCHEMA, specs

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def wire(spec: crd.ClusterPolicySpec) -> dict[str, Any]:
    return spec.model_dump(mode="json", by_alias=True, exclude_unset=True)


@SETTINGS
@given(specs)
def test_generated_specs_round_trip(document: dict[str, Any]) -> None:
    spec = crd.ClusterPolicySpec.model_validate(document)
    dumped = wire(spec)
    assert dumped == document
    assert json.loads(json.dumps(dumped)) == dumped
    assert crd.ClusterPolicySpec.model_validate(dumped) == spec
    assert crd.ClusterPolicySpec.model_validate_json(json.dumps(dumped)) == spec


@SETTINGS
@given(specs)
def test_schema_defaulting_matches_model_defaults(document: dict[str, Any]) -> None:
    spec = crd.ClusterPolicySpec.model_validate(document)
    defaulted = crd.ClusterPolicySpec.model_validate(crd.apply_defaults(SPEC_SCHEMA, document))
    assert defaulted == spec


@SETTINGS
@given(specs)
def test_validation_never_raises(document: dict[str, Any]) -> None:
    policy, problems = crd.parse_policy({"kind": "ClusterPolicy", "spec": document})
    assert policy is not None
    assert all(p.path.startswith("spec.") for p in problems)
