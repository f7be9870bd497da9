"""An NVIDIADriver of `driverType: vgpu-host-manager` renders the vGPU manager's pod.

Facts from NVIDIA's operator v26.7 (the mirror's HEAD): upstream renders every driver
type from one template, `manifests/state-driver/0500_daemonset.yaml`, which for
`vgpu-host-manager` labels the DaemonSet and its pods `app.kubernetes.io/component:
nvidia-vgpu-host-manager`, selects `nvidia.com/gpu.deploy.vgpu-manager: "true"`, sets
`terminationGracePeriodSeconds: 120`, mounts `cgroup` (`/sys/fs/cgroup`) and `vfio`
(`/dev/vfio`) host paths (no type) right after `host-os-release`, and leaves out the
driver container's `startupProbe` and `lifecycle` preStop hook. The image is the
resource's (`api/nvidia/v1alpha1/nvidiadriver_types.go`, `GetImagePath`: repository,
image and version, `-<os tag>` appended), the DaemonSet is named by
`internal/state/driver.go`, `getDriverAppName` (`nvidia-vgpu-host-manager-driver-<os>-<hash>`)
and its `openshift.io/scc` annotation by `getDriverName` (`nvidia-vgpu-manager-<cr>-<os>`).
Upstream's golden render `internal/state/testdata/golden/driver-vgpu-host-manager.yaml`
lists the mounts and volumes checked below.
"""

from __future__ import annotations

from typing import Any

import crd
from components import RenderContext
from components.context import NodeFacts
from components.nvidiadriver import OWNER_LABEL, app_name, render

UBUNTU = NodeFacts(os_id="ubuntu", os_version="22.04", kernel="5.15.0-124-generic")
CTX = RenderContext(namespace="gpu-operator", operator_image="gpuop:1", gpu_nodes=(UBUNTU,))

# upstream's golden render, in its order
GOLDEN_MOUNTS = [
    ("run-nvidia", "/run/nvidia"),
    ("run-nvidia-fabricmanager", "/run/nvidia-fabricmanager"),
    ("run-nvidia-topologyd", "/run/nvidia-topologyd"),
    ("var-log", "/var/log"),
    ("dev-log", "/dev/log"),
    ("host-os-release", "/host-etc/os-release"),
    ("cgroup", "/sys/fs/cgroup"),
    ("vfio", "/dev/vfio"),
    ("mlnx-ofed-usr-src", "/run/mellanox/drivers/usr/src"),
    ("run-mellanox-drivers", "/run/mellanox/drivers"),
    ("firmware-search-path", "/sys/module/firmware_class/parameters/path"),
    ("host-sys-devices-system", "/sys/devices/system"),
    ("nv-firmware", "/lib/firmware"),
    ("driver-startup-probe-script", "/usr/local/bin/startup-probe.sh"),
]
GOLDEN_VOLUMES = [
    "run-nvidia",
    "var-log",
    "dev-log",
    "host-os-release",
    "cgroup",
    "vfio",
    "run-nvidia-fabricmanager",
    "run-nvidia-topologyd",
    "mlnx-ofed-usr-src",
    "run-mellanox-drivers",
    "run-nvidia-validations",
    "host-root",
    "host-sys",
    "firmware-search-path",
    "host-sys-devices-system",
    "nv-firmware",
    "driver-startup-probe-script",
]


def _node(name: str, owner: str) -> dict[str, Any]:
    labels = {
        "nvidia.com/gpu.present": "true",
        OWNER_LABEL: owner,
        "feature.node.kubernetes.io/system-os_release.ID": "ubuntu",
        "feature.node.kubernetes.io/system-os_release.VERSION_ID": "22.04",
        "feature.node.kubernetes.io/kernel-version.full": "5.15.0-124-generic",
    }
    return {"metadata": {"name": name, "labels": labels}}


def _render(driver_type: str, **extra: Any) -> dict[str, Any]:
    spec = crd.NVIDIADriverSpec.model_validate(
        {
            "driverType": driver_type,
            "repository": "nvcr.io/nvidia",
            "image": "vgpu-manager",
            "version": "525.85.03",
            **extra,
        }
    )
    (ds,) = render("vgpu", "uid-1", spec, [_node("a", "vgpu")], crd.ClusterPolicySpec(), CTX)
    return ds


def _driver(ds: dict[str, Any]) -> dict[str, Any]:
    pod = ds["spec"]["template"]["spec"]
    return next(c for c in pod["containers"] if c["name"] == "nvidia-driver-ctr")


