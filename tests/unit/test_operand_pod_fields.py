"""ClusterPolicy fields that shape operand pods act as upstream's transforms make them act:
the pod security context, `hostNetwork`, the kubelet's root directory, and the DCGM
exporter's pod attribution, job mapping and pod settings.

Expected values come from upstream v26.7 (NVIDIA/gpu-operator a22dbf6), each test
naming the file and function it follows."""

from __future__ import annotations

from typing import Any

import pytest

import components as c
import crd
from components import dcgm_exporter, nvidiadriver
from statemachine.driver_owner import OWNER_LABEL
from tests.unit.test_components_render import (
    ctx,
    daemonsets,
    env_of,
    everything,
    main_container,
    only_daemonset,
    pod,
    spec,
)


def _all_daemonsets(policy: crd.ClusterPolicySpec) -> dict[str, c.Manifest]:
    found = {}
    for comp in c.COMPONENTS:
        for ds in daemonsets(comp.objects(policy, ctx())):
            found[ds["metadata"]["name"]] = ds
    return found


def _everything_with(**sections: dict[str, Any]) -> crd.ClusterPolicySpec:
    data = everything().model_dump(by_alias=True, exclude_none=True)
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values}
    return crd.ClusterPolicySpec.model_validate(data)


# ------------------------------------------------------------- pod security context
def test_pod_security_context_is_set_on_every_operand_daemonset() -> None:
    """Upstream: controllers/object_controls.go applyCommonDaemonsetConfig sets
    `daemonsets.podSecurityContext` as the pod's securityContext of every DaemonSet."""
    context = {"runAsUser": 0, "fsGroup": 2000, "seccompProfile": {"type": "RuntimeDefault"}}
    policy = _everything_with(daemonsets={"podSecurityContext": context})
    found = _all_daemonsets(policy)
    assert len(found) >= 9
    for name, ds in found.items():
        assert pod(ds)["securityContext"] == context, name


def test_no_pod_security_context_by_default() -> None:
    """An empty context asks for nothing (upstream's chart writes none)."""
    for policy in (everything(), _everything_with(daemonsets={"podSecurityContext": {}})):
        for name, ds in _all_daemonsets(policy).items():
            assert "securityContext" not in pod(ds), name


# ------------------------------------------------------------------- hostNetwork
HOST_NETWORK_SECTIONS = {
    "driver": ["nvidia-driver-daemonset"],
    "toolkit": ["nvidia-container-toolkit-daemonset"],
    # TransformMPSControlDaemon reads DevicePlugin.HostNetwork too.
    "devicePlugin": ["nvidia-device-plugin-daemonset", "nvidia-device-plugin-mps-control-daemon"],
    "dcgm": ["nvidia-dcgm"],
    "dcgmExporter": ["nvidia-dcgm-exporter"],
    "gfd": ["gpu-feature-discovery"],
    "migManager": ["nvidia-mig-manager"],
    "nodeStatusExporter": ["nvidia-node-status-exporter"],
    # TransformSandboxValidator reads Validator.HostNetwork too.
    "validator": ["nvidia-operator-validator", "nvidia-sandbox-validator"],
    "vgpuManager": ["nvidia-vgpu-manager-daemonset"],
    "vgpuDeviceManager": ["nvidia-vgpu-device-manager"],
    "vfioManager": ["nvidia-vfio-manager"],
    "sandboxDevicePlugin": ["nvidia-sandbox-device-plugin-daemonset"],
}


@pytest.mark.parametrize(("section", "names"), HOST_NETWORK_SECTIONS.items())
def test_host_network_moves_only_its_operands_pods(section: str, names: list[str]) -> None:
    """Upstream: controllers/object_controls.go applyHostNetworkConfig (hostNetwork and
    dnsPolicy ClusterFirstWithHostNet), called by TransformDriver, TransformToolkit,
    TransformDevicePlugin, TransformMPSControlDaemon (with devicePlugin's setting),
    TransformGPUDiscoveryPlugin, TransformDCGM, TransformMIGManager, TransformValidator
    and TransformNodeStatusExporter; TransformDCGMExporter sets the same two fields."""
    found = _all_daemonsets(_everything_with(**{section: {"hostNetwork": True}}))
    assert set(names) <= set(found)
    for name, ds in found.items():
        if name in names:
            assert pod(ds)["hostNetwork"] is True, name
            assert pod(ds)["dnsPolicy"] == "ClusterFirstWithHostNet", name
        else:
            assert "hostNetwork" not in pod(ds), name
            assert "dnsPolicy" not in pod(ds), name


