"""DRIVER_CONFIG_DIGEST of NVIDIADriver DaemonSets: taken from the resource, as upstream
takes it (`internal/state/driver.go`, `buildDriverInstallConfig`), not from the pod.

The recording `tests/conformance/upstream/nvidiadriver-pools/` holds the values NVIDIA's
operator wrote for two resources; ours must be equal, so a node it set up keeps its
driver when gpuop takes over.
"""

from __future__ import annotations

from typing import Any

import pytest

import crd
from components import RenderContext, driver, driver_digest, nvidiadriver
from tests.conformance._diff import (
    conformance_dir,
    load_node_labels,
    load_nvidiadrivers,
    load_policy,
    ours,
    upstream,
)

FOLDER = conformance_dir() / "nvidiadriver-pools"
RECORDED = {"inference-pinned": "2694439062", "training": "3643376969"}
"""What upstream wrote into both driver DaemonSets of the recording."""

OS_ID = "feature.node.kubernetes.io/system-os_release.ID"
OS_VERSION = "feature.node.kubernetes.io/system-os_release.VERSION_ID"
KERNEL = "feature.node.kubernetes.io/kernel-version.full"
KERNEL_VERSION = "5.15.0-124-generic"
CONFIG_MAPS: dict[str, tuple[str, ...]] = {
    "kmc": ("nvidia.conf",),
    "repos": ("custom.list",),
    "certs": ("ca.crt",),
}


def _digests(ds: dict[str, Any]) -> dict[str, str]:
    """Container name -> its DRIVER_CONFIG_DIGEST, over init and regular containers."""
    pod = ds["spec"]["template"]["spec"]
    return {
        c["name"]: str(v["value"])
        for c in [*pod.get("initContainers", []), *pod["containers"]]
        for v in c.get("env", [])
        if v["name"] == driver.CONFIG_DIGEST_ENV
    }


def _owner(ds: dict[str, Any]) -> str | None:
    refs = ds["metadata"].get("ownerReferences") or ()
    return next((r["name"] for r in refs if r["kind"] == crd.NVD_KIND), None)


def _by_owner(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        owner: o for o in objects if o["kind"] == "DaemonSet" and (owner := _owner(o)) is not None
    }


def _resources() -> dict[str, crd.NVIDIADriver]:
    return {d.name: d for d in load_nvidiadrivers(FOLDER)}


def test_the_recording_holds_the_values_reproduced_here() -> None:
    recorded = _by_owner(upstream(FOLDER)[0])
    assert {name: set(_digests(ds).values()) for name, ds in recorded.items()} == {
        name: {value} for name, value in RECORDED.items()
    }
    for ds in recorded.values():
        assert set(_digests(ds)) == {driver.CONTAINER_NAME, "k8s-driver-manager"}


@pytest.mark.parametrize("name", list(RECORDED))
def test_the_resource_with_upstreams_images_gives_the_recorded_value(name: str) -> None:
    """The algorithm alone: the resource, the images upstream's pod runs and the
    ClusterPolicy's host root hash to what upstream wrote."""
    pod = _by_owner(upstream(FOLDER)[0])[name]["spec"]["template"]["spec"]
    policy, _ = load_policy(FOLDER)
    spec = _resources()[name].spec
    value = driver_digest.resource_digest(spec, pod, host_root=policy.host_paths.root_fs)
    assert value == RECORDED[name]
    # ... which is the upstream pod's images, the resource's driver and module types
    # and the host root: every other field of the record is empty for these resources
    (manager,) = pod["initContainers"]
    (ctr,) = pod["containers"]
    record = {
        "DriverImage": ctr["image"],
        "DriverManagerImage": manager["image"],
        "DriverType": "gpu",
        "KernelModuleType": "auto",
        "HostRoot": "/",
    }
    assert driver_digest.state_digest(record) == RECORDED[name]
    assert driver_digest.digest(pod) != RECORDED[name], "the pod-based digest is another one"


