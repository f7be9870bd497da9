"""The generated ClusterPolicy CRD against a real kube-apiserver.

Installs the CRD, then checks that upstream-format policies apply and come back through
the models unchanged, that every invalid case is refused with HTTP 422 naming the field,
and that generated specs survive model -> YAML -> API server -> model.
"""

from __future__ import annotations

import asyncio
import copy
import json
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

import crd
from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Rest
from tests.integration.harness import POLICY, Running, eventually
from tests.unit.test_crd_strategies import SPEC_SCHEMA, specs
from tests.unit.test_crd_upstream import UPSTREAM_SPECS

pytestmark = pytest.mark.integration

DATA = Path(__file__).resolve().parent.parent / "data"
ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ["clusterpolicy_seed004.yaml", "clusterpolicy_full.yaml"]


async def _install_crd(api: client.ApiClient) -> None:
    """Create or replace the CRD and wait until the API server serves it."""
    extensions = client.ApiextensionsV1Api(api)
    body: Any = crd.crd_manifest()  # the client takes plain dicts as bodies
    try:
        existing = await extensions.read_custom_resource_definition(crd.CRD_NAME)
    except ApiException as error:
        if error.status != 404:
            raise
        await extensions.create_custom_resource_definition(body)
    else:
        body["metadata"]["resourceVersion"] = existing.metadata.resource_version
        await extensions.replace_custom_resource_definition(crd.CRD_NAME, body)
    for _ in range(300):
        current = await extensions.read_custom_resource_definition(crd.CRD_NAME)
        conditions = {c.type: c.status for c in (current.status.conditions or [])}
        if conditions.get("Established") == "True":
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError(f"CRD not established: {conditions}")
    objects = client.CustomObjectsApi(api)
    for attempt in range(300):  # the handler comes up a moment after Established
        try:
            await objects.list_cluster_custom_object(crd.GROUP, crd.VERSION, crd.PLURAL)
            return
        except ApiException as error:
            if error.status not in (404, 429, 503) or attempt == 299:
                raise
            await asyncio.sleep(0.1)


@pytest.fixture(scope="module")
async def policies(api_client: client.ApiClient) -> client.CustomObjectsApi:
    await _install_crd(api_client)
    return client.CustomObjectsApi(api_client)


def _policy(spec: dict[str, Any] | None, name: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": crd.API_VERSION,
        "kind": crd.KIND,
        "metadata": {"name": name or f"t-{uuid.uuid4().hex[:10]}"},
    }
    if spec is not None:
        body["spec"] = spec
    return body


async def _create(objects: client.CustomObjectsApi, body: dict[str, Any]) -> dict[str, Any]:
    created: dict[str, Any] = await objects.create_cluster_custom_object(
        crd.GROUP, crd.VERSION, crd.PLURAL, body
    )
    return created


async def _delete(objects: client.CustomObjectsApi, name: str) -> None:
    try:
        await objects.delete_cluster_custom_object(crd.GROUP, crd.VERSION, crd.PLURAL, name)
    except ApiException as error:
        if error.status != 404:
            raise


async def _round_trip(objects: client.CustomObjectsApi, body: dict[str, Any]) -> dict[str, Any]:
    """Create, read back, delete; return what the API server stored."""
    name = body["metadata"]["name"]
    try:
        await _create(objects, body)
        stored: dict[str, Any] = await objects.get_cluster_custom_object(
            crd.GROUP, crd.VERSION, crd.PLURAL, name
        )
    finally:
        await _delete(objects, name)
    return stored


def _check_stored(sent_spec: dict[str, Any], stored: dict[str, Any]) -> None:
    """What came back is what was sent plus exactly the schema defaults, and the models agree."""
    assert stored["spec"] == crd.apply_defaults(SPEC_SCHEMA, sent_spec)
    policy = crd.ClusterPolicy.model_validate(stored)
    assert policy.spec == crd.ClusterPolicySpec.model_validate(sent_spec)
    again = policy.model_dump(mode="json", by_alias=True, exclude_unset=True)
    assert again["spec"] == stored["spec"]
    assert crd.ClusterPolicy.model_validate(again) == policy


CONFORMANCE = {
    path.parent.name: document
    for path in sorted((ROOT / "tests" / "conformance" / "upstream").glob("*/policy.yaml"))
    if (document := yaml.safe_load(path.read_text()))["kind"] == "ClusterPolicy"
}
"""The recorded ClusterPolicies (a GPUCluster scenario's is checked by test_gpucluster)."""


