"""Fields accepted but not acted on: which a spec sets, and the condition naming them.

These are curated cases; tests/unit/test_crd_sweep.py sets every leaf field of
upstream's three CRDs and holds each to acting, being named here, or being listed."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

import crd
from crd._unsupported import _FIELDS

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
LATER = datetime(2026, 1, 2, 4, 0, 0, tzinfo=UTC)


def paths(spec: dict[str, Any]) -> list[str]:
    return [f.path for f in crd.unsupported_fields(crd.ClusterPolicySpec.model_validate(spec))]


ASKS: dict[str, dict[str, Any]] = {
    "spec.kataManager.enabled": {"kataManager": {"enabled": True}},
    "spec.psp.enabled": {"psp": {"enabled": True}},
    "spec.cdi.default": {"cdi": {"default": True}},
    "spec.operator.use_ocp_driver_toolkit": {"operator": {"use_ocp_driver_toolkit": True}},
    "spec.kataManager.hostNetwork": {"kataManager": {"hostNetwork": True}},
    "spec.gds.hostNetwork": {"gds": {"hostNetwork": True}},
    "spec.driver.manager.imagePullPolicy": {
        "driver": {"manager": {"imagePullPolicy": "Sometimes"}}
    },
    "spec.operator.defaultRuntime": {"operator": {"defaultRuntime": "podman"}},
}


@pytest.mark.parametrize(("path", "spec"), ASKS.items(), ids=list(ASKS))
def test_a_set_field_is_named_alone(path: str, spec: dict[str, Any]) -> None:
    assert paths(spec) == [path]


ACTED_ON: dict[str, dict[str, Any]] = {
    # The driver's site configuration (components.driver_config) is rendered now.
    "repoConfig": {"driver": {"repoConfig": {"configMapName": "r"}}},
    "certConfig": {"driver": {"certConfig": {"name": "c"}}},
    "licensingConfig": {"driver": {"licensingConfig": {"secretName": "s"}}},
    "virtualTopology": {"driver": {"virtualTopology": {"config": "t"}}},
    "kernelModuleConfig": {"driver": {"kernelModuleConfig": {"name": "k"}}},
    "secretEnv": {"driver": {"secretEnv": "driver-env"}},
    # The operator's namespace gets the Pod Security labels
    # (gpuop.operator.controller.writers.pod_security).
    "psa": {"psa": {"enabled": True}},
    # Pod-wide settings of every operand DaemonSet (components._k8s.daemonset).
    "podSecurityContext": {"daemonsets": {"podSecurityContext": {"fsGroup": 1}}},
    "hostNetwork": {
        section: {"hostNetwork": True}
        for section in (
            "driver",
            "toolkit",
            "devicePlugin",
            "dcgm",
            "dcgmExporter",
            "gfd",
            "migManager",
            "nodeStatusExporter",
            "validator",
            "vgpuManager",
            "vgpuDeviceManager",
            "vfioManager",
            "sandboxDevicePlugin",
            "kataSandboxDevicePlugin",
            "ccManager",
        )
    },
    # GPUs for virtual machines (components.labels.node_workload and the sandbox
    # operands: vgpu_manager, vfio_manager, sandbox_device_plugin, ...).
    "sandboxWorkloads": {
        "sandboxWorkloads": {"enabled": True, "defaultWorkload": "vm-vgpu", "mode": "kata"},
        "vgpuManager": {"enabled": True, "kernelModuleConfig": {"name": "k"}},
        "vgpuDeviceManager": {"enabled": True, "config": {"name": "v", "default": "A10-4Q"}},
        "vfioManager": {"enabled": True},
        "kataSandboxDevicePlugin": {"enabled": True},
        "ccManager": {"enabled": True, "defaultMode": "on"},
    },
    # The kubelet's directories follow it (components._host_paths.kubelet_path).
    "kubeletRootDir": {"hostPaths": {"kubeletRootDir": "/data/kubelet"}},
    # The exporter's pod attribution, job mapping and pod settings (dcgm_exporter).
    "dcgmExporter": {
        "dcgmExporter": {
            "hostPID": True,
            "annotations": {"a": "b"},
            "enablePodLabels": True,
            "enablePodUID": True,
            "podLabelAllowlistRegex": ["^app$"],
            "hpcJobMapping": {"enabled": True},
        }
    },
    # The toolkit runs as the runtime's NRI plugin (components.toolkit, _k8s.gpu_access).
    "nriPluginEnabled": {"cdi": {"nriPluginEnabled": True}},
    # One driver DaemonSet per kernel, each node upgraded on its kernel's (the upgrade
    # machine follows components.driver.pool_for).
    "usePrecompiled": {"driver": {"usePrecompiled": True}},
    # Upstream's controller never reads these either: flagging them was a false alarm.
    "operatorLabels": {"operator": {"labels": {"team": "gpu"}, "annotations": {"a": "b"}}},
}


@pytest.mark.parametrize("spec", ACTED_ON.values(), ids=list(ACTED_ON))
def test_a_field_acted_on_is_not_flagged(spec: dict[str, Any]) -> None:
    assert paths(spec) == []


def test_every_listed_field_has_a_case() -> None:
    assert {f"spec.{path}" for path, _, _ in _FIELDS} <= set(ASKS)


def test_model_defaults_ask_for_nothing_unsupported() -> None:
    assert paths({}) == []


INERT: dict[str, dict[str, Any]] = {
    # Sandbox operands only run with sandboxWorkloads on, upstream too; upstream's own
    # chart switches them all on by default.
    "sandbox-operands-without-sandbox": {
        "vfioManager": {"enabled": True},
        "vgpuDeviceManager": {"enabled": True},
        "sandboxDevicePlugin": {"enabled": True},
        "kataSandboxDevicePlugin": {"enabled": True},
        "ccManager": {"enabled": True, "defaultMode": "on"},
        "vgpuManager": {"kernelModuleConfig": {"name": ""}},
    },
    # Implemented here (components/driver.py sidecars and peermem, the exporter's
    # ServiceMonitor): asked for, and done, so not reported.
    "implemented": {
        "driver": {"rdma": {"enabled": True}},
        "gds": {"enabled": True},
        "gdrcopy": {"enabled": True},
        "dcgmExporter": {"serviceMonitor": {"enabled": True, "scrapeTimeout": "10s"}},
    },
    # Upstream's chart writes these empty: nothing is asked for.
    "empty-names-and-off-switches": {
        "driver": {
            "repoConfig": {"configMapName": ""},
            "certConfig": {"name": ""},
            "licensingConfig": {"nlsEnabled": True, "secretName": ""},
            "virtualTopology": {"config": ""},
            "kernelModuleConfig": {"name": ""},
            "secretEnv": "",
            "hostNetwork": False,
            "rdma": {"enabled": False, "useHostMofed": False},
        },
        "dcgmExporter": {"hostPID": False, "enablePodLabels": False, "annotations": {}},
        "hostPaths": {"kubeletRootDir": "/var/lib/kubelet"},
        "daemonsets": {"podSecurityContext": {}},
        "kataManager": {"enabled": False, "config": {"artifactsDir": "/opt/a"}},
    },
}


@pytest.mark.parametrize("spec", INERT.values(), ids=list(INERT))
def test_values_that_change_nothing_upstream_are_not_reported(spec: dict[str, Any]) -> None:
    assert paths(spec) == []


def test_reasons_say_what_is_not_done() -> None:
    spec = crd.ClusterPolicySpec.model_validate({"cdi": {"default": True}})
    found = crd.unsupported_fields(spec)
    assert str(found[0]) == "spec.cdi.default (no effect (upstream v26.7 ignores it too))"


def _ready(previous: crd.ClusterPolicyStatus | None = None) -> crd.ClusterPolicyStatus:
    return crd.ready_status("gpu-operator", generation=3, now=NOW, previous=previous)


def test_condition_names_the_fields_next_to_ready_and_error() -> None:
    status = crd.with_unsupported_fields(_ready(), ["spec.gds.enabled (x)"], generation=3, now=NOW)
    condition = crd.find_condition(status.conditions, crd.CONDITION_UNSUPPORTED_FIELDS)
    assert condition is not None
    assert condition.status == "True"
    assert condition.reason == crd.REASON_FIELDS_NOT_ACTED_ON
    assert condition.observed_generation == 3
    assert "spec.gds.enabled" in condition.message
    assert [c.type for c in status.conditions or []] == ["Ready", "Error", "UnsupportedFields"]


def test_reasserting_the_same_fields_yields_an_equal_status() -> None:
    first = crd.with_unsupported_fields(_ready(), ["spec.a (x)"], generation=3, now=NOW)
    again = crd.with_unsupported_fields(_ready(first), ["spec.a (x)"], generation=3, now=LATER)
    assert again == first


def test_the_condition_goes_when_the_fields_do() -> None:
    first = crd.with_unsupported_fields(_ready(), ["spec.a (x)"], generation=3, now=NOW)
    cleared = crd.with_unsupported_fields(_ready(first), [], generation=4, now=LATER)
    assert crd.find_condition(cleared.conditions, crd.CONDITION_UNSUPPORTED_FIELDS) is None
    assert [c.type for c in cleared.conditions or []] == ["Ready", "Error"]


def test_unknown_values_are_kept_but_mean_what_upstream_makes_of_them() -> None:
    document = {"gfd": {"imagePullPolicy": "always"}, "operator": {"defaultRuntime": "cri-o"}}
    spec = crd.ClusterPolicySpec.model_validate(document)
    assert spec.gfd.image_pull_policy == "IfNotPresent"
    assert spec.operator.default_runtime == "docker"
    assert spec.model_dump(by_alias=True, exclude_unset=True) == document
    known = crd.ClusterPolicySpec.model_validate({"gfd": {"imagePullPolicy": "Always"}})
    assert known.gfd.image_pull_policy == "Always"
