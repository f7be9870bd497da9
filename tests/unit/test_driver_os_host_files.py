"""The host files a driver pod mounts by its node's OS, as upstream mounts them.

Facts from NVIDIA's operator v26.7 (the mirror's HEAD):
- `controllers/object_controls.go`, `SubscriptionPathMap` (read through
  `getSubscriptionPathsToVolumeSources`): on `rhel` (and `rhcos`)
  `/run/secrets/etc-pki-entitlement` <- `/etc/pki/entitlement` (Directory),
  `/run/secrets/redhat.repo` <- `/etc/yum.repos.d/redhat.repo` (File),
  `/run/secrets/rhsm` <- `/etc/rhsm` (Directory); on `sles` and `sl-micro`
  `/etc/zypp/credentials.d` <- itself (Directory), `/etc/SUSEConnect` <- itself
  (FileOrCreate).
- `transformDriverContainer` (a ClusterPolicy's driver; the OS is the cluster's,
  `gpuNodeOSRelease` from `getGPUNodeOSInfo`, the first GPU node's NFD
  `system-os_release.ID`): for compiled drivers only, on `rhel` when not on OpenShift and
  the runtime is not CRI-O, or on `sles`/`sl-micro`, and not on `rhel` with a
  `repoConfig` ConfigMap, the paths in sorted order as volumes
  `subscription-config-<n>`, each mounted read-only into `nvidia-driver-ctr` alone;
  for precompiled drivers on `sles`/`sl-micro` the host's `/lib/modules` (Directory)
  read-only at `/run/host/lib/modules` (volume `lib-modules`).
- `internal/state/driver_volumes.go`, `getDriverAdditionalConfigs` (an NVIDIADriver's
  pool; the OS is the pool's, the runtime the cluster's, `clusterinfo.GetContainerRuntime`:
  containerd when any GPU node runs it): the same subscription rule, its mounts among the
  additional configs the template (`manifests/state-driver/0500_daemonset.yaml`) gives
  the driver, nvidia-peermem, GDS and GDRCopy containers; the `/lib/modules` test sits
  inside the branch for compiled drivers, so no pool ever gets it.

gpuop never runs on OpenShift, so upstream's OpenShift exception never applies. The
conformance recordings are all Ubuntu; whole-object comparison for RHEL and SLES needs
recordings of upstream with such nodes.
"""

from __future__ import annotations

from typing import Any

import pytest

import crd
from components import driver, driver_digest
from components.context import NodeFacts, RenderContext
from components.nvidiadriver import OWNER_LABEL
from components.nvidiadriver import render as render_nvd

UBUNTU = NodeFacts(os_id="ubuntu", os_version="22.04", kernel="5.15.0-124-generic")
RHEL = NodeFacts(os_id="rhel", os_version="9.4", kernel="5.14.0-427.el9.x86_64")
SLES = NodeFacts(os_id="sles", os_version="15.6", kernel="6.4.0-150600.23.25-default")
SL_MICRO = NodeFacts(os_id="sl-micro", os_version="6.0", kernel="6.4.0-20-default")

RED_HAT_VOLUMES = [
    {
        "name": "subscription-config-0",
        "hostPath": {"path": "/etc/pki/entitlement", "type": "Directory"},
    },
    {
        "name": "subscription-config-1",
        "hostPath": {"path": "/etc/yum.repos.d/redhat.repo", "type": "File"},
    },
    {"name": "subscription-config-2", "hostPath": {"path": "/etc/rhsm", "type": "Directory"}},
]
RED_HAT_MOUNTS = [
    {"name": "subscription-config-0", "mountPath": "/run/secrets/etc-pki-entitlement"},
    {"name": "subscription-config-1", "mountPath": "/run/secrets/redhat.repo"},
    {"name": "subscription-config-2", "mountPath": "/run/secrets/rhsm"},
]
# sorted by mount path: "/etc/SUSEConnect" < "/etc/zypp/credentials.d"
SUSE_VOLUMES = [
    {
        "name": "subscription-config-0",
        "hostPath": {"path": "/etc/SUSEConnect", "type": "FileOrCreate"},
    },
    {
        "name": "subscription-config-1",
        "hostPath": {"path": "/etc/zypp/credentials.d", "type": "Directory"},
    },
]
SUSE_MOUNTS = [
    {"name": "subscription-config-0", "mountPath": "/etc/SUSEConnect"},
    {"name": "subscription-config-1", "mountPath": "/etc/zypp/credentials.d"},
]
LIB_MODULES_VOLUME = {
    "name": "lib-modules",
    "hostPath": {"path": "/lib/modules", "type": "Directory"},
}
LIB_MODULES_MOUNT = {"name": "lib-modules", "mountPath": "/run/host/lib/modules", "readOnly": True}
HOST_FILE_VOLUMES = ("subscription-config-", "lib-modules")


