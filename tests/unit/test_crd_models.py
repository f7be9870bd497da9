"""ClusterPolicy models: upstream YAML parses and survives model -> dict -> model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

import crd

DATA = Path(__file__).resolve().parent.parent / "data"
FIXTURES = ["clusterpolicy_seed004.yaml", "clusterpolicy_full.yaml"]


def load(name: str) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((DATA / name).read_text())
    return document


def wire(policy: crd.ClusterPolicy) -> dict[str, Any]:
    return policy.model_dump(mode="json", by_alias=True, exclude_unset=True)


@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_round_trips_unchanged(name: str) -> None:
    document = load(name)
    policy = crd.ClusterPolicy.model_validate(document)
    assert wire(policy) == document
    assert crd.ClusterPolicy.model_validate(wire(policy)) == policy


@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_has_no_semantic_problems(name: str) -> None:
    policy, problems = crd.parse_policy(load(name))
    assert policy is not None
    assert problems == []


def test_full_fixture_sets_every_spec_section() -> None:
    spec = load("clusterpolicy_full.yaml")["spec"]
    aliases = {info.alias or name for name, info in crd.ClusterPolicySpec.model_fields.items()}
    assert set(spec) == aliases


def test_seed_values_resolve_to_private_registry_images() -> None:
    spec = crd.ClusterPolicy.model_validate(load("clusterpolicy_seed004.yaml")).spec
    registry = "dockerhub.kubekey.local/kse/nvidia"
    assert crd.component_image(spec, "driver") == f"{registry}/driver:550-5.15.0-131-generic"
    assert crd.component_image(spec, "toolkit") == f"{registry}/k8s/container-toolkit:v1.20.0"
    assert (
        crd.component_image(spec, "driver.manager")
        == f"{registry}/cloud-native/k8s-driver-manager:v0.12.0"
    )
    assert crd.component_image(spec, "dcgm") == f"{registry}/cloud-native/dcgm:4.6.0-1-ubuntu24.04"


def test_snake_case_names_are_accepted_too() -> None:
    spec = crd.ClusterPolicySpec.model_validate(
        {"device_plugin": {"config": {"name": "cfg", "default": "a"}}}
    )
    assert spec.device_plugin.config is not None
    assert spec.device_plugin.config.name == "cfg"
    assert spec.model_dump(by_alias=True, exclude_unset=True) == {
        "devicePlugin": {"config": {"name": "cfg", "default": "a"}}
    }


def test_upstream_spellings_that_are_not_camel_case() -> None:
    spec = crd.ClusterPolicySpec.model_validate(
        {
            "operator": {"use_ocp_driver_toolkit": True},
            "hostPaths": {"rootFS": "/host"},
            "driver": {"useNvidiaDriverCRD": True},
            "validator": {"vfioPCI": {"env": []}},
        }
    )
    assert spec.operator.use_ocp_driver_toolkit
    assert spec.host_paths.root_fs == "/host"
    assert spec.driver.use_nvidia_driver_crd
    assert spec.validator.vfio_pci is not None


def test_defaults_match_upstream() -> None:
    spec = crd.ClusterPolicySpec()
    policy = spec.driver.upgrade_policy
    assert policy.auto_upgrade is False  # upstream's CRD default; its chart sets true
    assert policy.max_parallel_upgrades == 1
    assert policy.max_unavailable == "25%"
    assert policy.pod_deletion.timeout_seconds == 300
    assert policy.drain.timeout_seconds == 300
    assert policy.drain.enable is False
    assert policy.wait_for_completion.timeout_seconds == 0
    assert spec.mig.strategy == "single"
    assert spec.daemonsets.priority_class_name == "system-node-critical"
    assert spec.daemonsets.update_strategy == "RollingUpdate"
    assert spec.daemonsets.rolling_update.max_unavailable == "1"
    assert [t.key for t in spec.daemonsets.tolerations] == ["nvidia.com/gpu"]
    enabled = {
        alias: section.enabled
        for alias, section in (
            ("driver", spec.driver),
            ("toolkit", spec.toolkit),
            ("devicePlugin", spec.device_plugin),
            ("dcgm", spec.dcgm),
            ("dcgmExporter", spec.dcgm_exporter),
            ("gfd", spec.gfd),
            ("migManager", spec.mig_manager),
            ("nodeStatusExporter", spec.node_status_exporter),
            ("gds", spec.gds),
            ("gdrcopy", spec.gdrcopy),
            ("vgpuManager", spec.vgpu_manager),
            ("kataManager", spec.kata_manager),
        )
    }
    assert enabled == {
        "driver": True,
        "toolkit": True,
        "devicePlugin": True,
        "dcgm": False,
        "dcgmExporter": True,
        "gfd": True,
        "migManager": True,
        "nodeStatusExporter": False,
        "gds": False,
        "gdrcopy": False,
        "vgpuManager": False,
        "kataManager": False,
    }


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"mig": {"strategy": "bogus"}}, "strategy"),
        ({"driver": {"upgradePolicy": {"maxParallelUpgrades": -1}}}, "maxParallelUpgrades"),
        ({"driver": {"upgradePolicy": {"maxUnavailable": "150%"}}}, "maxUnavailable"),
        ({"driver": {"upgradePolicy": {"maxUnavailable": "abc"}}}, "maxUnavailable"),
        ({"driver": {"upgradePolicy": {"maxUnavailable": -2}}}, "maxUnavailable"),
        ({"driver": {"enabled": "true"}}, "enabled"),
        ({"driver": {"enabled": True, "enabeld": False}}, "enabeld"),
        ({"drivers": {}}, "drivers"),
        ({"driver": {"env": [{"value": "x"}]}}, "name"),
        ({"sandboxWorkloads": {"mode": "vm"}}, "mode"),
        ({"dcgmExporter": {"serviceMonitor": {"scrapeTimeout": "10 seconds"}}}, "scrapeTimeout"),
        ({"kataManager": {"config": {"runtimeClasses": [{"name": "k"}]}}}, "artifacts"),
    ],
)
def test_invalid_specs_are_refused_naming_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as error:
        crd.ClusterPolicySpec.model_validate(spec)
    assert any(field in item["loc"] for item in error.value.errors())


def test_policy_without_a_spec_has_every_default() -> None:
    """Upstream's schema takes an object without spec, so ours does: all defaults."""
    policy, problems = crd.parse_policy({"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy"})
    assert problems == []
    assert policy is not None
    assert policy.spec == crd.ClusterPolicySpec()