def test_the_vgpu_manager_daemonset_is_named_labelled_and_placed_as_upstreams() -> None:
    ds = _render("vgpu-host-manager")
    name = app_name("vgpu-host-manager", "ubuntu22.04", "uid-1")
    assert name.startswith("nvidia-vgpu-host-manager-driver-ubuntu22.04-")
    assert ds["metadata"]["name"] == name
    assert ds["spec"]["selector"]["matchLabels"] == {"app": name}
    assert ds["metadata"]["annotations"]["openshift.io/scc"] == (
        "nvidia-vgpu-manager-vgpu-ubuntu22.04"
    )
    template = ds["spec"]["template"]
    for labels in (ds["metadata"]["labels"], template["metadata"]["labels"]):
        assert labels["app.kubernetes.io/component"] == "nvidia-vgpu-host-manager"
        assert labels["nvidia.com/node.os-version"] == "ubuntu22.04"
        assert labels["nvidia.com/precompiled"] == "false"
    pod = template["spec"]
    assert pod["nodeSelector"]["nvidia.com/gpu.deploy.vgpu-manager"] == "true"
    assert "nvidia.com/gpu.deploy.driver" not in pod["nodeSelector"]
    assert pod["terminationGracePeriodSeconds"] == 120
    assert ds["spec"]["updateStrategy"] == {"type": "OnDelete"}
    assert template["metadata"]["annotations"]["kubectl.kubernetes.io/default-container"] == (
        "nvidia-driver-ctr"
    )
    anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["labelSelector"]["matchExpressions"][0]["values"] == [
        "nvidia-driver",
        "nvidia-vgpu-manager",
    ]


def test_the_vgpu_manager_container_is_upstreams() -> None:
    ds = _render("vgpu-host-manager")
    main = _driver(ds)
    assert main["image"] == "nvcr.io/nvidia/vgpu-manager:525.85.03-ubuntu22.04"
    assert main["command"] == ["nvidia-driver"]
    assert main["args"] == ["init"]
    assert main["securityContext"]["privileged"] is True
    env = {v["name"]: v for v in main["env"]}
    assert main["env"][0] == {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}
    assert {"NODE_NAME", "NODE_IP", "DRIVER_CONFIG_DIGEST"} <= set(env)
    assert env["DRIVER_CONFIG_DIGEST"]["value"]
    assert "startupProbe" not in main
    assert "lifecycle" not in main
    assert [(m["name"], m["mountPath"]) for m in main["volumeMounts"]] == [
        *GOLDEN_MOUNTS[:10],
        # ours lists these two the other way round for every driver type; the
        # conformance comparison matches list items by name
        GOLDEN_MOUNTS[11],
        GOLDEN_MOUNTS[10],
        *GOLDEN_MOUNTS[12:],
    ]
    pod = ds["spec"]["template"]["spec"]
    assert [v["name"] for v in pod["volumes"]] == GOLDEN_VOLUMES
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["cgroup"] == {"name": "cgroup", "hostPath": {"path": "/sys/fs/cgroup"}}
    assert volumes["vfio"] == {"name": "vfio", "hostPath": {"path": "/dev/vfio"}}
    (manager,) = pod["initContainers"]
    assert manager["name"] == "k8s-driver-manager"
    assert manager["args"] == ["uninstall_driver"]


def test_the_vgpu_manager_digest_records_its_driver_type() -> None:
    """`buildDriverInstallConfig` records `DriverType`: a vGPU manager and a data-centre
    driver of the same image never share a digest."""
    vgpu = _driver(_render("vgpu-host-manager"))
    gpu = _driver(_render("gpu"))
    vgpu_digest = next(v["value"] for v in vgpu["env"] if v["name"] == "DRIVER_CONFIG_DIGEST")
    gpu_digest = next(v["value"] for v in gpu["env"] if v["name"] == "DRIVER_CONFIG_DIGEST")
    assert vgpu_digest != gpu_digest


def test_a_data_centre_driver_keeps_the_driver_pod() -> None:
    ds = _render("gpu")
    main = _driver(ds)
    pod = ds["spec"]["template"]["spec"]
    assert "startupProbe" in main
    assert "lifecycle" in main
    assert "terminationGracePeriodSeconds" not in pod
    assert not {"cgroup", "vfio"} & {v["name"] for v in pod["volumes"]}
    assert pod["nodeSelector"]["nvidia.com/gpu.deploy.driver"] == "true"
    assert ds["metadata"]["labels"]["app.kubernetes.io/component"] == "nvidia-driver"


def test_the_vgpu_manager_has_no_readiness_probe_on_the_driver_ready_file() -> None:
    """Ours probes readiness with the driver-ready file the startup probe writes, which a
    vGPU manager pod (no startup probe, as upstream) never gets; upstream's template has
    no readiness probe for any driver type."""
    ds = _render("vgpu-host-manager", readinessProbe={"periodSeconds": 5})
    assert "readinessProbe" not in _driver(ds)
    assert "readinessProbe" in _driver(_render("gpu", readinessProbe={"periodSeconds": 5}))
