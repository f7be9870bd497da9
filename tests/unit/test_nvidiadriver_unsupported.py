"""NVIDIADriver fields accepted but not acted on are named, as the ClusterPolicy's are:
the UnsupportedFields condition (reason FieldsNotActedOn) in the resource's status."""

from __future__ import annotations

from typing import Any

import pytest

import crd
from gpuop.operator.controller.writers.nvidiadriver_status import desired_status, unsupported


def paths(spec: dict[str, Any]) -> list[str]:
    model = crd.NVIDIADriverSpec.model_validate(spec)
    return [f.path for f in crd.nvidiadriver_unsupported_fields(model)]


ASKS: dict[str, dict[str, Any]] = {
    "spec.manager.imagePullPolicy": {"manager": {"imagePullPolicy": "Sometimes"}},
}


@pytest.mark.parametrize(("path", "spec"), ASKS.items(), ids=list(ASKS))
def test_a_set_field_is_named_alone(path: str, spec: dict[str, Any]) -> None:
    assert paths(spec) == [path]


def test_every_field_acted_on_is_not_named() -> None:
    """Every other field reaches the driver DaemonSets (policy_for, render_pool) or the
    upgrade policy."""
    spec = {
        "driverType": "vgpu",
        "usePrecompiled": True,
        "kernelModuleType": "open",
        "startupProbe": {"initialDelaySeconds": 5},
        "livenessProbe": {"periodSeconds": 5},
        "readinessProbe": {"periodSeconds": 5},
        "rdma": {"enabled": True, "useHostMofed": True},
        "gds": {"enabled": True, "imagePullPolicy": "Always", "imagePullSecrets": ["g"]},
        "gdrcopy": {"enabled": True, "imagePullSecrets": ["r"]},
        "repository": "r",
        "image": "driver",
        "version": "595",
        "imagePullPolicy": "Always",
        "imagePullSecrets": ["regcred"],
        "manager": {
            "env": [{"name": "A", "value": "b"}],
            "imagePullPolicy": "Never",
            # In the driver pods' imagePullSecrets (components.driver.driver_pull_secrets),
            # as are GDS's and GDRCopy's.
            "imagePullSecrets": ["regcred"],
        },
        "resources": {"limits": {"cpu": "1"}},
        "args": ["--x"],
        "env": [{"name": "A", "value": "b"}],
        "repoConfig": {"name": "repos"},
        "certConfig": {"name": "certs"},
        "licensingConfig": {"secretName": "licence", "nlsEnabled": True},
        "virtualTopologyConfig": {"name": "topology"},
        "kernelModuleConfig": {"name": "modules"},
        "secretEnv": "driver-env",
        "upgradePolicy": {"autoUpgrade": True, "maxParallelUpgrades": 2},
        "nodeSelector": {"pool": "a"},
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}},
        "labels": {"a": "b"},
        "annotations": {"a": "b"},
        "tolerations": [{"key": "k", "operator": "Exists"}],
        "priorityClassName": "high",
        "podSecurityContext": {"fsGroup": 1},
        "hostNetwork": True,
    }
    assert paths(spec) == []
    assert paths({}) == []


@pytest.mark.parametrize("driver_type", ["gpu", "vgpu", "vgpu-host-manager"])
def test_every_driver_type_is_acted_on(driver_type: str) -> None:
    """`vgpu-host-manager` renders the vGPU manager's pod as upstream's NVIDIADriver
    template does (tests/unit/test_nvidiadriver_vgpu_host_manager.py), so it is not
    named."""
    assert paths({"driverType": driver_type}) == []


def raw(spec: dict[str, Any], generation: int = 3) -> dict[str, Any]:
    return {
        "apiVersion": crd.NVD_API_VERSION,
        "kind": crd.NVD_KIND,
        "metadata": {"name": "pool-a", "generation": generation},
        "spec": spec,
    }


def conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status.get("conditions") or []}


def test_the_status_reports_a_field_not_acted_on() -> None:
    resource = raw({"gds": {"imagePullPolicy": "Now"}, "manager": {"imagePullPolicy": "Often"}})
    status = desired_status(
        "ready",
        (True, "Reconciled", "ok"),
        (False, "Ready", ""),
        "ns",
        3,
        None,
        unsupported(resource),
    )
    condition = conditions(status)[crd.CONDITION_UNSUPPORTED_FIELDS]
    assert condition["status"] == "True"
    assert condition["reason"] == crd.REASON_FIELDS_NOT_ACTED_ON == "FieldsNotActedOn"
    assert condition["observedGeneration"] == 3
    assert "spec.gds.imagePullPolicy (" in condition["message"]
    assert "spec.manager.imagePullPolicy (" in condition["message"]
    assert {crd.CONDITION_READY, crd.CONDITION_ERROR} <= set(conditions(status))

    # Asserted again: the same condition, its transition time kept (nothing to write).
    again = desired_status(
        "ready",
        (True, "Reconciled", "ok"),
        (False, "Ready", ""),
        "ns",
        3,
        status,
        unsupported(resource),
    )
    assert again == status

    # Once the field is gone, so is the condition.
    cleared = desired_status(
        "ready",
        (True, "Reconciled", "ok"),
        (False, "Ready", ""),
        "ns",
        4,
        status,
        unsupported(raw({})),
    )
    assert crd.CONDITION_UNSUPPORTED_FIELDS not in conditions(cleared)


def test_an_unparsable_resource_names_nothing() -> None:
    assert unsupported(raw({"driverType": "bogus"})) == []