@pytest.mark.parametrize("scenario", sorted(CONFORMANCE))
async def test_upstream_chart_policies_apply_unchanged(
    policies: client.CustomObjectsApi, scenario: str
) -> None:
    """Upstream v26.7's chart-default policy (and the conformance variants of it) is
    accepted as is, and what the API server stores parses with no problem."""
    document = CONFORMANCE[scenario]
    assert document["spec"]
    stored = await _round_trip(policies, _policy(document["spec"]))
    _check_stored(document["spec"], stored)
    assert crd.parse_policy(stored)[1] == []


@pytest.mark.parametrize("fixture", FIXTURES)
async def test_fixture_policies_apply_and_round_trip(
    policies: client.CustomObjectsApi, fixture: str
) -> None:
    document = yaml.safe_load((DATA / fixture).read_text())
    body = _policy(document["spec"])
    stored = await _round_trip(policies, body)
    _check_stored(document["spec"], stored)


async def test_sample_policy_applies_unchanged(policies: client.CustomObjectsApi) -> None:
    sample = crd.sample_policy()
    body = _policy(sample["spec"])
    stored = await _round_trip(policies, body)
    assert stored["spec"] == sample["spec"]


async def test_empty_spec_gets_every_default(policies: client.CustomObjectsApi) -> None:
    stored = await _round_trip(policies, _policy({}))
    defaults = crd.ClusterPolicySpec().model_dump(mode="json", by_alias=True, exclude_none=True)
    assert stored["spec"] == defaults
    assert crd.ClusterPolicy.model_validate(stored).spec == crd.ClusterPolicySpec()


async def test_policy_without_spec_is_stored_with_every_default(
    policies: client.CustomObjectsApi,
) -> None:
    stored = await _round_trip(policies, _policy(None))
    defaults = crd.ClusterPolicySpec().model_dump(mode="json", by_alias=True, exclude_none=True)
    assert stored["spec"] == defaults


INVALID: list[tuple[str, dict[str, Any] | None, str]] = [
    ("mig-strategy-enum", {"mig": {"strategy": "bogus"}}, "spec.mig.strategy"),
    (
        "negative-parallel",
        {"driver": {"upgradePolicy": {"maxParallelUpgrades": -1}}},
        "spec.driver.upgradePolicy.maxParallelUpgrades",
    ),
    (
        "percent-over-100",
        {"driver": {"upgradePolicy": {"maxUnavailable": "150%"}}},
        "spec.driver.upgradePolicy.maxUnavailable",
    ),
    (
        "percent-not-a-number",
        {"driver": {"upgradePolicy": {"maxUnavailable": "abc"}}},
        "spec.driver.upgradePolicy.maxUnavailable",
    ),
    (
        "negative-unavailable",
        {"driver": {"upgradePolicy": {"maxUnavailable": -1}}},
        "spec.driver.upgradePolicy.maxUnavailable",
    ),
    ("bool-as-string", {"driver": {"enabled": "yes"}}, "spec.driver.enabled"),
    ("int-as-string", {"dcgm": {"hostPort": "5555"}}, "spec.dcgm.hostPort"),
    (
        "list-as-object",
        {"daemonsets": {"tolerations": {"key": "x"}}},
        "spec.daemonsets.tolerations",
    ),
    ("section-as-string", {"toolkit": "on"}, "spec.toolkit"),
    ("env-without-name", {"driver": {"env": [{"value": "1"}]}}, "spec.driver.env[0].name"),
    (
        "bad-quantity",
        {"driver": {"resources": {"limits": {"memory": "lots"}}}},
        "spec.driver.resources.limits.memory",
    ),
    # Refused by upstream's v26.7 CRD as well (same enums, patterns, required fields).
    ("sandbox-mode-enum", {"sandboxWorkloads": {"mode": "vm"}}, "spec.sandboxWorkloads.mode"),
    (
        "relabel-action-enum",
        {"dcgmExporter": {"serviceMonitor": {"relabelings": [{"action": "bogus"}]}}},
        "spec.dcgmExporter.serviceMonitor.relabelings[0].action",
    ),
    (
        "scrape-timeout-pattern",
        {"dcgmExporter": {"serviceMonitor": {"scrapeTimeout": "10 seconds"}}},
        "spec.dcgmExporter.serviceMonitor.scrapeTimeout",
    ),
    (
        "kata-runtime-class-needs-artifacts",
        {"kataManager": {"config": {"runtimeClasses": [{"name": "kata-qemu"}]}}},
        "spec.kataManager.config.runtimeClasses[0].artifacts",
    ),
]