def _ro(mounts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**m, "readOnly": True} for m in mounts]


def _ctx(*nodes: NodeFacts, **keys: tuple[str, ...]) -> RenderContext:
    return RenderContext(
        namespace="gpu-operator", operator_image="gpuop:test", gpu_nodes=nodes, config_map_keys=keys
    )


def _container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in pod["containers"] if c["name"] == name)


def _host_volumes(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [v for v in pod["volumes"] if v["name"].startswith(HOST_FILE_VOLUMES)]


def _host_mounts(container: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        m for m in container.get("volumeMounts") or () if m["name"].startswith(HOST_FILE_VOLUMES)
    ]


def _policy(**driver_fields: Any) -> crd.ClusterPolicySpec:
    return crd.ClusterPolicySpec.model_validate({"driver": driver_fields})


# ------------------------------------------------------- the ClusterPolicy's driver
@pytest.mark.parametrize(
    ("node", "volumes", "mounts"),
    [
        (RHEL, RED_HAT_VOLUMES, RED_HAT_MOUNTS),
        (SLES, SUSE_VOLUMES, SUSE_MOUNTS),
        (SL_MICRO, SUSE_VOLUMES, SUSE_MOUNTS),
        (UBUNTU, [], []),
    ],
    ids=["rhel", "sles", "sl-micro", "ubuntu"],
)
def test_a_compiled_driver_mounts_the_subscription_files_of_the_clusters_os(
    node: NodeFacts, volumes: list[dict[str, Any]], mounts: list[dict[str, Any]]
) -> None:
    """`transformDriverContainer` with `SubscriptionPathMap`: the OS's paths, sorted by
    mount path, as `subscription-config-<n>` host paths with their types, read-only in
    the driver container alone, appended after every other volume and mount."""
    spec = crd.ClusterPolicySpec.model_validate(
        {"driver": {"rdma": {"enabled": True}}, "gds": {"enabled": True}}
    )
    pod = driver.pod_spec(spec, _ctx(node))
    assert _host_volumes(pod) == volumes
    main = _container(pod, "nvidia-driver-ctr")
    assert _host_mounts(main) == _ro(mounts)
    if mounts:
        assert pod["volumes"][-len(volumes) :] == volumes
        assert main["volumeMounts"][-len(mounts) :] == _ro(mounts)
    for other in ("nvidia-peermem-ctr", "nvidia-fs-ctr"):
        assert _host_mounts(_container(pod, other)) == []


def test_rhel_under_cri_o_gets_no_subscription_files() -> None:
    """`transformDriverContainer`: RHEL's entitlements only when the runtime is not
    CRI-O (CRI-O hands them to containers itself)."""
    crio = NodeFacts(os_id="rhel", os_version="9.4", runtime="crio")
    assert _host_volumes(driver.pod_spec(_policy(), _ctx(crio))) == []
    # The cluster's runtime decides: containerd on any GPU node makes it containerd.
    containerd = NodeFacts(os_id="rhel", os_version="9.4", runtime="containerd")
    pod = driver.pod_spec(_policy(), _ctx(crio, crio, containerd))
    assert _host_volumes(pod) == RED_HAT_VOLUMES
    # SLES gets them under any runtime.
    sles_crio = NodeFacts(os_id="sles", os_version="15.6", runtime="crio")
    assert _host_volumes(driver.pod_spec(_policy(), _ctx(sles_crio))) == SUSE_VOLUMES


def test_a_repo_config_replaces_rhels_subscription_files_but_not_sles() -> None:
    """`transformDriverContainer`: "Skipping host subscription mounts because repoConfig
    is enabled", on RHEL only."""
    spec = _policy(repoConfig={"configMapName": "repos"})
    rhel = driver.pod_spec(spec, _ctx(RHEL, repos=("a.repo",)))
    assert _host_volumes(rhel) == []
    assert [m["mountPath"] for m in _container(rhel, "nvidia-driver-ctr")["volumeMounts"]][
        -1
    ] == "/etc/yum.repos.d/a.repo"
    sles = driver.pod_spec(spec, _ctx(SLES, repos=("a.repo",)))
    assert _host_volumes(sles) == SUSE_VOLUMES


@pytest.mark.parametrize(
    ("node", "expected"),
    [(SLES, True), (SL_MICRO, True), (RHEL, False), (UBUNTU, False)],
    ids=["sles", "sl-micro", "rhel", "ubuntu"],
)
def test_a_precompiled_driver_on_suse_mounts_the_hosts_lib_modules(
    node: NodeFacts, expected: bool
) -> None:
    """`transformDriverContainer`: precompiled on `sles`/`sl-micro` mounts `/lib/modules`
    (Directory) read-only at `/run/host/lib/modules`; precompiled drivers never get the
    subscription files (it returns before them)."""
    spec = _policy(usePrecompiled=True)
    ctx = _ctx(node)
    (kernel,) = ctx.kernels
    pod = driver.pod_spec(spec, ctx, kernel)
    main = _container(pod, "nvidia-driver-ctr")
    assert _host_volumes(pod) == ([LIB_MODULES_VOLUME] if expected else [])
    assert _host_mounts(main) == ([LIB_MODULES_MOUNT] if expected else [])
    # compiled drivers on SUSE do not get it
    assert not any(v["name"] == "lib-modules" for v in driver.pod_spec(_policy(), ctx)["volumes"])


def test_the_subscription_files_count_in_the_clusterpolicy_digest() -> None:
    """Upstream's ClusterPolicy digest is taken over the finished template, these mounts
    with the rest."""
    ubuntu = driver.pod_spec(_policy(), _ctx(UBUNTU))
    rhel = driver.pod_spec(_policy(), _ctx(RHEL))
    state = driver_digest.install_state(rhel)
    assert ("HostPath", "/etc/rhsm") in [f for v in state["AdditionalVolumes"] for f in v]
    assert driver.digest_in(rhel) != driver.digest_in(ubuntu)


# ------------------------------------------------------------ NVIDIADriver pools
def _node(name: str, facts: NodeFacts, owner: str = "fleet", runtime: str = "containerd") -> Any:
    labels = {
        "nvidia.com/gpu.present": "true",
        OWNER_LABEL: owner,
        "feature.node.kubernetes.io/system-os_release.ID": facts.os_id,
        "feature.node.kubernetes.io/system-os_release.VERSION_ID": facts.os_version,
        "feature.node.kubernetes.io/system-os_release.VERSION_ID.major": (
            facts.os_version or ""
        ).split(".")[0],
        "feature.node.kubernetes.io/kernel-version.full": facts.kernel,
    }
    return {
        "metadata": {"name": name, "labels": labels},
        "status": {"nodeInfo": {"containerRuntimeVersion": f"{runtime}://1.7.22"}},
    }


def _pools(spec: dict[str, Any], *nodes: Any, ctx: RenderContext) -> dict[str, dict[str, Any]]:
    model = crd.NVIDIADriverSpec.model_validate({"version": "595.91.07", **spec})
    objs = render_nvd("fleet", "uid-1", model, nodes, crd.ClusterPolicySpec(), ctx)
    return {
        o["spec"]["template"]["metadata"]["labels"]["nvidia.com/node.os-version"]: o["spec"][
            "template"
        ]["spec"]
        for o in objs
    }


FLEET = (_node("r", RHEL), _node("s", SLES), _node("u", UBUNTU))
FLEET_CTX = _ctx(RHEL, SLES, UBUNTU)


def test_each_pool_mounts_the_subscription_files_of_its_own_os() -> None:
    """`getDriverAdditionalConfigs` decides by the pool's OS (`pool.osRelease`): a RHEL
    pool gets Red Hat's files, a SLES pool SUSE's, an Ubuntu pool none, in one
    resource."""
    pools = _pools({}, *FLEET, ctx=FLEET_CTX)
    assert sorted(pools) == ["rhel9", "sles15.6", "ubuntu22.04"]
    for tag, volumes, mounts in (
        ("rhel9", RED_HAT_VOLUMES, RED_HAT_MOUNTS),
        ("sles15.6", SUSE_VOLUMES, SUSE_MOUNTS),
        ("ubuntu22.04", [], []),
    ):
        pod = pools[tag]
        assert _host_volumes(pod) == volumes, tag
        assert _host_mounts(_container(pod, "nvidia-driver-ctr")) == _ro(mounts), tag


def test_a_pools_subscription_files_reach_every_container_of_the_additional_configs() -> None:
    """The template gives `.AdditionalConfigs.VolumeMounts` to nvidia-driver-ctr,
    nvidia-peermem-ctr, nvidia-fs-ctr and nvidia-gdrcopy-ctr."""
    spec = {"rdma": {"enabled": True}, "gds": {"enabled": True}, "gdrcopy": {"enabled": True}}
    pod = _pools(spec, _node("s", SLES), ctx=_ctx(SLES))["sles15.6"]
    for name in ("nvidia-driver-ctr", "nvidia-peermem-ctr", "nvidia-fs-ctr", "nvidia-gdrcopy-ctr"):
        assert _host_mounts(_container(pod, name)) == _ro(SUSE_MOUNTS), name
    assert _host_volumes(pod) == SUSE_VOLUMES


def test_a_rhel_pool_follows_the_clusters_runtime_and_the_repo_config() -> None:
    """`getDriverAdditionalConfigs`: the runtime is the cluster's (containerd when any GPU
    node runs it), and a `repoConfig` skips RHEL's host files."""
    crio_node = _node("r", RHEL, runtime="crio")
    crio = NodeFacts(os_id="rhel", os_version="9.4", runtime="crio")
    containerd = NodeFacts(os_id="ubuntu", os_version="22.04", runtime="containerd")
    assert _host_volumes(_pools({}, crio_node, ctx=_ctx(crio))["rhel9"]) == []
    mixed = _pools({}, crio_node, ctx=_ctx(crio, containerd))["rhel9"]
    assert _host_volumes(mixed) == RED_HAT_VOLUMES
    with_repos = _pools(
        {"repoConfig": {"name": "repos"}},
        _node("r", RHEL),
        ctx=_ctx(RHEL, repos=("a.repo",)),
    )["rhel9"]
    assert _host_volumes(with_repos) == []


def test_precompiled_pools_get_no_host_files_even_on_suse() -> None:
    """`getDriverAdditionalConfigs` tests for the SUSE `/lib/modules` mount inside its
    `!UsePrecompiledDrivers()` branch: a precompiled pool gets neither it nor the
    subscription files (unlike the ClusterPolicy's driver)."""
    pools = _pools({"usePrecompiled": True, "version": "595"}, *FLEET, ctx=FLEET_CTX)
    assert len(pools) == 3
    for tag, pod in pools.items():
        assert _host_volumes(pod) == [], tag


def test_a_pools_subscription_files_count_in_its_digest() -> None:
    """`buildDriverInstallConfig` records `AdditionalConfigs` (the subscription volumes
    among them) in the pool's install state."""
    model = crd.NVIDIADriverSpec.model_validate({"version": "595.91.07"})
    pod = _pools({}, _node("r", RHEL), ctx=_ctx(RHEL))["rhel9"]
    state = driver_digest.resource_install_state(model, pod)
    assert [dict(v)["Name"] for v in state["AdditionalVolumes"]] == [
        "subscription-config-0",
        "subscription-config-1",
        "subscription-config-2",
    ]
    assert [dict(m)["MountPath"] for m in state["AdditionalVolumeMounts"]] == [
        m["mountPath"] for m in RED_HAT_MOUNTS
    ]
    plain = _pools({}, _node("r", RHEL), ctx=_ctx(NodeFacts("rhel", "9.4", runtime="crio")))
    assert driver.digest_in(pod) != driver.digest_in(plain["rhel9"])
