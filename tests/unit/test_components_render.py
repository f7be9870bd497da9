"""Every component renders complete manifests from the policy, and only when enabled."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import components as c
import crd
from components import dcgm_exporter, driver, validator
from gpuop.operator.controller.wiring import operator as operator

DATA = Path(__file__).resolve().parent.parent / "data"
NS = "gpu-ops"
OPERATOR_IMAGE = "registry.example.com/gpuop:1.2.3"
CLUSTER_SCOPED = {"RuntimeClass", "ClusterRole", "ClusterRoleBinding"}
REGISTRY = "dockerhub.kubekey.local/kse/nvidia"


def spec(**sections: object) -> crd.ClusterPolicySpec:
    return crd.ClusterPolicySpec.model_validate(sections)


def load_spec(name: str) -> crd.ClusterPolicySpec:
    return crd.ClusterPolicy.model_validate(yaml.safe_load((DATA / name).read_text())).spec


def ctx(**overrides: Any) -> c.RenderContext:
    values: dict[str, Any] = {
        "namespace": NS,
        "operator_image": OPERATOR_IMAGE,
        "mig_capable": True,
    }
    values.update(overrides)
    return c.RenderContext(**values)


def everything(mode: str = "kubevirt") -> crd.ClusterPolicySpec:
    """A policy that turns every component on, with a device plugin config: all but
    the Kata device plugin and the CC manager in mode `kubevirt`, all but the KubeVirt
    device plugin in mode `kata`."""
    return spec(
        sandboxWorkloads={"enabled": True, "mode": mode},
        vgpuManager={
            "enabled": True,
            "repository": "example.com",
            "image": "vgpu-manager",
            "version": "1.0",
        },
        vgpuDeviceManager={"enabled": True},
        vfioManager={"enabled": True},
        sandboxDevicePlugin={"enabled": True},
        kataSandboxDevicePlugin={"enabled": True},
        ccManager={"enabled": True},
        dcgm={"enabled": True},
        nodeStatusExporter={"enabled": True},
        devicePlugin={"config": {"name": "dp-configs", "default": "any"}},
        dcgmExporter={
            "serviceMonitor": {"enabled": True, "interval": "15s"},
            "enablePodLabels": True,
        },
    )


def daemonsets(objects: list[c.Manifest]) -> list[c.Manifest]:
    return [o for o in objects if o["kind"] == "DaemonSet"]


def only_daemonset(name: str, policy: crd.ClusterPolicySpec, **kw: Any) -> c.Manifest:
    (ds,) = daemonsets(c.component_by_name(name).objects(policy, ctx(**kw)))
    return ds


def pod(ds: c.Manifest) -> dict[str, Any]:
    result: dict[str, Any] = ds["spec"]["template"]["spec"]
    return result


def main_container(ds: c.Manifest) -> dict[str, Any]:
    result: dict[str, Any] = pod(ds)["containers"][0]
    return result


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def all_containers(ds: c.Manifest) -> Iterator[dict[str, Any]]:
    yield from pod(ds).get("initContainers", [])
    yield from pod(ds)["containers"]


def check_manifest(obj: c.Manifest, component: str) -> None:
    """What an API server would insist on, plus our own labelling conventions."""
    assert obj["apiVersion"]
    assert obj["kind"]
    meta = obj["metadata"]
    assert meta["name"]
    if obj["kind"] in CLUSTER_SCOPED:
        assert "namespace" not in meta
    else:
        assert meta["namespace"] == NS
    assert meta["labels"][c.MANAGED_BY_LABEL] == "gpuop"
    assert meta["labels"][c.PART_OF_LABEL] == "gpu-operator"
    assert meta["labels"][c.COMPONENT_LABEL] == component
    if obj["kind"] == "DaemonSet":
        check_daemonset(obj)


def check_daemonset(ds: c.Manifest) -> None:
    selector = ds["spec"]["selector"]["matchLabels"]
    template_labels = ds["spec"]["template"]["metadata"]["labels"]
    # `app` (`name` where upstream's selects by it: the VFIO and CC managers), plus
    # upstream's part-of label where upstream selects by it (test_selectors).
    key = "name" if "name" in selector else "app"
    assert selector[key] == ds["metadata"]["name"]
    assert set(selector) <= {key, c.PART_OF_LABEL}
    assert selector.items() <= template_labels.items()
    assert template_labels[c.MANAGED_BY_LABEL] == "gpuop"
    spec_ = pod(ds)
    assert spec_["containers"]
    names = [x["name"] for x in all_containers(ds)]
    assert len(names) == len(set(names))
    volumes = [v["name"] for v in spec_.get("volumes", [])]
    assert len(volumes) == len(set(volumes))
    for container in all_containers(ds):
        assert container["name"]
        assert container["image"]
        for m in container.get("volumeMounts", []):
            assert m["name"] in volumes, (container["name"], m["name"])
            assert m["mountPath"].startswith("/")
    strategy = ds["spec"]["updateStrategy"]
    assert strategy["type"] in ("RollingUpdate", "OnDelete")
    if strategy["type"] == "RollingUpdate":
        assert isinstance(strategy["rollingUpdate"]["maxUnavailable"], int | str)
    assert spec_["priorityClassName"] == "system-node-critical"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec_[
        "tolerations"
    ]


def test_components_by_name() -> None:
    assert c.component_by_name("driver").deploy_label == c.DEPLOY_DRIVER_LABEL
    with pytest.raises(KeyError):
        c.component_by_name("nope")


def test_deploy_labels_are_upstreams() -> None:
    """The derived list spells upstream's labels, in rollout order; gpu.deploy.kata-manager
    and gpu.deploy.client have no component of ours, upstream sets them with the others."""
    upstream = tuple(
        f"nvidia.com/gpu.deploy.{name}"
        for name in (
            "driver",
            "container-toolkit",
            "operator-validator",
            "device-plugin",
            "dcgm",
            "dcgm-exporter",
            "gpu-feature-discovery",
            "mig-manager",
            "node-status-exporter",
            "vgpu-manager",
            "vgpu-device-manager",
            "vfio-manager",
            "sandbox-validator",
            "sandbox-device-plugin",
            "kata-sandbox-device-plugin",
            "cc-manager",
            "kata-manager",
            "client",
        )
    )
    assert upstream == c.DEPLOY_LABELS


@pytest.mark.parametrize(
    "policy",
    [spec(), everything(), load_spec("clusterpolicy_seed004.yaml")],
    ids=["default", "everything", "seed004"],
)
def test_every_object_is_a_complete_manifest(policy: crd.ClusterPolicySpec) -> None:
    rendered = c.desired_objects(policy, ctx())
    assert list(rendered) == [x.name for x in c.COMPONENTS]
    for name, objects in rendered.items():
        kinds_names = [(o["kind"], o["metadata"]["name"]) for o in objects]
        assert len(kinds_names) == len(set(kinds_names))
        for obj in objects:
            check_manifest(obj, name)
        for ds in daemonsets(objects):
            label = c.component_by_name(name).deploy_label
            selector = pod(ds)["nodeSelector"]
            if label:
                assert selector[label] == "true"
            else:  # the MPS daemon runs where the device plugin does, if MPS-capable
                assert selector[c.DEPLOY_DEVICE_PLUGIN_LABEL] == "true"
        # Everything renders to plain YAML-able data.
        assert yaml.safe_load(yaml.safe_dump(objects)) == objects


def test_everything_policy_enables_every_component() -> None:
    kata_only = {"kata-device-plugin", "cc-manager"}
    kubevirt = c.enabled_components(everything())
    assert kubevirt == [x.name for x in c.COMPONENTS if x.name not in kata_only]
    kata = c.enabled_components(everything("kata"))
    assert kata == [x.name for x in c.COMPONENTS if x.name != "sandbox-device-plugin"]
    for mode, names in (("kubevirt", kubevirt), ("kata", kata)):
        rendered = c.desired_objects(everything(mode), ctx())
        assert all(rendered[name] for name in names)


EXPECTED_DAEMONSETS = {
    "driver": "nvidia-driver-daemonset",
    "container-toolkit": "nvidia-container-toolkit-daemonset",
    "operator-validation": "nvidia-operator-validator",
    "device-plugin": "nvidia-device-plugin-daemonset",
    "mps-control-daemon": "nvidia-device-plugin-mps-control-daemon",
    "dcgm": "nvidia-dcgm",
    "dcgm-exporter": "nvidia-dcgm-exporter",
    "gpu-feature-discovery": "gpu-feature-discovery",
    "mig-manager": "nvidia-mig-manager",
    "node-status-exporter": "nvidia-node-status-exporter",
    "vgpu-manager": "nvidia-vgpu-manager-daemonset",
    "vgpu-device-manager": "nvidia-vgpu-device-manager",
    "vfio-manager": "nvidia-vfio-manager",
    "sandbox-validation": "nvidia-sandbox-validator",
    "sandbox-device-plugin": "nvidia-sandbox-device-plugin-daemonset",
}


@pytest.mark.parametrize(("component", "name"), EXPECTED_DAEMONSETS.items())
def test_daemonset_names(component: str, name: str) -> None:
    assert only_daemonset(component, everything())["metadata"]["name"] == name


def test_default_policy_components() -> None:
    assert c.enabled_components(spec()) == [
        "pre-requisites",
        "operator-metrics",
        "driver",
        "container-toolkit",
        "operator-validation",
        "device-plugin",
        "mps-control-daemon",
        "dcgm-exporter",
        "gpu-feature-discovery",
        "mig-manager",
    ]


@pytest.mark.parametrize(
    ("section", "component"),
    [
        ("driver", "driver"),
        ("toolkit", "container-toolkit"),
        ("validator", "operator-validation"),
        ("devicePlugin", "device-plugin"),
        ("dcgmExporter", "dcgm-exporter"),
        ("gfd", "gpu-feature-discovery"),
        ("migManager", "mig-manager"),
    ],
)
def test_disabling_a_section_disables_its_component(section: str, component: str) -> None:
    policy = spec(**{section: {"enabled": False}})
    assert component not in c.enabled_components(policy)
    assert c.desired_objects(policy, ctx())[component] == []
    assert c.component_by_name(component).objects(policy, ctx()) == []


def test_seed004_private_registry_images() -> None:
    policy = load_spec("clusterpolicy_seed004.yaml")
    images = {
        name: main_container(only_daemonset(name, policy))["image"]
        for name in ("driver", "container-toolkit", "device-plugin", "dcgm-exporter")
    }
    images["gfd"] = main_container(only_daemonset("gpu-feature-discovery", policy))["image"]
    images["mig"] = main_container(only_daemonset("mig-manager", policy))["image"]
    assert images == {
        "driver": f"{REGISTRY}/driver:550-5.15.0-131-generic",
        "container-toolkit": f"{REGISTRY}/k8s/container-toolkit:v1.20.0",
        "device-plugin": f"{REGISTRY}/k8s-device-plugin:v0.20.0",
        "dcgm-exporter": f"{REGISTRY}/k8s/dcgm-exporter:4.6.0-4.8.3-distroless",
        "gfd": f"{REGISTRY}/gpu-feature-discovery:v0.20.0",
        "mig": f"{REGISTRY}/cloud-native/k8s-mig-manager:v0.15.0",
    }
    # The seed turns dcgm and the node status exporter off.
    assert c.desired_objects(policy, ctx())["dcgm"] == []
    assert c.desired_objects(policy, ctx())["node-status-exporter"] == []


def test_default_images() -> None:
    assert main_container(only_daemonset("driver", spec()))["image"] == (
        "nvcr.io/nvidia/driver:595.91.07"
    )
    assert main_container(only_daemonset("dcgm", spec(dcgm={"enabled": True})))["image"] == (
        "nvcr.io/nvidia/cloud-native/dcgm:4.6.0-1-ubuntu24.04"
    )


def test_section_settings_reach_the_container() -> None:
    policy = spec(
        devicePlugin={
            "imagePullPolicy": "Always",
            "imagePullSecrets": ["regcred"],
            "args": ["--fail-on-init-error=false"],
            "env": [{"name": "MIG_STRATEGY", "value": "mixed"}, {"name": "EXTRA", "value": "1"}],
            "resources": {"limits": {"memory": "256Mi"}},
        }
    )
    ds = only_daemonset("device-plugin", policy)
    main = main_container(ds)
    assert main["imagePullPolicy"] == "Always"
    # The entrypoint script passes them on to the plugin (`exec nvidia-device-plugin "$@"`).
    assert main["command"] == ["/bin/sh", "-c"]
    assert main["args"] == ["/bin/entrypoint.sh --fail-on-init-error=false"]
    assert main["resources"] == {"limits": {"memory": "256Mi"}}
    variables = env_of(main)
    assert variables["MIG_STRATEGY"] == "mixed"  # the user's value wins
    assert variables["EXTRA"] == "1"
    assert [e["name"] for e in main["env"]].count("MIG_STRATEGY") == 1
    assert pod(ds)["imagePullSecrets"] == [{"name": "regcred"}]


def test_daemonsets_section_applies_to_every_pod() -> None:
    policy = spec(
        daemonsets={
            "labels": {"team": "gpu"},
            "annotations": {"note": "x"},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu"}],
            "priorityClassName": "high",
            "rollingUpdate": {"maxUnavailable": "3"},
        }
    )
    for objects in c.desired_objects(policy, ctx()).values():
        for obj in objects:
            assert obj["metadata"]["labels"]["team"] == "gpu"
        for ds in daemonsets(objects):
            template = ds["spec"]["template"]
            assert template["metadata"]["labels"]["team"] == "gpu"
            assert template["metadata"]["annotations"]["note"] == "x"
            assert template["spec"]["tolerations"] == [
                {"key": "dedicated", "operator": "Equal", "value": "gpu"}
            ]
            assert template["spec"]["priorityClassName"] == "high"
            if ds["metadata"]["name"] != driver.DAEMONSET_NAME:
                assert ds["spec"]["updateStrategy"] == {
                    "type": "RollingUpdate",
                    "rollingUpdate": {"maxUnavailable": 3},  # an int, as the API wants
                }


def test_policy_pod_labels_win_except_app_and_part_of() -> None:
    """As upstream: `daemonsets.labels` replace ours on the pods (its chart sets
    `managed-by: gpu-operator`), except the selector's `app` and `part-of`, by which the
    controller finds operand pods. The DaemonSet's own metadata keeps ours."""
    policy = spec(
        daemonsets={
            "labels": {
                "app": "evil",
                c.PART_OF_LABEL: "evil",
                c.MANAGED_BY_LABEL: "gpu-operator",
                "team": "gpu",
            }
        }
    )
    for name in ("driver", "device-plugin", "operator-validation"):
        ds = only_daemonset(name, policy)
        labels = ds["spec"]["template"]["metadata"]["labels"]
        assert labels["app"] == ds["metadata"]["name"]
        assert labels[c.PART_OF_LABEL] == "gpu-operator"
        assert labels[c.MANAGED_BY_LABEL] == "gpu-operator"
        assert labels["team"] == "gpu"
        assert ds["metadata"]["labels"][c.MANAGED_BY_LABEL] == "gpuop"
    # The operand caches select on the label's presence, whatever value the policy gives.
    assert operator.OPERAND_SELECTOR == c.MANAGED_BY_LABEL