@pytest.mark.parametrize(
    ("spec", "field"), [(spec, field) for _, spec, field in INVALID], ids=[i for i, _, _ in INVALID]
)
async def test_invalid_policy_is_refused_naming_the_field(
    policies: client.CustomObjectsApi, spec: dict[str, Any] | None, field: str
) -> None:
    body = _policy(spec)
    try:
        with pytest.raises(ApiException) as raised:
            await _create(policies, body)
    finally:
        await _delete(policies, body["metadata"]["name"])
    assert raised.value.status == 422, raised.value.body
    status = json.loads(raised.value.body or b"{}")
    fields = [cause.get("field") for cause in status.get("details", {}).get("causes", [])]
    assert field in fields or f"{field}:" in status["message"], status


async def test_status_subresource_round_trips(
    policies: client.CustomObjectsApi, api_client: client.ApiClient
) -> None:
    body = _policy({})
    name = body["metadata"]["name"]
    try:
        created = await _create(policies, body)
        status = crd.ready_status(
            "gpu-operator", generation=created["metadata"]["generation"], now=datetime.now(UTC)
        )
        created["status"] = status.model_dump(mode="json", by_alias=True, exclude_none=True)
        await policies.replace_cluster_custom_object_status(
            crd.GROUP, crd.VERSION, crd.PLURAL, name, created
        )
        stored = await policies.get_cluster_custom_object(crd.GROUP, crd.VERSION, crd.PLURAL, name)
        assert crd.ClusterPolicy.model_validate(stored).status == status
        table = await api_client.call_api(
            f"/apis/{crd.GROUP}/{crd.VERSION}/{crd.PLURAL}/{name}",
            "GET",
            header_params={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
            response_types_map={200: "object"},
            auth_settings=["BearerToken"],
            _return_http_data_only=True,
        )
        columns = [column["name"] for column in table["columnDefinitions"]]
        assert {"Name", "State", "Age"} <= set(columns)
        assert table["rows"][0]["cells"][columns.index("State")] == "ready"
    finally:
        await _delete(policies, name)


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(spec=specs)
async def test_generated_specs_survive_the_api_server(
    policies: client.CustomObjectsApi, spec: dict[str, Any]
) -> None:
    model = crd.ClusterPolicySpec.model_validate(spec)
    text = yaml.safe_dump(
        _policy(model.model_dump(mode="json", by_alias=True, exclude_unset=True)),
        sort_keys=False,
    )
    body = yaml.safe_load(text)
    stored = await _round_trip(policies, body)
    _check_stored(spec, stored)


async def test_fields_not_acted_on_get_a_warning_condition_and_event(
    rest: Rest, api_client: client.ApiClient
) -> None:
    """A policy setting fields gpuop ignores says so on its status and in one Warning
    Event per generation; dropping the fields drops the condition."""
    policy = copy.deepcopy(crd.sample_policy())
    spec = policy["spec"]
    spec["cdi"]["default"] = True
    spec.setdefault("gds", {})["hostNetwork"] = True
    spec["dcgmExporter"]["serviceMonitor"].pop("scrapeTimeout", None)

    async def unsupported() -> dict[str, Any] | None:
        status = ((await rest.get(POLICY, crd.DEFAULT_POLICY_NAME)) or {}).get("status") or {}
        found = [c for c in status.get("conditions", []) if c["type"] == "UnsupportedFields"]
        return found[0] if found else None

    async def warnings() -> list[dict[str, Any]]:
        return [
            e
            for e in await rest.list(by_kind("v1", "Event"), "default")
            if e["involvedObject"].get("name") == crd.DEFAULT_POLICY_NAME
            and e["reason"] == crd.REASON_FIELDS_NOT_ACTED_ON
        ]

    before = len(await warnings())
    applied = await rest.apply(policy)
    async with Running(api_client) as run:
        condition = await eventually(unsupported)
        assert condition["status"] == "True"
        assert condition["observedGeneration"] == applied["metadata"]["generation"]
        assert "spec.cdi.default" in condition["message"]
        assert "spec.gds.hostNetwork" in condition["message"]
        await run.settle()
        events = await warnings()
        assert len(events) == before + 1
        assert events[-1]["type"] == "Warning"
        assert "spec.gds.hostNetwork" in events[-1]["message"]

        spec["cdi"]["default"] = False
        spec["gds"]["hostNetwork"] = False
        await rest.apply(policy)

        async def cleared() -> bool:
            return await unsupported() is None

        assert await eventually(cleared)
        await run.settle()
        assert len(await warnings()) == before + 1
    await rest.apply(crd.sample_policy())


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(spec=UPSTREAM_SPECS)
async def test_specs_upstream_accepts_are_stored_here(
    policies: client.CustomObjectsApi, spec: dict[str, Any]
) -> None:
    """Specs generated from upstream v26.7's schema (minus the narrowings listed in
    tests/unit/test_crd_upstream.py) are accepted by the API server with our CRD."""
    stored = await _round_trip(policies, _policy(spec))
    _check_stored(spec, stored)