def test_host_network_false_changes_nothing() -> None:
    policy = _everything_with(**{s: {"hostNetwork": False} for s in HOST_NETWORK_SECTIONS})
    for name, ds in _all_daemonsets(policy).items():
        assert not {"hostNetwork", "dnsPolicy"} & set(pod(ds)), name


def _nvd_daemonset(nvd: dict[str, Any], base: crd.ClusterPolicySpec | None = None) -> c.Manifest:
    labels = {
        "nvidia.com/gpu.present": "true",
        OWNER_LABEL: "d",
        "feature.node.kubernetes.io/system-os_release.ID": "ubuntu",
        "feature.node.kubernetes.io/system-os_release.VERSION_ID": "22.04",
        "feature.node.kubernetes.io/kernel-version.full": "5.15.0-124-generic",
    }
    node = {"metadata": {"name": "n", "labels": labels}, "spec": {}, "status": {}}
    model = crd.NVIDIADriverSpec.model_validate(nvd)
    policy = base or crd.ClusterPolicySpec()
    (ds,) = nvidiadriver.render("d", "uid-1", model, [node], policy, ctx())
    return ds


def test_nvidiadriver_host_network_sets_the_dns_policy_too() -> None:
    """Upstream: manifests/state-driver/0500_daemonset.yaml writes `hostNetwork: true`
    with `dnsPolicy: ClusterFirstWithHostNet` when the NVIDIADriver asks for it."""
    ds = _nvd_daemonset({"hostNetwork": True})
    assert pod(ds)["hostNetwork"] is True
    assert pod(ds)["dnsPolicy"] == "ClusterFirstWithHostNet"


def test_nvidiadriver_takes_its_pod_security_context_from_itself_only() -> None:
    """Upstream: manifests/state-driver/0500_daemonset.yaml reads only
    `.Driver.Spec.PodSecurityContext`, never the ClusterPolicy's daemonsets section."""
    base = spec(daemonsets={"podSecurityContext": {"fsGroup": 1}})
    assert "securityContext" not in pod(_nvd_daemonset({}, base))
    own = _nvd_daemonset({"podSecurityContext": {"runAsUser": 0}}, base)
    assert pod(own)["securityContext"] == {"runAsUser": 0}


# --------------------------------------------------------------- kubeletRootDir
def _volume(ds: c.Manifest, name: str) -> dict[str, Any]:
    return next(v for v in pod(ds)["volumes"] if v["name"] == name)


def _mount(ds: c.Manifest, name: str) -> dict[str, Any]:
    return next(m for m in main_container(ds)["volumeMounts"] if m["name"] == name)


def test_kubelet_root_dir_moves_the_exporters_pod_resources() -> None:
    """Upstream: controllers/object_controls.go TransformDCGMExporter points the
    `pod-gpu-resources` hostPath at `<kubeletRootDir>/pod-resources`; the container
    keeps mounting it at /var/lib/kubelet/pod-resources."""
    policy = spec(hostPaths={"kubeletRootDir": "/data/kubelet"})
    ds = only_daemonset(dcgm_exporter.NAME, policy)
    assert _volume(ds, "pod-gpu-resources")["hostPath"]["path"] == "/data/kubelet/pod-resources"
    assert _mount(ds, "pod-gpu-resources")["mountPath"] == "/var/lib/kubelet/pod-resources"
    default = only_daemonset(dcgm_exporter.NAME, spec())
    assert (
        _volume(default, "pod-gpu-resources")["hostPath"]["path"]
        == "/var/lib/kubelet/pod-resources"
    )


def test_kubelet_root_dir_moves_the_device_plugins_socket_directory() -> None:
    """Upstream's transforms leave the device plugin's /var/lib/kubelet/device-plugins
    hostPath alone (assets/state-device-plugin/0500_daemonset.yaml), so a kubelet rooted
    elsewhere never sees its socket; here its host side follows `kubeletRootDir` the
    way upstream moves the exporter's, and the container path stays the plugin's own."""
    policy = spec(hostPaths={"kubeletRootDir": "/data/kubelet/"})
    ds = only_daemonset("device-plugin", policy)
    assert _volume(ds, "device-plugin")["hostPath"]["path"] == "/data/kubelet/device-plugins"
    assert _mount(ds, "device-plugin")["mountPath"] == "/var/lib/kubelet/device-plugins"