def test_extra_labels_go_on_metadata_only() -> None:
    ds = only_daemonset("driver", spec(), extra_labels={"helm.sh/chart": "gpuop-1"})
    assert ds["metadata"]["labels"]["helm.sh/chart"] == "gpuop-1"
    assert "helm.sh/chart" not in ds["spec"]["template"]["metadata"]["labels"]


def test_percent_max_unavailable_stays_a_string() -> None:
    policy = spec(daemonsets={"rollingUpdate": {"maxUnavailable": "20%"}})
    ds = only_daemonset("gpu-feature-discovery", policy)
    assert ds["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] == "20%"


# --- driver ---------------------------------------------------------------------------


def driver_template(policy: crd.ClusterPolicySpec, **kw: Any) -> Any:
    return only_daemonset("driver", policy, **kw)["spec"]["template"]


def test_driver_daemonset() -> None:
    ds = only_daemonset("driver", spec())
    assert ds["spec"]["template"]["metadata"]["labels"]["app"] == "nvidia-driver-daemonset"
    assert pod(ds)["nodeSelector"] == {c.DEPLOY_DRIVER_LABEL: "true"}
    assert pod(ds)["hostPID"] is True
    main = main_container(ds)
    assert main["securityContext"]["privileged"] is True
    mounts = {m["mountPath"]: m for m in main["volumeMounts"]}
    assert mounts["/run/nvidia"]["mountPropagation"] == "Bidirectional"
    assert {"/var/log", "/dev/log", "/host-etc/os-release"} <= set(mounts)
    assert "startupProbe" in main
    objects = c.component_by_name("driver").objects(spec(), ctx())
    assert [o["kind"] for o in objects] == [
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "DaemonSet",
    ]
    assert pod(ds)["serviceAccountName"] == objects[0]["metadata"]["name"]
    (manager,) = pod(ds)["initContainers"]
    assert manager["name"] == "k8s-driver-manager"
    assert manager["args"] == ["uninstall_driver"]


def test_driver_update_strategy_follows_auto_upgrade() -> None:
    auto = only_daemonset("driver", spec(driver={"upgradePolicy": {"autoUpgrade": True}}))
    assert auto["spec"]["updateStrategy"] == {"type": "OnDelete"}
    manual = only_daemonset(
        "driver",
        spec(
            driver={"upgradePolicy": {"autoUpgrade": False}},
            daemonsets={"rollingUpdate": {"maxUnavailable": "25%"}},
        ),
    )
    assert manual["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": "25%"},
    }