@pytest.mark.parametrize("name", list(RECORDED))
def test_our_daemonsets_carry_upstreams_value(name: str) -> None:
    policy, _ = load_policy(FOLDER)
    objects = ours(policy, load_node_labels(FOLDER), load_nvidiadrivers(FOLDER)).objects
    ds = _by_owner(objects)[name]
    assert _digests(ds) == {
        driver.CONTAINER_NAME: RECORDED[name],
        "k8s-driver-manager": RECORDED[name],
    }


def test_the_clusterpolicy_driver_keeps_its_pod_based_digest() -> None:
    policy, _ = load_policy(conformance_dir() / "default")
    (ds,) = [
        o
        for o in ours(policy).objects
        if o["kind"] == "DaemonSet" and o["metadata"]["name"] == driver.DAEMONSET_NAME
    ]
    pod = ds["spec"]["template"]["spec"]
    assert set(_digests(ds).values()) == {driver_digest.digest(pod)}


# ------------------------------------------------------------ what counts, what does not
def _base_spec() -> dict[str, Any]:
    spec = _resources()["training"].spec.model_dump(by_alias=True, exclude_none=True)
    spec.pop("nodeSelector", None)
    return spec


def _render(
    change: dict[str, Any],
    base_change: dict[str, Any] | None = None,
    config_maps: dict[str, tuple[str, ...]] = CONFIG_MAPS,
) -> dict[str, Any]:
    """The one driver DaemonSet of the training resource, changed by ``change``, over an
    Ubuntu 22.04 node it owns, under the scenario's ClusterPolicy (``base_change``d),
    with ConfigMaps of these keys."""
    labels = {
        "nvidia.com/gpu.present": "true",
        crd.OWNER_LABEL: "training",
        OS_ID: "ubuntu",
        OS_VERSION: "22.04",
        KERNEL: KERNEL_VERSION,
    }
    node = {"metadata": {"name": "n", "labels": labels}, "spec": {}, "status": {}}
    model = crd.NVIDIADriverSpec.model_validate({**_base_spec(), **change})
    policy, _ = load_policy(FOLDER)
    if base_change:
        policy = policy.model_validate(
            {**policy.model_dump(by_alias=True, exclude_none=True), **base_change}
        )
    ctx = RenderContext(
        namespace="gpu-operator", operator_image="gpuop:test", config_map_keys=config_maps
    )
    (ds,) = nvidiadriver.render("training", "uid-1", model, [node], policy, ctx)
    return ds


def _digest(change: dict[str, Any], base_change: dict[str, Any] | None = None) -> str:
    (value,) = set(_digests(_render(change, base_change)).values())
    return value


def test_the_unchanged_resource_renders_the_recorded_value() -> None:
    assert _digest({}) == RECORDED["training"]


SIDECAR_IMAGE = {"repository": "nvcr.io/nvidia/cloud-native", "version": "2.29.4"}
COUNTS: dict[str, dict[str, Any]] = {
    "version": {"version": "595.58.03"},
    "repository": {"repository": "registry.example.com/nvidia"},
    "manager image": {
        "manager": {
            "repository": "registry.example.com/nvidia",
            "image": "k8s-driver-manager",
            "version": "v0.13.0",
        }
    },
    "driver type": {"driverType": "vgpu"},
    "kernel module type": {"kernelModuleType": "open"},
    "deprecated open modules flag": {"useOpenKernelModules": True},
    "args": {"args": ["--debug"]},
    "secret env": {"secretEnv": "driver-proxy"},
    "env": {"env": [{"name": "NVIDIA_DRIVER_FOO", "value": "1"}]},
    "manager env": {"manager": {"env": [{"name": "ENABLE_GPU_POD_EVICTION", "value": "false"}]}},
    "rdma": {"rdma": {"enabled": True}},
    "licensing secret": {"licensingConfig": {"secretName": "licence", "nlsEnabled": True}},
    "licensing config map": {"licensingConfig": {"name": "licence"}},
    "licensing without NLS": {"licensingConfig": {"secretName": "licence", "nlsEnabled": False}},
    "virtual topology": {"virtualTopologyConfig": {"name": "topology"}},
    "kernel module config": {"kernelModuleConfig": {"name": "kmc"}},
    "repo config": {"repoConfig": {"name": "repos"}},
    "cert config": {"certConfig": {"name": "certs"}},
    "gds": {"gds": {"enabled": True, "image": "nvidia-fs", **SIDECAR_IMAGE}},
    "gdrcopy": {"gdrcopy": {"enabled": True, "image": "gdrdrv", **SIDECAR_IMAGE}},
    "precompiled": {"usePrecompiled": True, "version": "595"},
}


