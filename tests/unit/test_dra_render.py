"""What a GPUCluster renders (components.dra), beyond the sample the conformance test
compares whole: the switches upstream's manifests branch on."""

from __future__ import annotations

from typing import Any

import pytest

import crd
from components import RenderContext, apply_label_changes
from components.dra import KINDS, claim_consumers, gpucluster_label_changes, render
from components.dra.driver import feature_gates, max_resources
from crd import ResourceRequirements

CTX = RenderContext(namespace="gpu-operator", operator_image="gpuop:test")


def _spec(**spec: Any) -> crd.GPUClusterSpec:
    return crd.parse_gpucluster({"spec": {"draDriver": {}, **spec}}).spec


def _objects(spec: crd.GPUClusterSpec) -> dict[str, dict[str, Any]]:
    return {
        f"{o['kind']}/{o['metadata']['name']}": o for s in render(spec, CTX).values() for o in s
    }


def _plugin_containers(spec: crd.GPUClusterSpec) -> dict[str, dict[str, Any]]:
    ds = _objects(spec)["DaemonSet/nvidia-dra-driver-kubelet-plugin"]
    return {c["name"]: c for c in ds["spec"]["template"]["spec"]["containers"]}


SPECS = [
    _spec(),
    _spec(
        draDriver={"computeDomains": {"enabled": False}, "featureGates": {"MPSSupport": True}},
        dcgm={"enabled": True},
        dcgmExporter={"enabled": False},
    ),
    _spec(draDriver={"featureGates": {"PassthroughSupport": True}}),
    _spec(dcgmExporter={"serviceMonitor": {"enabled": True}}),
]


@pytest.mark.parametrize("spec", SPECS)
def test_every_rendered_kind_is_declared(spec: crd.GPUClusterSpec) -> None:
    declared = {(k.api_version, k.kind) for k in KINDS}
    assert {(o["apiVersion"], o["kind"]) for o in _objects(spec).values()} <= declared


def test_compute_domains_off_drops_controller_container_and_classes() -> None:
    objs = _objects(SPECS[1])
    assert "Deployment/nvidia-dra-driver-controller" not in objs
    assert "DeviceClass/compute-domain-daemon.nvidia.com" not in objs
    assert "DeviceClass/gpu.nvidia.com" in objs
    assert list(_plugin_containers(SPECS[1])) == ["gpus"]
    assert "Role/nvidia-dra-driver-kubeletplugin-mps" in objs
    assert "DaemonSet/nvidia-dcgm-dra" in objs
    assert "DaemonSet/nvidia-dcgm-exporter-dra" not in objs


def test_default_has_both_plugin_containers_and_no_standalone_dcgm() -> None:
    """As upstream: an absent dcgm or dcgmExporter section deploys neither; a present
    exporter section without `enabled` deploys it."""
    assert list(_plugin_containers(SPECS[0])) == ["gpus", "compute-domains"]
    objs = _objects(SPECS[0])
    assert "DaemonSet/nvidia-dcgm-dra" not in objs
    assert "DaemonSet/nvidia-dcgm-exporter-dra" not in objs
    assert "DaemonSet/nvidia-dcgm-exporter-dra" in _objects(_spec(dcgmExporter={}))