def test_no_operand_mounts_the_default_kubelet_root_when_moved() -> None:
    policy = _everything_with(hostPaths={"kubeletRootDir": "/data/kubelet"})
    for name, ds in _all_daemonsets(policy).items():
        paths = [v["hostPath"]["path"] for v in pod(ds)["volumes"] if "hostPath" in v]
        assert not [p for p in paths if p.startswith("/var/lib/kubelet")], name


# ----------------------------------------------------------------- DCGM exporter
def _exporter(**fields: Any) -> list[c.Manifest]:
    return c.component_by_name(dcgm_exporter.NAME).objects(spec(dcgmExporter=fields), ctx())


def _exporter_ds(**fields: Any) -> c.Manifest:
    (ds,) = daemonsets(_exporter(**fields))
    return ds


def test_pod_labels_and_uid_env_and_the_token() -> None:
    """Upstream: controllers/object_controls.go TransformDCGMExporter sets
    DCGM_EXPORTER_KUBERNETES_ENABLE_POD_LABELS / _ENABLE_POD_UID to "true", the
    allowlist joined by commas in DCGM_EXPORTER_KUBERNETES_POD_LABEL_ALLOWLIST_REGEX,
    and automountServiceAccountToken true once pod metadata is read from the API."""
    ds = _exporter_ds(
        enablePodLabels=True, enablePodUID=True, podLabelAllowlistRegex=["^app$", "^team"]
    )
    variables = env_of(main_container(ds))
    assert variables["DCGM_EXPORTER_KUBERNETES_ENABLE_POD_LABELS"] == "true"
    assert variables["DCGM_EXPORTER_KUBERNETES_ENABLE_POD_UID"] == "true"
    assert variables["DCGM_EXPORTER_KUBERNETES_POD_LABEL_ALLOWLIST_REGEX"] == "^app$,^team"
    assert pod(ds)["automountServiceAccountToken"] is True


def test_defaults_read_no_pods_and_mount_no_token() -> None:
    objects = _exporter()
    (ds,) = daemonsets(objects)
    assert pod(ds)["automountServiceAccountToken"] is False
    assert not [o for o in objects if o["kind"].startswith("Cluster")]
    names = set(env_of(main_container(ds)))
    assert not {n for n in names if "POD" in n or "HPC" in n}


@pytest.mark.parametrize(
    "fields",
    [
        {"enablePodLabels": True},
        {"enablePodUID": True},
        {"env": [{"name": "DCGM_EXPORTER_KUBERNETES_ENABLE_POD_UID", "value": "TRUE"}]},
    ],
    ids=["labels", "uid", "uid-by-env"],
)
def test_pod_attribution_grants_reading_pods_cluster_wide(fields: dict[str, Any]) -> None:
    """Upstream: assets/state-dcgm-exporter/0210_clusterrole.yaml and
    0310_clusterrolebinding.yaml (`nvidia-dcgm-exporter-read-pods`: pods get, list,
    watch, bound to the exporter's account), gated by object_controls.go `rbacGates`
    on the policy's switches or the same env vars set to true."""
    objects = _exporter(**fields)
    role = next(o for o in objects if o["kind"] == "ClusterRole")
    binding = next(o for o in objects if o["kind"] == "ClusterRoleBinding")
    assert role["metadata"]["name"] == "nvidia-dcgm-exporter-read-pods"
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    ]
    assert binding["metadata"]["name"] == "nvidia-dcgm-exporter-read-pods"
    assert binding["roleRef"]["name"] == "nvidia-dcgm-exporter-read-pods"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "nvidia-dcgm-exporter", "namespace": ctx().namespace}
    ]


def test_an_allowlist_alone_grants_nothing() -> None:
    """Upstream's gate is pod labels or UID only; the allowlist env is still set."""
    objects = _exporter(podLabelAllowlistRegex=["^app$"])
    assert not [o for o in objects if o["kind"] == "ClusterRole"]
    (ds,) = daemonsets(objects)
    assert env_of(main_container(ds))["DCGM_EXPORTER_KUBERNETES_POD_LABEL_ALLOWLIST_REGEX"]
    assert pod(ds)["automountServiceAccountToken"] is False