def test_driver_probe_timing_from_spec() -> None:
    main = main_container(
        only_daemonset(
            "driver",
            spec(
                driver={
                    "startupProbe": {"failureThreshold": 5},
                    "readinessProbe": {"periodSeconds": 7},
                }
            ),
        )
    )
    assert main["startupProbe"]["failureThreshold"] == 5
    assert main["startupProbe"]["initialDelaySeconds"] == 60
    assert main["readinessProbe"]["periodSeconds"] == 7


@pytest.mark.parametrize(
    ("changed", "kw"),
    [
        (spec(devicePlugin={"version": "v9.9.9"}), {}),
        (spec(dcgmExporter={"enabled": False, "serviceMonitor": {"enabled": True}}), {}),
        (spec(toolkit={"version": "v2.0.0"}, gfd={"enabled": False}), {}),
        (spec(mig={"strategy": "mixed"}, cdi={"enabled": False}), {}),
        (spec(validator={"env": [{"name": "X", "value": "y"}]}), {}),
        (spec(driver={"upgradePolicy": {"autoUpgrade": False, "maxParallelUpgrades": 4}}), {}),
        (spec(daemonsets={"rollingUpdate": {"maxUnavailable": "5"}}), {}),
        (spec(hostPaths={"driverInstallDir": "/opt/driver"}), {}),
        (spec(), {"operator_image": "other/gpuop:9", "extra_labels": {"chart": "v2"}}),
        (spec(), {"mig_capable": False, "namespace": "elsewhere"}),
    ],
)
def test_driver_template_ignores_unrelated_changes(
    changed: crd.ClusterPolicySpec, kw: dict[str, Any]
) -> None:
    assert driver_template(changed, **kw) == driver_template(spec())