def test_exporter_reaches_standalone_dcgm_when_it_runs() -> None:
    spec = _spec(dcgm={"enabled": True}, dcgmExporter={})
    ds = _objects(spec)["DaemonSet/nvidia-dcgm-exporter-dra"]
    env = {
        e["name"]: e.get("value") for e in ds["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["DCGM_REMOTE_HOSTENGINE_INFO"] == "nvidia-dcgm-dra:5555"


def test_healthcheck_off_removes_probes_and_port() -> None:
    spec = _spec(draDriver={"gpus": {"kubeletPlugin": {"healthcheck": {"enabled": False}}}})
    gpus = _plugin_containers(spec)["gpus"]
    assert "startupProbe" not in gpus
    assert "livenessProbe" not in gpus
    assert {"name": "HEALTHCHECK_PORT", "value": "-1"} in gpus["env"]
    port = _spec(draDriver={"gpus": {"kubeletPlugin": {"healthcheck": {"port": 7000}}}})
    assert _plugin_containers(port)["gpus"]["livenessProbe"]["grpc"]["port"] == 7000


def test_feature_gates_sorted_and_passthrough_mounts() -> None:
    spec = _spec(draDriver={"featureGates": {"b": False, "a": True}})
    assert feature_gates(spec) == "a=true,b=false"
    mounts = {m["name"] for m in _plugin_containers(SPECS[2])["gpus"]["volumeMounts"]}
    assert {"lib-modules", "sysfs", "procfs"} <= mounts


def test_init_container_gets_the_larger_of_both_plugins_resources() -> None:
    a = ResourceRequirements.model_validate({"requests": {"cpu": "100m"}, "limits": {"cpu": 1}})
    b = ResourceRequirements.model_validate({"requests": {"cpu": "2", "memory": "1Gi"}})
    assert max_resources(a, b) == {
        "requests": {"cpu": "2", "memory": "1Gi"},
        "limits": {"cpu": "2"},
    }
    assert max_resources(None, None) is None


def test_claim_consumers_are_the_claiming_daemonsets() -> None:
    objs = _objects(_spec(dcgmExporter={}))
    daemonsets = [o for o in objs.values() if o["kind"] == "DaemonSet"]
    assert claim_consumers(daemonsets) == ["nvidia-dcgm-exporter-dra", "nvidia-dra-validator"]


def test_daemonsets_labels_and_tolerations_reach_pods_but_not_app() -> None:
    spec = _spec(
        daemonsets={
            "labels": {"team": "ml", "app": "x"},
            "tolerations": [{"key": "k", "operator": "Exists"}],
        }
    )
    ds = _objects(spec)["DaemonSet/nvidia-dra-validator"]
    pod = ds["spec"]["template"]
    assert pod["metadata"]["labels"]["team"] == "ml"
    assert pod["metadata"]["labels"]["app"] == "nvidia-operator-validator"
    assert pod["spec"]["tolerations"] == [{"key": "k", "operator": "Exists"}]


GPU = {"feature.node.kubernetes.io/pci-10de.present": "true"}


def test_node_labels_reach_a_fixed_point_and_sweep_the_device_plugin_stack() -> None:
    labels = {**GPU, "nvidia.com/gpu.deploy.device-plugin": "true"}
    labels = apply_label_changes(labels, gpucluster_label_changes(labels))
    assert gpucluster_label_changes(labels) == {}
    assert "nvidia.com/gpu.deploy.device-plugin" not in labels
    assert labels["nvidia.com/gpu.deploy.dra-driver"] == "true"
    assert labels["nvidia.com/gpu.present"] == "true"


def test_node_labels_leave_values_that_are_not_ours() -> None:
    labels = {**GPU, "nvidia.com/gpu.deploy.dra-driver": "false"}
    assert "nvidia.com/gpu.deploy.dra-driver" not in gpucluster_label_changes(labels)
    # NFD labels the node (its kernel) and found no NVIDIA device: the GPU left.
    gone = {
        "feature.node.kubernetes.io/kernel-version.full": "5.15",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.deploy.dra-driver": "true",
    }
    assert gpucluster_label_changes(gone) == {
        "nvidia.com/gpu.present": None,
        "nvidia.com/gpu.deploy.dra-driver": None,
    }


def test_exporter_service_monitor_as_upstream_dra_state_renders_it() -> None:
    settings = {
        "enabled": True,
        "interval": "15s",
        "scrapeTimeout": "10s",
        "additionalLabels": {"release": "prom"},
        "relabelings": [{"action": "replace", "sourceLabels": ["a"], "targetLabel": "b"}],
    }
    monitor = _objects(_spec(dcgmExporter={"serviceMonitor": settings}))[
        "ServiceMonitor/nvidia-dcgm-exporter-dra"
    ]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"] == {
        "name": "nvidia-dcgm-exporter-dra",
        "namespace": "gpu-operator",
        "labels": {
            "app": "nvidia-dcgm-exporter-dra",
            "release": "prom",
            "nvidia.com/gpu-operator.state": "state-dcgm-exporter",
        },
    }
    assert monitor["spec"] == {
        "jobLabel": "app",
        "namespaceSelector": {"matchNames": ["gpu-operator"]},
        "selector": {"matchLabels": {"app": "nvidia-dcgm-exporter-dra"}},
        "endpoints": [
            {
                "port": "gpu-metrics",
                "path": "/metrics",
                "honorLabels": False,
                "interval": "15s",
                "scrapeTimeout": "10s",
                "relabelings": settings["relabelings"],
            }
        ],
    }


@pytest.mark.parametrize(
    ("settings", "served"),
    [({"enabled": False}, True), ({"enabled": True}, False), (None, True)],
)
def test_no_exporter_service_monitor_unless_asked_and_served(
    settings: dict[str, Any] | None, served: bool
) -> None:
    exporter = {"serviceMonitor": settings} if settings else {}
    ctx = RenderContext(namespace="gpu-operator", operator_image="x", service_monitor_crd=served)
    objects = render(_spec(dcgmExporter=exporter), ctx)
    assert "ServiceMonitor" not in {o["kind"] for objs in objects.values() for o in objs}