def test_a_metrics_config_map_read_through_the_api_needs_the_token() -> None:
    """Upstream: object_controls.go dcgmExporterEnvRequiresAPIAccess: a
    DCGM_EXPORTER_CONFIGMAP_DATA other than "" or "none" reads the API."""
    read = _exporter_ds(env=[{"name": "DCGM_EXPORTER_CONFIGMAP_DATA", "value": "ns:metrics"}])
    assert pod(read)["automountServiceAccountToken"] is True
    none = _exporter_ds(env=[{"name": "DCGM_EXPORTER_CONFIGMAP_DATA", "value": "none"}])
    assert pod(none)["automountServiceAccountToken"] is False


@pytest.mark.parametrize(
    ("mapping", "directory"),
    [
        ({"enabled": True}, "/var/lib/dcgm-exporter/job-mapping"),
        ({"enabled": True, "directory": "/var/run/slurm/jobs"}, "/var/run/slurm/jobs"),
    ],
    ids=["default-directory", "own-directory"],
)
def test_hpc_job_mapping_env_and_host_directory(mapping: dict[str, Any], directory: str) -> None:
    """Upstream: object_controls.go TransformDCGMExporter sets DCGM_HPC_JOB_MAPPING_DIR,
    mounts volume `hpc-job-mapping` read-only at that path from the same host path
    (DirectoryOrCreate); api/nvidia/v1/clusterpolicy_types.go DefaultDCGMJobMappingDir
    when no directory is given."""
    ds = _exporter_ds(hpcJobMapping=mapping)
    assert env_of(main_container(ds))["DCGM_HPC_JOB_MAPPING_DIR"] == directory
    assert _mount(ds, "hpc-job-mapping") == {
        "name": "hpc-job-mapping",
        "mountPath": directory,
        "readOnly": True,
    }
    assert _volume(ds, "hpc-job-mapping") == {
        "name": "hpc-job-mapping",
        "hostPath": {"path": directory, "type": "DirectoryOrCreate"},
    }
    off = _exporter_ds(hpcJobMapping={"enabled": False, "directory": directory})
    assert "DCGM_HPC_JOB_MAPPING_DIR" not in env_of(main_container(off))


def test_host_pid_and_pod_annotations() -> None:
    """Upstream: object_controls.go TransformDCGMExporter sets hostPID when asked and
    merges `dcgmExporter.annotations` into the pod template's annotations
    (addExtraAnnotations), after the policy's pod-wide ones."""
    policy = spec(
        daemonsets={"annotations": {"team": "gpu", "shared": "daemonsets"}},
        dcgmExporter={"hostPID": True, "annotations": {"shared": "exporter", "x": "y"}},
    )
    ds = only_daemonset(dcgm_exporter.NAME, policy)
    assert pod(ds)["hostPID"] is True
    assert ds["spec"]["template"]["metadata"]["annotations"] == {
        "team": "gpu",
        "shared": "exporter",
        "x": "y",
    }
    assert "x" not in (ds["metadata"].get("annotations") or {})
    assert "hostPID" not in pod(only_daemonset(dcgm_exporter.NAME, spec()))


def test_the_exporters_settings_touch_no_other_operand() -> None:
    fields = {
        "hostPID": True,
        "annotations": {"a": "b"},
        "enablePodLabels": True,
        "hpcJobMapping": {"enabled": True},
    }
    before = _all_daemonsets(everything())
    after = _all_daemonsets(_everything_with(dcgmExporter=fields))
    changed = {n for n in before if before[n] != after[n]}
    assert changed == {"nvidia-dcgm-exporter"}


# ------------------------------------------------------------------ NRI plugin
NRI = {"cdi": {"enabled": True, "nriPluginEnabled": True}}
MANAGEMENT = "management.nvidia.com/gpu=all"


def _toolkit(policy: crd.ClusterPolicySpec) -> c.Manifest:
    return only_daemonset("container-toolkit", policy)