@pytest.mark.parametrize(
    "changed",
    [
        spec(driver={"version": "570.1.2"}),
        spec(driver={"repository": "private.example.com/nvidia"}),
        spec(driver={"env": [{"name": "A", "value": "b"}]}),
        spec(daemonsets={"labels": {"team": "x"}}),
        spec(daemonsets={"priorityClassName": "other"}),
    ],
)
def test_driver_template_changes_with_the_driver(changed: crd.ClusterPolicySpec) -> None:
    assert driver_template(changed) != driver_template(spec())


# --- validator ------------------------------------------------------------------------


def test_validator_daemonset() -> None:
    ds = only_daemonset("operator-validation", spec())
    assert ds["spec"]["template"]["metadata"]["labels"]["app"] == "nvidia-operator-validator"
    assert pod(ds)["nodeSelector"] == {c.DEPLOY_VALIDATOR_LABEL: "true"}
    main = main_container(ds)
    assert main["image"] == OPERATOR_IMAGE
    assert main["command"][:4] == ["gpuop", "node-agent", "validate", "--wait"]
    cmd = main["command"]
    assert cmd[cmd.index("--cuda-image") + 1] == crd.CUDA_SAMPLE_IMAGE
    assert main["securityContext"]["privileged"] is True
    assert main["readinessProbe"]["exec"]["command"] == [
        "test",
        "-f",
        "/run/nvidia/validations/plugin-ready",
    ]
    variables = env_of(main)
    for name, path in [
        ("NODE_NAME", "spec.nodeName"),
        ("POD_NAME", "metadata.name"),
        ("POD_NAMESPACE", "metadata.namespace"),
        ("POD_UID", "metadata.uid"),
    ]:
        assert variables[name] == {"fieldRef": {"fieldPath": path}}
    mounts = {m["mountPath"]: m for m in main["volumeMounts"]}
    assert mounts["/run/nvidia/validations"].get("readOnly") is not True
    # Status files written here must reach the host (and other pods): Bidirectional.
    assert mounts["/run/nvidia/validations"]["mountPropagation"] == "Bidirectional"
    # The CUDA and plugin checks need no host path beyond it (the driver and toolkit
    # init containers have theirs: tests/unit/test_validator_pod.py).
    assert set(mounts) == {"/run/nvidia/validations"}
    # Our image runs as 65532; host paths under /run/nvidia are root's.
    assert main["securityContext"] == {"privileged": True, "runAsUser": 0}
    assert pod(ds)["runtimeClassName"] == "nvidia"
    volumes = {v["name"]: v for v in pod(ds)["volumes"]}
    assert volumes[mounts["/run/nvidia/validations"]["name"]]["hostPath"] == {
        "path": "/run/nvidia/validations",
        "type": "DirectoryOrCreate",
    }


def test_validator_cuda_image_and_options_from_policy() -> None:
    policy = spec(
        validator={
            "imagePullSecrets": ["pull"],
            "cuda": {"env": [{"name": validator.CUDA_IMAGE_ENV, "value": "my/cuda:1"}]},
            "plugin": {"env": [{"name": "WITH_WORKLOAD", "value": "true"}]},
        },
        driver={"enabled": False},
        toolkit={"installDir": "/opt/nvidia"},
    )
    cmd = validator.command(policy)
    assert cmd[cmd.index("--cuda-image") + 1] == "my/cuda:1"
    assert cmd[cmd.index("--image-pull-secret") + 1] == "pull"
    assert "--plugin-workload" in cmd
    # No driver DaemonSet: the check finds a host driver itself, and waits for no
    # driver container.
    driver_check = validator.driver_command(policy)
    assert driver_check[driver_check.index("--driver-root") + 1] == "/run/nvidia/driver"
    assert "--driver-container" not in driver_check
    toolkit_check = validator.toolkit_command(policy)
    dirs = toolkit_check[toolkit_check.index("--toolkit-runtime-dirs") + 1]
    assert dirs.startswith("/opt/nvidia/toolkit,")


def test_driver_check_follows_the_policys_paths_and_driver() -> None:
    """The validator and the toolkit's driver-validation run the same driver check, told
    the host paths upstream's validator gets as HOST_ROOT and DRIVER_INSTALL_DIR."""
    default = validator.driver_check_args(spec())
    assert default == [
        "--driver-root",
        "/run/nvidia/driver",
        "--host-root",
        "/host",
        "--driver-container",
    ]
    custom = spec(hostPaths={"rootFS": "/sysroot", "driverInstallDir": "/opt/nvidia/driver"})
    args = validator.driver_check_args(custom)
    assert args[args.index("--host-rootfs") + 1] == "/sysroot"
    assert args[args.index("--driver-install-dir") + 1] == "/opt/nvidia/driver"
    for policy in (spec(), custom, spec(driver={"enabled": False})):
        init = pod(only_daemonset("container-toolkit", policy))["initContainers"][0]
        assert " ".join(validator.driver_check_args(policy)) in init["args"][0]
        own = pod(only_daemonset("operator-validation", policy))["initContainers"][0]
        assert own["args"] == init["args"]  # the same check, retried the same way