@pytest.mark.parametrize("change", COUNTS.values(), ids=list(COUNTS))
def test_a_field_that_counts_changes_the_digest(change: dict[str, Any]) -> None:
    assert _digest(change) != RECORDED["training"]


def test_the_host_root_counts() -> None:
    paths = {"hostPaths": {"rootFS": "/host", "driverInstallDir": "/run/nvidia/driver"}}
    assert _digest({}, paths) != RECORDED["training"]


FOLLOW_ONS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "rdma with host MOFED": (
        {"rdma": {"enabled": True}},
        {"rdma": {"enabled": True, "useHostMofed": True}},
    ),
    "gds env": (
        {"gds": {"enabled": True, "image": "nvidia-fs", **SIDECAR_IMAGE}},
        {
            "gds": {
                "enabled": True,
                "image": "nvidia-fs",
                **SIDECAR_IMAGE,
                "env": [{"name": "A", "value": "1"}],
            }
        },
    ),
    "gdrcopy version": (
        {"gdrcopy": {"enabled": True, "image": "gdrdrv", **SIDECAR_IMAGE}},
        {"gdrcopy": {"enabled": True, "image": "gdrdrv", **SIDECAR_IMAGE, "version": "v2.7"}},
    ),
    "env value": (
        {"env": [{"name": "A", "value": "1"}]},
        {"env": [{"name": "A", "value": "2"}]},
    ),
    "licensing secret name": (
        {"licensingConfig": {"secretName": "licence"}},
        {"licensingConfig": {"secretName": "other"}},
    ),
}


@pytest.mark.parametrize(("before", "after"), FOLLOW_ONS.values(), ids=list(FOLLOW_ONS))
def test_a_refinement_that_counts_changes_the_digest(
    before: dict[str, Any], after: dict[str, Any]
) -> None:
    assert _digest(before) != _digest(after)


def test_a_new_file_in_a_mounted_config_map_counts() -> None:
    """One mount per file, as upstream's `createConfigMapVolumeMounts` makes them."""
    change = {"kernelModuleConfig": {"name": "kmc"}}
    more = {**CONFIG_MAPS, "kmc": ("nvidia.conf", "nvidia-peermem.conf")}
    (after,) = set(_digests(_render(change, config_maps=more)).values())
    assert after != _digest(change)