def test_nri_plugin_toolkit_env_and_socket_instead_of_runtime_config() -> None:
    """Upstream: controllers/object_controls.go transformToolkitCtrForCDI sets
    ENABLE_NRI_PLUGIN=true; transformForRuntime then skips the runtime's config and
    socket mounts (and CONTAINERD_RUNTIME_CLASS) and transformNRISocketMounts sets
    NRI_SOCKET=/runtime/nri-sock-dir/nri.sock with volume `nri-socket` from
    /var/run/nri (DirectoryOrCreate) mounted at /runtime/nri-sock-dir/."""
    ds = _toolkit(spec(**NRI))
    variables = env_of(main_container(ds))
    assert variables["ENABLE_NRI_PLUGIN"] == "true"
    assert variables["NRI_SOCKET"] == "/runtime/nri-sock-dir/nri.sock"
    assert variables["RUNTIME"] == "containerd"
    assert "CONTAINERD_RUNTIME_CLASS" not in variables
    assert not {n for n in variables if n.startswith(("RUNTIME_", "CONTAINERD_"))}
    assert _mount(ds, "nri-socket") == {"name": "nri-socket", "mountPath": "/runtime/nri-sock-dir/"}
    assert _volume(ds, "nri-socket") == {
        "name": "nri-socket",
        "hostPath": {"path": "/var/run/nri", "type": "DirectoryOrCreate"},
    }
    names = {v["name"] for v in pod(ds)["volumes"]}
    assert not {n for n in names if n.startswith("containerd-")}
    plain = env_of(main_container(_toolkit(spec())))
    assert "ENABLE_NRI_PLUGIN" not in plain
    assert "NRI_SOCKET" not in plain


def test_nri_socket_set_in_toolkit_env_moves_the_mount() -> None:
    """Upstream: transformNRISocketMounts reads NRI_SOCKET from the container's env
    (toolkit.env) for the host directory and rewrites it to the path inside."""
    policy = spec(**NRI, toolkit={"env": [{"name": "NRI_SOCKET", "value": "/run/k3s/nri.sock"}]})
    ds = _toolkit(policy)
    assert env_of(main_container(ds))["NRI_SOCKET"] == "/runtime/nri-sock-dir/nri.sock"
    assert _volume(ds, "nri-socket")["hostPath"]["path"] == "/run/k3s"


NRI_OPERANDS = {
    "nvidia-device-plugin-daemonset": "nvidia-device-plugin",
    "nvidia-device-plugin-mps-control-daemon": "mps-control-daemon-ctr",
    "gpu-feature-discovery": "gpu-feature-discovery",
    "nvidia-dcgm": "nvidia-dcgm-ctr",
    "nvidia-dcgm-exporter": "nvidia-dcgm-exporter",
    "nvidia-mig-manager": "nvidia-mig-manager",
    "nvidia-operator-validator": "toolkit-validation",
}


def test_nri_operands_get_the_management_device_instead_of_a_runtime_class() -> None:
    """Upstream: object_controls.go setRuntimeClassName leaves runtimeClassName unset
    with the NRI plugin, and setNRIPluginAnnotation annotates the pod template with
    `nvidia.cdi.k8s.io/container.<container>: management.nvidia.com/gpu=all`
    (TransformDevicePlugin, TransformMPSControlDaemon, TransformGPUDiscoveryPlugin,
    TransformDCGM, TransformDCGMExporter, TransformMIGManager, and TransformValidator for
    its toolkit-validation init container, as ours)."""
    found = _all_daemonsets(_everything_with(**NRI))
    for name, container_name in NRI_OPERANDS.items():
        ds = found[name]
        assert "runtimeClassName" not in pod(ds), name
        annotations = ds["spec"]["template"]["metadata"]["annotations"]
        assert annotations[f"nvidia.cdi.k8s.io/container.{container_name}"] == MANAGEMENT
    plain = _all_daemonsets(everything())
    for name in NRI_OPERANDS:
        assert pod(plain[name])["runtimeClassName"] == "nvidia", name
        annotations = plain[name]["spec"]["template"]["metadata"].get("annotations", {})
        assert not [k for k in annotations if k.startswith("nvidia.cdi.k8s.io/")], name


def test_nri_validator_workloads_ask_for_no_runtime_class() -> None:
    """Upstream: TransformValidatorComponent passes VALIDATOR_RUNTIME_CLASS only from the
    validator pod's own runtime class, which the NRI plugin leaves unset."""
    command = main_container(only_daemonset("operator-validation", spec(**NRI)))["command"]
    assert command[command.index("--runtime-class") + 1] == ""
    plain = main_container(only_daemonset("operator-validation", spec()))["command"]
    assert plain[plain.index("--runtime-class") + 1] == "nvidia"


def test_nri_plugin_drops_the_runtime_classes() -> None:
    """Upstream: controllers/state_manager.go isStateEnabled turns `pre-requisites` (the
    RuntimeClasses) off with the NRI plugin, so they are deleted."""
    prerequisites = c.component_by_name("pre-requisites")
    assert prerequisites.objects(spec(**NRI), ctx()) == []
    assert prerequisites.objects(spec(), ctx())
    assert "pre-requisites" not in c.registry.enabled_components(spec(**NRI))