def test_validator_driver_env_reaches_the_toolkits_driver_check() -> None:
    """As upstream: `validator.driver.env` (e.g. DISABLE_DEV_CHAR_SYMLINK_CREATION) goes
    to every driver-validation, the toolkit's init container included."""
    env = [{"name": "DISABLE_DEV_CHAR_SYMLINK_CREATION", "value": "true"}]
    policy = spec(validator={"driver": {"env": env}})
    init = pod(only_daemonset("container-toolkit", policy))["initContainers"][0]
    assert init["name"] == "driver-validation"
    assert env_of(init)["DISABLE_DEV_CHAR_SYMLINK_CREATION"] == "true"
    own = pod(only_daemonset("operator-validation", policy))["initContainers"][0]
    assert own["name"] == "driver-validation"
    assert env_of(own)["DISABLE_DEV_CHAR_SYMLINK_CREATION"] == "true"


def test_node_status_exporter_runs_our_export() -> None:
    ds = only_daemonset("node-status-exporter", spec(nodeStatusExporter={"enabled": True}))
    main = main_container(ds)
    assert main["image"] == OPERATOR_IMAGE
    assert main["command"][:5] == ["gpuop", "node-agent", "export", "--port", "8000"]
    assert "node-status-exporter" not in c.enabled_components(spec())


# --- other operands -------------------------------------------------------------------


def test_prerequisites_runtime_class_is_cluster_scoped() -> None:
    classes = c.component_by_name("pre-requisites").objects(spec(), ctx())
    assert {rc["metadata"]["name"]: rc["handler"] for rc in classes} == {
        "nvidia": "nvidia",
        "nvidia-cdi": "nvidia-cdi",
        "nvidia-legacy": "nvidia-legacy",
    }
    for rc in classes:
        assert rc["kind"] == "RuntimeClass"
        assert "namespace" not in rc["metadata"]


def test_operator_metrics_service() -> None:
    (svc,) = c.component_by_name("operator-metrics").objects(
        spec(), ctx(service_monitor_crd=False, prometheus_rule_crd=False)
    )
    assert svc["metadata"]["name"] == "gpu-operator"
    assert svc["metadata"]["labels"]["app"] == "gpu-operator"  # upstream's, and selected
    assert svc["metadata"]["annotations"] == {"prometheus.io/scrape": "true"}
    assert svc["spec"]["selector"] == {"app": "gpu-operator"}
    assert svc["spec"]["ports"][0]["port"] == 8080
    assert svc["spec"]["ports"][0]["name"] == "gpu-operator-metrics"


def _by_kind(objects: list[c.Manifest], kind: str) -> c.Manifest:
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