RESTART_ONLY: dict[str, dict[str, Any]] = {
    "tolerations": {"tolerations": [{"key": "example.com/x", "operator": "Exists"}]},
    "resources": {"resources": {"limits": {"memory": "2Gi"}, "requests": {"cpu": "500m"}}},
    "labels": {"labels": {"example.com/team": "gpu"}},
    "annotations": {"annotations": {"example.com/team": "gpu"}},
    "priority class": {"priorityClassName": "other"},
    "startup probe": {"startupProbe": {"initialDelaySeconds": 5, "periodSeconds": 3}},
    "liveness probe": {"livenessProbe": {"periodSeconds": 7}},
    "readiness probe": {"readinessProbe": {"periodSeconds": 9}},
    "pull policy": {"imagePullPolicy": "Always"},
    "pull secrets": {"imagePullSecrets": ["regcred"]},
    "manager pull policy": {"manager": {"imagePullPolicy": "Always"}},
    "node affinity": {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 1,
                    "preference": {
                        "matchExpressions": [
                            {"key": "example.com/x", "operator": "Exists"},
                        ]
                    },
                }
            ]
        }
    },
    "pod security context": {"podSecurityContext": {"fsGroup": 1}},
    "host network": {"hostNetwork": True},
}
"""Changes of the pod template (a driver pod restart) that install nothing new."""
INERT: dict[str, dict[str, Any]] = {
    "upgrade policy": {"upgradePolicy": {"autoUpgrade": False, "maxParallelUpgrades": 3}},
    "rdma off": {"rdma": {"enabled": False, "useHostMofed": True}},
    "gds off": {"gds": {"enabled": False, "env": [{"name": "A", "value": "1"}]}},
    "gdrcopy off": {"gdrcopy": {"enabled": False, "env": [{"name": "A", "value": "1"}]}},
    "empty config names": {
        "repoConfig": {"name": ""},
        "certConfig": {"name": ""},
        "kernelModuleConfig": {"name": ""},
        "virtualTopologyConfig": {"name": ""},
        "licensingConfig": {"secretName": "", "nlsEnabled": False},
    },
}


"""Settings that do not reach the pod, or that upstream records as empty."""


@pytest.mark.parametrize("change", RESTART_ONLY.values(), ids=list(RESTART_ONLY))
def test_a_restart_only_change_keeps_the_digest(change: dict[str, Any]) -> None:
    assert _render(change)["spec"]["template"] != _render({})["spec"]["template"]
    assert _digest(change) == RECORDED["training"]


@pytest.mark.parametrize("change", INERT.values(), ids=list(INERT))
def test_a_setting_that_does_not_count_keeps_the_digest(change: dict[str, Any]) -> None:
    assert _digest(change) == RECORDED["training"]


def test_env_order_does_not_count() -> None:
    """Upstream sorts the copied variables by name before hashing."""
    a, b = {"name": "A", "value": "1"}, {"name": "B", "value": "2"}
    assert _digest({"env": [a, b]}) == _digest({"env": [b, a]})
    assert _digest({"manager": {"env": [a, b]}}) == _digest({"manager": {"env": [b, a]}})


def test_config_files_of_precompiled_drivers_do_not_count() -> None:
    """Precompiled images build nothing: no repository or certificate files (upstream
    records the names, not the mounts)."""
    precompiled = {"usePrecompiled": True, "version": "595"}
    with_repos = _render({**precompiled, "repoConfig": {"name": "repos"}})
    pod = with_repos["spec"]["template"]["spec"]
    spec = crd.NVIDIADriverSpec.model_validate(
        {**_base_spec(), **precompiled, "repoConfig": {"name": "repos"}}
    )
    state = driver_digest.resource_install_state(spec, pod, kernel=KERNEL_VERSION)
    assert state["RepoConfig"] == "repos"
    assert state["AdditionalVolumes"] == []
    assert state["AdditionalVolumeMounts"] == []
    assert state["UsePrecompiled"] is True
    assert state["KernelVersion"] == KERNEL_VERSION


