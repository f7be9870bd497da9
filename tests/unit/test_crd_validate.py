"""Semantic validation: problems the schema cannot express, each naming its field."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

import crd


def problems(spec: dict[str, Any]) -> list[str]:
    return [p.path for p in crd.validate_spec(crd.ClusterPolicySpec.model_validate(spec))]


def test_defaults_have_no_problems() -> None:
    assert crd.validate_spec(crd.ClusterPolicySpec()) == []


@pytest.mark.parametrize(
    ("spec", "path"),
    [
        (
            {"driver": {"upgradePolicy": {"autoUpgrade": True, "maxUnavailable": 0}}},
            "spec.driver.upgradePolicy.maxUnavailable",
        ),
        (
            {"driver": {"upgradePolicy": {"autoUpgrade": True, "maxUnavailable": "0%"}}},
            "spec.driver.upgradePolicy.maxUnavailable",
        ),
        (
            {"driver": {"upgradePolicy": {"drain": {"podSelector": "app in (a,b"}}}},
            "spec.driver.upgradePolicy.drain.podSelector",
        ),
        (
            {"driver": {"upgradePolicy": {"waitForCompletion": {"podSelector": "a b"}}}},
            "spec.driver.upgradePolicy.waitForCompletion.podSelector",
        ),
        ({"cdi": {"enabled": False, "nriPluginEnabled": True}}, "spec.cdi.nriPluginEnabled"),
        (
            {"toolkit": {"enabled": False}, "cdi": {"nriPluginEnabled": True}},
            "spec.cdi.nriPluginEnabled",
        ),
        (
            {"daemonsets": {"rollingUpdate": {"maxUnavailable": "0"}}},
            "spec.daemonsets.rollingUpdate.maxUnavailable",
        ),
        ({"daemonsets": {"labels": {"bad key!": "x"}}}, "spec.daemonsets.labels[bad key!]"),
        ({"daemonsets": {"labels": {"ok": "bad value!"}}}, "spec.daemonsets.labels[ok]"),
        ({"daemonsets": {"annotations": {"-no": "x"}}}, "spec.daemonsets.annotations[-no]"),
        (
            {"daemonsets": {"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]}},
            "spec.daemonsets.tolerations[0].value",
        ),
        (
            {"daemonsets": {"tolerations": [{"operator": "Equal", "value": "v"}]}},
            "spec.daemonsets.tolerations[0].operator",
        ),
        (
            {"daemonsets": {"tolerations": [{"key": "k", "tolerationSeconds": 5}]}},
            "spec.daemonsets.tolerations[0].tolerationSeconds",
        ),
        (
            {"toolkit": {"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}},
            "spec.toolkit.env[1].name",
        ),
        (
            {"toolkit": {"env": [{"name": "A", "value": "1", "valueFrom": {}}]}},
            "spec.toolkit.env[0]",
        ),
        (
            {"dcgm": {"resources": {"requests": {"memory": "2Gi"}, "limits": {"memory": "1Gi"}}}},
            "spec.dcgm.resources.requests.memory",
        ),
        ({"vgpuManager": {"enabled": True}}, "spec.vgpuManager.image"),
        ({"vgpuManager": {"enabled": True, "image": "vgpu"}}, "spec.vgpuManager.version"),
        ({"driver": {"image": "r/driver:1", "version": "2"}}, "spec.driver.version"),
        ({"driver": {"image": "r/driver:1", "repository": "x"}}, "spec.driver.repository"),
        ({"driver": {"image": "r/driver", "repository": "x"}}, "spec.driver.repository"),
    ],
)
def test_problem_names_the_field(spec: dict[str, Any], path: str) -> None:
    assert path in problems(spec)


def test_disabled_vgpu_manager_needs_no_image() -> None:
    assert problems({"vgpuManager": {"enabled": False}}) == []


def test_auto_upgrade_off_allows_zero_unavailable() -> None:
    spec = {"driver": {"upgradePolicy": {"autoUpgrade": False, "maxUnavailable": 0}}}
    assert problems(spec) == []


@pytest.mark.parametrize(
    "selector",
    [
        "",
        "app=web",
        "app==web",
        "app!=web",
        "app",
        "!app",
        "app in (a, b),tier notin (x)",
        "example.com/role=gpu,env in (dev)",
        "size>3",
        "app=",
    ],
)
def test_valid_selectors(selector: str) -> None:
    assert crd.label_selector_problem(selector) is None


@pytest.mark.parametrize(
    "selector",
    ["a b", "app in (a,b", ",", "app=web,", "Bad_/x=1", "x=" + "v" * 64, "size>x"],
)
def test_invalid_selectors(selector: str) -> None:
    assert crd.label_selector_problem(selector) is not None


@pytest.mark.parametrize(
    ("quantity", "value"),
    [
        (2, Decimal(2)),
        ("500m", Decimal("0.5")),
        ("1Gi", Decimal(2**30)),
        ("1.5G", Decimal("1.5e9")),
        ("1e3", Decimal(1000)),
        ("nope", None),
    ],
)
def test_parse_quantity(quantity: int | str, value: Decimal | None) -> None:
    assert crd.parse_quantity(quantity) == value


def test_parse_policy_reports_schema_errors_with_paths() -> None:
    policy, found = crd.parse_policy(
        {
            "apiVersion": "nvidia.com/v1",
            "kind": "ClusterPolicy",
            "spec": {
                "mig": {"strategy": "bogus"},
                "driver": {"upgradePolicy": {"maxUnavailable": "150%"}},
            },
        }
    )
    assert policy is None
    paths = {p.path for p in found}
    assert paths == {"spec.mig.strategy", "spec.driver.upgradePolicy.maxUnavailable"}
    assert all(str(p).startswith(p.path + ": ") for p in found)


def test_parse_policy_reports_semantic_problems() -> None:
    policy, found = crd.parse_policy(
        {"kind": "ClusterPolicy", "spec": {"cdi": {"enabled": False, "nriPluginEnabled": True}}}
    )
    assert policy is not None
    assert [p.path for p in found] == ["spec.cdi.nriPluginEnabled"]


def test_relabel_rules_are_checked_but_kept_as_written() -> None:
    rules = [{"action": "bogus"}, {"sourceLabels": "x"}]
    _, found = crd.parse_policy(
        {
            "kind": "ClusterPolicy",
            "spec": {"dcgmExporter": {"serviceMonitor": {"relabelings": rules}}},
        }
    )
    monitor = "spec.dcgmExporter.serviceMonitor.relabelings"
    assert [p.path for p in found] == [f"{monitor}[0].action", f"{monitor}[1].sourceLabels"]
    good = [{"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "instance"}]
    policy, found = crd.parse_policy(
        {
            "kind": "ClusterPolicy",
            "spec": {"dcgmExporter": {"serviceMonitor": {"relabelings": good}}},
        }
    )
    assert found == []
    assert policy is not None
    assert policy.spec.dcgm_exporter.service_monitor is not None
    assert policy.spec.dcgm_exporter.service_monitor.relabelings == good


@pytest.mark.parametrize(
    "spec",
    [
        {"driver": {"enabled": False}, "gds": {"enabled": True}},
        {"driver": {"enabled": False}, "gdrcopy": {"enabled": True}},
        {"driver": {"enabled": False, "rdma": {"enabled": True}}},
    ],
)
def test_driver_sidecars_without_a_driver_are_not_refused(spec: dict[str, Any]) -> None:
    """Upstream accepts these and does nothing; refusing would stop the whole rollout."""
    assert problems(spec) == []