def test_operator_service_monitor_and_rules_where_the_crds_are_served() -> None:
    """As upstream: the operator's ServiceMonitor whenever the CRD is served (the
    policy's operator.metrics.serviceMonitor only tunes it), selecting the Service."""
    comp = c.component_by_name("operator-metrics")
    objects = comp.objects(spec(), ctx())
    assert [o["kind"] for o in objects] == ["Service", "ServiceMonitor", "PrometheusRule"]
    svc, monitor, rule = objects
    assert monitor["metadata"]["name"] == "gpu-operator"
    assert monitor["metadata"]["namespace"] == NS
    assert monitor["metadata"]["labels"]["app"] == "gpu-operator"
    assert monitor["spec"] == {
        "jobLabel": "operator",
        "selector": {"matchLabels": {"app": "gpu-operator"}},
        "namespaceSelector": {"matchNames": [NS]},
        "endpoints": [{"port": "gpu-operator-metrics", "path": "/metrics"}],
    }
    assert monitor["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    ports = {p["name"] for p in svc["spec"]["ports"]}
    assert monitor["spec"]["endpoints"][0]["port"] in ports

    assert rule["metadata"]["name"] == "nvidia-gpu-operator-metrics"
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert {"GPUOperatorReconciliationFailed", "GPUOperatorDriverUpgradeHalted"} <= alerts
    assert "GPUOperatorNodeDeploymentFailed" not in alerts  # the node exporter's

    tuned = spec(
        operator={
            "metrics": {
                "serviceMonitor": {
                    "enabled": False,  # upstream keeps it regardless
                    "interval": "30s",
                    "additionalLabels": {"release": "prom"},
                    "relabelings": [{"targetLabel": "cluster", "replacement": "a"}],
                }
            }
        }
    )
    monitor = _by_kind(comp.objects(tuned, ctx()), "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    # The same labels reach its PrometheusRule (a Prometheus selects rules by label too).
    assert (
        _by_kind(comp.objects(tuned, ctx()), "PrometheusRule")["metadata"]["labels"]["release"]
        == "prom"
    )
    assert monitor["spec"]["endpoints"] == [
        {
            "port": "gpu-operator-metrics",
            "path": "/metrics",
            "interval": "30s",
            "relabelings": [{"targetLabel": "cluster", "replacement": "a"}],
        }
    ]

    # Each kind only where its CRD is served.
    kinds = [o["kind"] for o in comp.objects(spec(), ctx(prometheus_rule_crd=False))]
    assert kinds == ["Service", "ServiceMonitor"]
    kinds = [o["kind"] for o in comp.objects(spec(), ctx(service_monitor_crd=False))]
    assert kinds == ["Service", "PrometheusRule"]


def test_node_status_exporter_service_monitor_and_rules() -> None:
    comp = c.component_by_name("node-status-exporter")
    assert comp.objects(spec(), ctx()) == []  # off by default, as upstream
    objects = comp.objects(spec(nodeStatusExporter={"enabled": True}), ctx())
    svc = _by_kind(objects, "Service")
    monitor = _by_kind(objects, "ServiceMonitor")
    rule = _by_kind(objects, "PrometheusRule")
    assert svc["metadata"]["annotations"] == {"prometheus.io/scrape": "true"}
    assert monitor["metadata"]["name"] == "nvidia-node-status-exporter"
    assert monitor["metadata"]["labels"]["app"] == "nvidia-node-status-exporter"
    assert monitor["spec"] == {
        "jobLabel": "node-status",
        "selector": {"matchLabels": {"app": "nvidia-node-status-exporter"}},
        "namespaceSelector": {"matchNames": [NS]},
        "endpoints": [{"port": "node-status", "path": "/metrics"}],
    }
    assert monitor["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert rule["metadata"]["name"] == "nvidia-node-status-exporter-alerts"
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert alerts == {
        "GPUOperatorNodeDeploymentFailed",
        "GPUOperatorNodeDeploymentDriverFailed",
        "GPUOperatorNodeDeploymentToolkitFailed",
        "GPUOperatorNodeDeploymentCudaFailed",
        "GPUOperatorGPULost",
        "GPUOperatorGPUUncorrectableECCErrors",
        "GPUOperatorGPURowRemapFailed",
    }
    assert "release" not in rule["metadata"]["labels"]
    # Its ServiceMonitor takes settings (a gpuop extension); their additional labels
    # (kube-prometheus-stack's `release`) label the PrometheusRule as well.
    tuned = comp.objects(
        spec(
            nodeStatusExporter={
                "enabled": True,
                "serviceMonitor": {"interval": "30s", "additionalLabels": {"release": "kps"}},
            }
        ),
        ctx(),
    )
    monitor = _by_kind(tuned, "ServiceMonitor")
    assert monitor["spec"]["endpoints"] == [
        {"port": "node-status", "path": "/metrics", "interval": "30s"}
    ]
    assert monitor["metadata"]["labels"]["release"] == "kps"
    assert _by_kind(tuned, "PrometheusRule")["metadata"]["labels"]["release"] == "kps"
    plain = comp.objects(
        spec(nodeStatusExporter={"enabled": True}),
        ctx(service_monitor_crd=False, prometheus_rule_crd=False),
    )
    assert not {"ServiceMonitor", "PrometheusRule"} & {o["kind"] for o in plain}


def test_dcgm_exporter_service_and_service_monitor() -> None:
    objects = c.component_by_name("dcgm-exporter").objects(spec(), ctx())
    assert [o["kind"] for o in objects] == [
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "DaemonSet",
        "Service",
    ]
    svc = objects[-1]
    assert svc["metadata"]["name"] == "nvidia-dcgm-exporter"
    assert svc["spec"]["ports"][0]["port"] == 9400
    assert svc["spec"]["ports"][0]["name"] == "gpu-metrics"
    assert svc["spec"]["selector"] == {"app": "nvidia-dcgm-exporter"}

    policy = spec(
        dcgmExporter={
            "serviceMonitor": {
                "enabled": True,
                "interval": "15s",
                "scrapeTimeout": "10s",
                "honorLabels": True,
                "additionalLabels": {"release": "prom"},
            }
        }
    )
    objects = c.component_by_name("dcgm-exporter").objects(policy, ctx())
    monitor = objects[-1]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["kind"] == "ServiceMonitor"
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["metadata"]["labels"]["app"] == "nvidia-dcgm-exporter"  # upstream's
    assert monitor["spec"]["jobLabel"] == "app"
    endpoint = monitor["spec"]["endpoints"][0]
    assert endpoint == {
        "port": "gpu-metrics",
        "path": "/metrics",
        "honorLabels": True,
        "interval": "15s",
        "scrapeTimeout": "10s",
    }
    assert monitor["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    # No CRD in the cluster: no ServiceMonitor.
    without = c.component_by_name("dcgm-exporter").objects(policy, ctx(service_monitor_crd=False))
    assert "ServiceMonitor" not in [o["kind"] for o in without]


def test_dcgm_exporter_uses_standalone_dcgm_when_enabled() -> None:
    main = main_container(only_daemonset("dcgm-exporter", spec(dcgm={"enabled": True})))
    # Through the node-local Service of the standalone engine.
    assert env_of(main)["DCGM_REMOTE_HOSTENGINE_INFO"] == "nvidia-dcgm:5555"
    objects = c.component_by_name("dcgm").objects(spec(dcgm={"enabled": True}), ctx())
    (svc,) = [o for o in objects if o["kind"] == "Service"]
    assert svc["metadata"]["name"] == "nvidia-dcgm"
    assert svc["spec"]["internalTrafficPolicy"] == "Local"
    main = main_container(only_daemonset("dcgm-exporter", spec(dcgm={"enabled": False})))
    assert "DCGM_REMOTE_HOSTENGINE_INFO" not in env_of(main)
    assert dcgm_exporter.METRICS_PORT == 9400


def test_device_plugin_config_mounts_the_users_configmap() -> None:
    plain = only_daemonset("device-plugin", spec())
    assert [x["name"] for x in pod(plain)["containers"]] == ["nvidia-device-plugin"]
    assert "CONFIG_FILE" not in env_of(main_container(plain))

    policy = spec(devicePlugin={"config": {"name": "time-slicing", "default": "any"}})
    ds = only_daemonset("device-plugin", policy)
    volumes = {v["name"]: v for v in pod(ds)["volumes"]}
    assert volumes["available-configs"]["configMap"]["name"] == "time-slicing"
    init = {x["name"]: x for x in pod(ds)["initContainers"]}
    assert env_of(init["config-manager-init"])["DEFAULT_CONFIG"] == "any"
    assert env_of(init["config-manager-init"])["NODE_LABEL"] == c.DEVICE_PLUGIN_CONFIG_LABEL
    assert env_of(main_container(ds))["CONFIG_FILE"] == "/config/config.yaml"
    assert pod(ds)["shareProcessNamespace"] is True
    kinds = [o["kind"] for o in c.component_by_name("device-plugin").objects(policy, ctx())]
    assert "ClusterRole" in kinds


def test_mps_daemon_exists_with_the_device_plugin() -> None:
    """Like upstream: it only schedules where the device plugin set mps.capable."""
    assert "mps-control-daemon" in c.enabled_components(spec())
    for policy in (spec(), spec(devicePlugin={"config": {"name": "sharing"}})):
        ds = only_daemonset("mps-control-daemon", policy)
        assert pod(ds)["nodeSelector"] == {
            c.DEPLOY_DEVICE_PLUGIN_LABEL: "true",
            c.MPS_CAPABLE_LABEL: "true",
        }
    off = spec(devicePlugin={"enabled": False, "config": {"name": "sharing"}})
    assert "mps-control-daemon" not in c.enabled_components(off)


def test_mps_daemon_takes_the_plugins_resources_but_not_its_env_or_args() -> None:
    """Upstream's MPS daemon gets the device plugin's image and resources only: the
    plugin's env (PASS_DEVICE_SPECS, DEVICE_LIST_STRATEGY) and args are the plugin's."""
    policy = spec(
        devicePlugin={
            "env": [{"name": "PASS_DEVICE_SPECS", "value": "false"}],
            "args": ["--fail-on-init-error=false"],
            "resources": {"limits": {"memory": "1Gi"}},
        }
    )
    main = main_container(only_daemonset("mps-control-daemon", policy))
    assert "PASS_DEVICE_SPECS" not in env_of(main)
    assert "args" not in main
    assert main["resources"] == {"limits": {"memory": "1Gi"}}
    plugin = main_container(only_daemonset("device-plugin", policy))
    assert env_of(plugin)["PASS_DEVICE_SPECS"] == "false"


def _run_plugin_entrypoint(
    tmp_path: Path, modules: str, preset: dict[str, str] | None = None
) -> dict[str, str]:
    """The device plugin's rendered entrypoint, run with its host files in `tmp_path`:
    the environment it would start the plugin with."""
    (config_map,) = [
        o
        for o in c.component_by_name("device-plugin").objects(spec(), ctx())
        if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-entrypoint")
    ]
    validations = tmp_path / "validations"
    validations.mkdir(parents=True)
    (validations / "driver-ready").write_text("IS_HOST_DRIVER=false\n")
    (tmp_path / "modules").write_text(modules)
    script = (
        config_map["data"]["entrypoint.sh"]
        .replace("/run/nvidia/validations", str(validations))
        .replace("/proc/modules", str(tmp_path / "modules"))
        .replace('exec nvidia-device-plugin "$@"', "exec env")
    )
    out = subprocess.run(
        ["sh", "-c", script],
        env={"PATH": os.environ["PATH"], **(preset or {})},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def test_device_plugin_entrypoint_turns_on_features_for_host_modules(tmp_path: Path) -> None:
    """As upstream's entrypoint: a host-loaded gdrdrv sets GDRCOPY_ENABLED, nvidia_fs
    sets GDS_ENABLED and MOFED_ENABLED; a value the pod already has is kept."""
    none = _run_plugin_entrypoint(tmp_path / "a", "nvidia 1 0 - Live 0x0\n")
    assert not {"GDRCOPY_ENABLED", "GDS_ENABLED", "MOFED_ENABLED"} & set(none)
    assert none["IS_HOST_DRIVER"] == "false"
    both = _run_plugin_entrypoint(
        tmp_path / "b",
        "gdrdrv 24576 0 - Live 0x0\nnvidia_fs 262144 0 - Live 0x0\n",
        {"MOFED_ENABLED": "false"},
    )
    assert both["GDRCOPY_ENABLED"] == "true"
    assert both["GDS_ENABLED"] == "true"
    assert both["MOFED_ENABLED"] == "false"
    similar = _run_plugin_entrypoint(tmp_path / "c", "gdrdrv_x 1 0 - Live 0x0\n")
    assert "GDRCOPY_ENABLED" not in similar


def test_mig_manager_needs_a_mig_capable_node() -> None:
    component = c.component_by_name("mig-manager")
    assert component.enabled(spec())
    assert component.objects(spec(), ctx(mig_capable=False)) == []
    assert daemonsets(component.objects(spec(), ctx(mig_capable=True)))


def test_selinux_level_s0_where_upstream_sets_it() -> None:
    """On an SELinux-enforcing node the driver must load modules, the toolkit write the
    runtime's config and the driver check link /dev/char: upstream gives exactly these
    containers level s0, and no others."""
    policy = spec(
        gds={"enabled": True}, gdrcopy={"enabled": True}, driver={"rdma": {"enabled": True}}
    )
    wanted = {
        "nvidia-driver-ctr",
        "nvidia-peermem-ctr",
        "nvidia-fs-ctr",
        "nvidia-gdrcopy-ctr",
        "nvidia-container-toolkit-ctr",
        "driver-validation",  # the toolkit's and the validator's
    }
    found = set()
    for objects in c.desired_objects(policy, ctx()).values():
        for ds in daemonsets(objects):
            for container in all_containers(ds):
                options = container.get("securityContext", {}).get("seLinuxOptions")
                if options is not None:
                    assert options == {"level": "s0"}
                    found.add(container["name"])
    assert found == wanted


def test_dcgm_binds_no_host_port() -> None:
    """Upstream's `dcgm.hostPort` is deprecated and unread: the engine is not reachable
    on the node's IP, only through the node-local Service."""
    for dcgm in ({"enabled": True}, {"enabled": True, "hostPort": 6000}):
        main = main_container(only_daemonset("dcgm", spec(dcgm=dcgm)))
        assert main["ports"] == [{"name": "dcgm", "containerPort": 5555, "protocol": "TCP"}]


def test_operands_wait_for_the_toolkit() -> None:
    for name in ("device-plugin", "dcgm-exporter", "gpu-feature-discovery", "mig-manager"):
        init = pod(only_daemonset(name, spec()))["initContainers"][0]
        assert init["image"] == OPERATOR_IMAGE
        assert init["command"] == ["sh", "-c"]
        assert "/run/nvidia/validations/toolkit-ready" in init["args"][-1]
        # Root and privileged: a non-root user may not read root's host directories.
        assert init["securityContext"] == {"privileged": True, "runAsUser": 0}


def test_mig_manager_default_layouts_unless_the_policy_names_its_own() -> None:
    def config_maps(policy: crd.ClusterPolicySpec) -> dict[str, c.Manifest]:
        objects = c.component_by_name("mig-manager").objects(policy, ctx(mig_capable=True))
        return {o["metadata"]["name"]: o for o in objects if o["kind"] == "ConfigMap"}

    defaults = config_maps(spec())
    layouts = yaml.safe_load(defaults["default-mig-parted-config"]["data"]["config.yaml"])
    assert layouts["mig-configs"]["all-disabled"] == [{"devices": "all", "mig-enabled": False}]
    assert layouts["mig-configs"]["all-1g.10gb"][1]["mig-devices"] == {"1g.10gb": 4}
    clients = yaml.safe_load(defaults["default-gpu-clients"]["data"]["clients.yaml"])
    assert "nvidia-dcgm.service" in clients["systemd-services"]
    ds = only_daemonset("mig-manager", spec())
    assert env_of(main_container(ds))["DEFAULT_CONFIG_FILE"] == (
        "/mig-parted-config/config-default.yaml"
    )

    own = spec(migManager={"config": {"name": "my-layouts"}, "gpuClientsConfig": {"name": "mine"}})
    assert set(config_maps(own)) == {"nvidia-mig-manager-entrypoint"}
    ds = only_daemonset("mig-manager", own)
    volumes = {v["name"]: v for v in pod(ds)["volumes"]}
    assert volumes["mig-parted-config"]["configMap"] == {"name": "my-layouts"}
    assert volumes["gpu-clients"]["configMap"] == {"name": "mine"}
    assert env_of(main_container(ds))["CONFIG_FILE"] == "/mig-parted-config/config.yaml"


def _daemonset_tolerations(policy: crd.ClusterPolicySpec) -> dict[str, list[dict[str, Any]]]:
    return {
        o["metadata"]["name"]: o["spec"]["template"]["spec"]["tolerations"]
        for objects in c.desired_objects(policy, ctx()).values()
        for o in objects
        if o["kind"] == "DaemonSet"
    }


QUARANTINE = {"key": "nvidia.com/gpu.health", "operator": "Exists", "effect": "NoSchedule"}


def test_operands_tolerate_the_quarantine_taint_only_with_remediation_on() -> None:
    off = _daemonset_tolerations(spec())
    assert off
    assert all(QUARANTINE not in t for t in off.values())
    on = _daemonset_tolerations(spec(healthRemediation={"enabled": True}))
    assert set(on) == set(off)
    assert all(t == [*off[name], QUARANTINE] for name, t in on.items())


def test_a_dry_run_adds_no_toleration_so_no_operand_pod_rolls() -> None:
    """dryRun only reports: a toleration in the templates would roll every operand pod
    (and give the driver a new revision, which restarts it on every GPU node)."""
    off = _daemonset_tolerations(spec())
    dry = _daemonset_tolerations(spec(healthRemediation={"enabled": True, "dryRun": True}))
    assert dry == off


def test_an_admins_toleration_for_the_quarantine_taint_is_kept_as_written() -> None:
    own = {"key": "nvidia.com/gpu.health", "operator": "Equal", "value": "unhealthy"}
    policy = spec(healthRemediation={"enabled": True}, daemonsets={"tolerations": [own]})
    for tolerations in _daemonset_tolerations(policy).values():
        assert [t for t in tolerations if t.get("key") == "nvidia.com/gpu.health"] == [own]


def test_config_manager_pods_share_a_pid_namespace_only_without_host_pid() -> None:
    """The API server refuses a pod with both hostPID and shareProcessNamespace: the MPS
    daemon (hostPID, as upstream's) must not get the latter with a plugin config."""
    policy = spec(devicePlugin={"config": {"name": "time-slicing", "default": "any"}})
    mps = pod(only_daemonset("mps-control-daemon", policy))
    assert mps["hostPID"] is True
    assert "shareProcessNamespace" not in mps
    assert "config-manager" in [ct["name"] for ct in mps["containers"]]
    plugin = pod(only_daemonset("device-plugin", policy))
    assert plugin["shareProcessNamespace"] is True
    assert not plugin.get("hostPID")


def test_dcgm_exporter_has_upstreams_health_probes() -> None:
    """A hung exporter is restarted and leaves the Service, as upstream's does."""
    main = main_container(only_daemonset("dcgm-exporter", spec()))
    for key, period in (("livenessProbe", 5), ("readinessProbe", 10)):
        probe = main[key]
        assert probe["httpGet"] == {"path": "/health", "port": 9400, "scheme": "HTTP"}
        assert (probe["initialDelaySeconds"], probe["periodSeconds"]) == (45, period)


def test_operand_objects_carry_upstreams_app_label() -> None:
    """`kubectl get ds,cm,sa,role -l app=<name>` finds ours as it found upstream's: the
    DaemonSets, the entrypoint/startup-probe ConfigMaps (app = their DaemonSet) and the
    exporters' account and namespaced RBAC."""
    objects = [o for objs in c.desired_objects(everything(), ctx()).values() for o in objs]
    for ds in daemonsets(objects):
        assert ds["metadata"]["labels"]["app"] == ds["metadata"]["name"]
    apps = {(o["kind"], o["metadata"]["name"]): o["metadata"]["labels"].get("app") for o in objects}
    assert (
        apps[("ConfigMap", "nvidia-device-plugin-entrypoint")] == "nvidia-device-plugin-daemonset"
    )
    assert apps[("ConfigMap", "nvidia-container-toolkit-entrypoint")] == (
        "nvidia-container-toolkit-daemonset"
    )
    assert apps[("ConfigMap", "nvidia-mig-manager-entrypoint")] == "nvidia-mig-manager"
    assert apps[("ConfigMap", "nvidia-driver-startup-probe")] == "nvidia-driver-daemonset"
    for name in ("nvidia-dcgm-exporter", "nvidia-node-status-exporter"):
        for kind in ("ServiceAccount", "Role", "RoleBinding"):
            assert apps[(kind, name)] == name