def test_the_record_of_a_fully_configured_resource() -> None:
    """Every field `buildDriverInstallConfig` fills, as this module fills it."""
    change = {
        "kernelModuleType": "proprietary",
        "args": ["--x"],
        "secretEnv": "driver-proxy",
        "env": [{"name": "B", "value": "2"}, {"name": "A", "value": "1"}],
        "manager": {"env": [{"name": "M", "value": "m"}]},
        "rdma": {"enabled": True, "useHostMofed": True},
        "gds": {"enabled": True, "image": "nvidia-fs", **SIDECAR_IMAGE, "env": [{"name": "G"}]},
        "gdrcopy": {"enabled": True, "image": "gdrdrv", **SIDECAR_IMAGE},
        "licensingConfig": {"secretName": "licence", "nlsEnabled": True},
        "virtualTopologyConfig": {"name": "topology"},
        "kernelModuleConfig": {"name": "kmc"},
        "repoConfig": {"name": "repos"},
        "certConfig": {"name": "certs"},
    }
    pod = _render(change)["spec"]["template"]["spec"]
    spec = crd.NVIDIADriverSpec.model_validate({**_base_spec(), **change})
    state = driver_digest.resource_install_state(spec, pod)
    image = "nvcr.io/nvidia/driver:595.91.07-ubuntu22.04"
    ro = True
    assert state == {
        "DriverImage": image,
        "DriverManagerImage": "nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.12.0",
        "DriverType": "gpu",
        "KernelModuleType": "proprietary",
        "DriverArgs": ["--x"],
        "SecretEnvSource": "driver-proxy",
        "DriverEnv": [[("Name", "A"), ("Value", "1")], [("Name", "B"), ("Value", "2")]],
        "ManagerEnv": [[("Name", "M"), ("Value", "m")]],
        "LicensingConfigName": "licence",
        "VirtualTopologyConfig": "topology",
        "KernelModuleConfig": "kmc",
        "RepoConfig": "repos",
        "CertConfig": "certs",
        "GPUDirectRDMAEnabled": True,
        "PeermemImage": image,
        "UseHostMOFED": True,
        "GDSImage": "nvcr.io/nvidia/cloud-native/nvidia-fs:2.29.4-ubuntu22.04",
        "GDSEnabled": True,
        "GDSEnv": [[("Name", "G"), ("Value", "")]],
        "GDRCopyImage": "nvcr.io/nvidia/cloud-native/gdrdrv:2.29.4-ubuntu22.04",
        "GDRCopyEnabled": True,
        "GDRCopyEnv": [],
        "AdditionalVolumeMounts": [
            [
                ("Name", "certs"),
                ("MountPath", "/usr/local/share/ca-certificates/ca.crt"),
                ("SubPath", "ca.crt"),
                ("ReadOnly", ro),
            ],
            [
                ("Name", "kmc"),
                ("MountPath", "/drivers/nvidia.conf"),
                ("SubPath", "nvidia.conf"),
                ("ReadOnly", ro),
            ],
            [
                ("Name", "licensing-config"),
                ("MountPath", "/drivers/ClientConfigToken/client_configuration_token.tok"),
                ("SubPath", "client_configuration_token.tok"),
                ("ReadOnly", ro),
            ],
            [
                ("Name", "licensing-config"),
                ("MountPath", "/drivers/gridd.conf"),
                ("SubPath", "gridd.conf"),
                ("ReadOnly", ro),
            ],
            [
                ("Name", "repos"),
                ("MountPath", "/etc/apt/sources.list.d/custom.list"),
                ("SubPath", "custom.list"),
                ("ReadOnly", ro),
            ],
            [
                ("Name", "topology-config"),
                ("MountPath", "/etc/nvidia/nvidia-topologyd.conf"),
                ("SubPath", "nvidia-topologyd.conf"),
                ("ReadOnly", ro),
            ],
        ],
        "AdditionalVolumes": [
            [("Name", "certs"), ("ConfigMapName", "certs"), ("SecretName", ""), ("HostPath", "")],
            [("Name", "kmc"), ("ConfigMapName", "kmc"), ("SecretName", ""), ("HostPath", "")],
            [
                ("Name", "licensing-config"),
                ("ConfigMapName", ""),
                ("SecretName", "licence"),
                ("HostPath", ""),
            ],
            [("Name", "repos"), ("ConfigMapName", "repos"), ("SecretName", ""), ("HostPath", "")],
            [
                ("Name", "topology-config"),
                ("ConfigMapName", "topology"),
                ("SecretName", ""),
                ("HostPath", ""),
            ],
        ],
        "HostRoot": "/",
    }
