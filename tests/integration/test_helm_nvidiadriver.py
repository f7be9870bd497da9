"""The chart's `driver.nvidiaDriverCRD` values, rendered offline with the cached Helm
binary: the default NVIDIADriver it deploys, the ClusterPolicy switch, the CRD and RBAC."""

from __future__ import annotations

from typing import Any

import pytest

import crd
from tests.integration.helm_chart import by_kind, documents, one, template

pytestmark = pytest.mark.integration


def _render(*sets: str) -> list[dict[str, Any]]:
    args = [a for s in sets for a in ("--set", s)]
    return documents(template("--include-crds", *args))


def test_off_by_default_no_resource_and_the_crd_installed() -> None:
    docs = _render()
    assert by_kind(docs, "NVIDIADriver") == []
    policy = one(docs, "ClusterPolicy")
    assert policy["spec"]["driver"]["useNvidiaDriverCRD"] is False
    crds = {d["metadata"]["name"] for d in by_kind(docs, "CustomResourceDefinition")}
    assert crd.NVD_CRD_NAME in crds


def test_enabled_deploys_the_default_resource_from_the_driver_values() -> None:
    docs = _render(
        "driver.nvidiaDriverCRD.enabled=true",
        "driver.version=580.95.05",
        "driver.repository=registry.local/nvidia",
        "driver.upgradePolicy.maxParallelUpgrades=2",
        "driver.nvidiaDriverCRD.driverType=vgpu",
        "driver.licensingConfig.secretName=licence",
    )
    assert one(docs, "ClusterPolicy")["spec"]["driver"]["useNvidiaDriverCRD"] is True
    raw = one(docs, "NVIDIADriver", "default")
    model = crd.parse_nvidiadriver(raw)  # the chart writes only what the CRD accepts
    spec = model.spec
    assert spec.default is True
    assert spec.node_selector is None
    assert spec.driver_type == "vgpu"
    assert (spec.repository, spec.version) == ("registry.local/nvidia", "580.95.05")
    assert spec.upgrade_policy is not None
    assert spec.upgrade_policy.max_parallel_upgrades == 2
    assert spec.licensing_config is not None
    assert spec.licensing_config.secret_name == "licence"


def test_node_selector_makes_it_a_selecting_resource() -> None:
    docs = _render(
        "driver.nvidiaDriverCRD.enabled=true",
        "driver.nvidiaDriverCRD.nodeSelector.nvidia\\.com/gpu\\.product=NVIDIA-H100-80GB-HBM3",
    )
    spec = crd.parse_nvidiadriver(one(docs, "NVIDIADriver", "default")).spec
    assert spec.default is False
    assert spec.node_selector == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


@pytest.mark.parametrize(
    "sets",
    [
        ("driver.nvidiaDriverCRD.enabled=true", "driver.nvidiaDriverCRD.deployDefaultCR=false"),
        ("driver.nvidiaDriverCRD.enabled=true", "driver.enabled=false"),
    ],
)
def test_no_default_resource_when_not_wanted(sets: tuple[str, ...]) -> None:
    assert by_kind(_render(*sets), "NVIDIADriver") == []


def test_operator_may_read_nvidiadrivers_and_write_their_status() -> None:
    role = next(
        d
        for d in by_kind(_render(), "ClusterRole")
        if d["metadata"]["labels"].get("app.kubernetes.io/component") == "operator"
    )
    granted = {
        (resource, verb)
        for rule in role["rules"]
        if "nvidia.com" in rule.get("apiGroups", [])
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert {
        ("nvidiadrivers", "list"),
        ("nvidiadrivers", "watch"),
        ("nvidiadrivers/status", "patch"),
    } <= granted