def test_int_or_percent_keeps_its_type() -> None:
    for value in (0, 3, "0%", "100%", "25%"):
        parsed = crd.DriverUpgradePolicySpec.model_validate({"maxUnavailable": value})
        assert parsed.max_unavailable == value
        assert type(parsed.max_unavailable) is type(value)


@pytest.mark.parametrize(
    ("image", "default", "expected"),
    [
        (
            crd.ImageSpec(),
            crd.DefaultImage("nvcr.io/nvidia", "driver", "1"),
            "nvcr.io/nvidia/driver:1",
        ),
        (
            crd.ImageSpec(repository="reg.local/mirror/"),
            crd.DefaultImage("nvcr.io/nvidia", "driver", "1"),
            "reg.local/mirror/driver:1",
        ),
        (
            crd.ImageSpec(image="reg.local:5000/x/driver:550", version="ignored"),
            None,
            "reg.local:5000/x/driver:550",
        ),
        (
            crd.ImageSpec(image="reg.local:5000/x/driver", version="2"),
            None,
            "reg.local:5000/x/driver:2",
        ),
        (
            crd.ImageSpec(repository="r", image="i", version="sha256:" + "a" * 64),
            None,
            "r/i@sha256:" + "a" * 64,
        ),
        (crd.ImageSpec(image="r/i@sha256:abc"), None, "r/i@sha256:abc"),
        (None, crd.DefaultImage("a", "b", "c"), "a/b:c"),
    ],
)
def test_image_ref(
    image: crd.ImageSpec | None, default: crd.DefaultImage | None, expected: str
) -> None:
    assert crd.image_ref(image, default) == expected


def test_image_ref_names_the_missing_field() -> None:
    spec = crd.ClusterPolicySpec.model_validate({"vgpuManager": {"enabled": True, "image": "v"}})
    with pytest.raises(crd.ImageRefError) as error:
        crd.component_image(spec, "vgpuManager")
    assert error.value.path == "spec.vgpuManager.version"


def test_every_default_image_resolves() -> None:
    spec = crd.ClusterPolicySpec()
    for component, default in crd.DEFAULT_IMAGES.items():
        assert crd.component_image(spec, component) == default.ref
    assert crd.component_image(spec, "gfd") == "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"
    assert crd.component_image(spec, "driver") == "nvcr.io/nvidia/driver:595.91.07"


def test_component_image_rejects_unknown_sections() -> None:
    with pytest.raises(KeyError):
        crd.component_image(crd.ClusterPolicySpec(), "nosuch")
    with pytest.raises(KeyError):
        crd.component_image(crd.ClusterPolicySpec(), "mig")
