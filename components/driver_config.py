"""The driver's site configuration: what an air-gapped, proxied or licensed fleet adds to
the driver pod.

`spec.driver.repoConfig` (package repository files), `certConfig` (CA certificates),
`kernelModuleConfig` (`<module>.conf` parameter files), `licensingConfig` (vGPU guest
licensing: `gridd.conf` and the NLS client token), `virtualTopology` (the vGPU topology
daemon's file) and `secretEnv` (proxy credentials and the like, as environment).

Names, paths and which container gets what follow NVIDIA's operator v26.7
(`controllers/object_controls.go`: `transformDriverContainer`, `applyLicensingConfig`,
`createConfigMapVolumeMounts`, `transformPeerMemoryContainer`, `transformGDSContainer`,
`transformGDRCopyContainer`): each file of a ConfigMap is mounted by `subPath` into the
OS's own directory, so the image's files there stay visible (a whole-directory mount
would hide the distribution's own repositories and certificates). That needs the
ConfigMap's keys, which the controller reads from the cluster and passes in
`RenderContext.config_map_keys`; a referenced ConfigMap that is not there, or a GPU OS
with no known directory, is a problem the controller reports, and the driver DaemonSet
is then left as it is rather than rendered without the configuration.

The GPU nodes' OS adds host files too, as upstream's `SubscriptionPathMap` says: the
subscription files (RHEL entitlements, SUSE registration) a compiled driver's build
needs on RHEL and SLES hosts, and the host's `/lib/modules` for a precompiled driver on
SLES (:func:`subscription_files`, :func:`suse_lib_modules`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from components.context import CRIO, RenderContext
from crd import ClusterPolicySpec

REPO_DIRS = {
    "centos": "/etc/yum.repos.d",
    "debian": "/etc/apt/sources.list.d",
    "ubuntu": "/etc/apt/sources.list.d",
    "rhcos": "/etc/yum.repos.d",
    "rhel": "/etc/yum.repos.d",
    "rocky": "/etc/yum.repos.d",
    "ol": "/etc/yum.repos.d",
    "sles": "/etc/zypp/repos.d",
    "sl-micro": "/etc/zypp/repos.d",
}
"""Where each distribution's package manager reads repository files."""
CERT_DIRS = {
    "centos": "/etc/pki/ca-trust/extracted/pem",
    "debian": "/usr/local/share/ca-certificates",
    "ubuntu": "/usr/local/share/ca-certificates",
    "rhcos": "/etc/pki/ca-trust/extracted/pem",
    "rhel": "/etc/pki/ca-trust/extracted/pem",
    "rocky": "/etc/pki/ca-trust/extracted/pem",
    "ol": "/etc/pki/ca-trust/extracted/pem",
    "sles": "/etc/pki/trust/anchors",
    "sl-micro": "/etc/pki/trust/anchors",
}
"""Where each distribution (and Go's TLS stack) looks for extra CA certificates."""
_RED_HAT_FILES = {
    "/run/secrets/etc-pki-entitlement": ("/etc/pki/entitlement", "Directory"),
    "/run/secrets/redhat.repo": ("/etc/yum.repos.d/redhat.repo", "File"),
    "/run/secrets/rhsm": ("/etc/rhsm", "Directory"),
}
_SUSE_FILES = {
    "/etc/zypp/credentials.d": ("/etc/zypp/credentials.d", "Directory"),
    "/etc/SUSEConnect": ("/etc/SUSEConnect", "FileOrCreate"),
}
SUBSCRIPTION_PATHS: dict[str, dict[str, tuple[str, str]]] = {
    "rhel": _RED_HAT_FILES,
    "rhcos": _RED_HAT_FILES,
    "sles": _SUSE_FILES,
    "sl-micro": _SUSE_FILES,
}
"""The host's subscription files by OS: mount path in the driver container -> (host
path, hostPath type). The driver build reads them to reach the distribution's licensed
package repositories (RHEL's entitlement certificates and `redhat.repo`, SUSE's
registration credentials)."""
SUBSCRIPTION_VOLUME = "subscription-config"
LIB_MODULES_VOLUME = "lib-modules"
LIB_MODULES_MOUNT = "/run/host/lib/modules"
SUSE_OSES = ("sles", "sl-micro")
DRIVERS_DIR = "/drivers"
"""The driver container reads `<module>.conf` parameter files and licensing from here."""
LICENSING_VOLUME = "licensing-config"
GRIDD_FILE = "gridd.conf"
GRIDD_PATH = f"{DRIVERS_DIR}/{GRIDD_FILE}"
NLS_TOKEN_FILE = "client_configuration_token.tok"
NLS_TOKEN_PATH = f"{DRIVERS_DIR}/ClientConfigToken/{NLS_TOKEN_FILE}"
TOPOLOGY_VOLUME = "topology-config"
TOPOLOGY_FILE = "nvidia-topologyd.conf"
TOPOLOGY_PATH = f"/etc/nvidia/{TOPOLOGY_FILE}"

DRIVER_CONTAINER = "nvidia-driver-ctr"
PEERMEM_CONTAINER = "nvidia-peermem-ctr"
GPUDIRECT_CONTAINERS = ("nvidia-fs-ctr", "nvidia-gdrcopy-ctr")
"""The GDS and GDRCopy containers build their modules too: same repositories, certs, env."""


@dataclass(frozen=True)
class _Files:
    """One ConfigMap mounted file by file into `directory`."""

    config_map: str
    directory: str
    keys: tuple[str, ...]

    def mounts(self) -> list[dict[str, Any]]:
        return [
            {
                "name": self.config_map,
                "readOnly": True,
                "mountPath": f"{self.directory}/{key}",
                "subPath": key,
            }
            for key in self.keys
        ]

    def volume(self) -> dict[str, Any]:
        """Only the files mounted (all of them, as the ConfigMap was read)."""
        items = [{"key": k, "path": k} for k in self.keys]
        return {"name": self.config_map, "configMap": {"name": self.config_map, "items": items}}


def referenced_config_maps(spec: ClusterPolicySpec) -> tuple[str, ...]:
    """ConfigMaps (in the operator's namespace) whose keys the driver pod's mounts need
    (and the vGPU manager's: its kernel module parameters)."""
    driver = spec.driver
    names = []
    if driver.kernel_module_config and driver.kernel_module_config.name:
        names.append(driver.kernel_module_config.name)
    vgpu_modules = spec.vgpu_manager.kernel_module_config
    if spec.vgpu_manager.enabled and vgpu_modules and vgpu_modules.name:
        names.append(vgpu_modules.name)
    if not driver.use_precompiled:
        if driver.repo_config and driver.repo_config.config_map_name:
            names.append(driver.repo_config.config_map_name)
        if driver.cert_config and driver.cert_config.name:
            names.append(driver.cert_config.name)
    return tuple(dict.fromkeys(names))


def _os_dir(table: dict[str, str], field: str, ctx: RenderContext) -> tuple[str | None, str | None]:
    """(directory, problem) for the GPU nodes' OS."""
    os_id = ctx.os_id
    if os_id is None:
        return None, f"{field}: the GPU nodes' OS is unknown (no NFD os_release label)"
    directory = table.get(os_id)
    if directory is None:
        return None, f"{field}: no known directory for OS {os_id!r}"
    return directory, None


def _files(
    name: str | None, directory: str | None, field: str, ctx: RenderContext
) -> tuple[_Files | None, str | None]:
    if not name or directory is None:
        return None, None
    keys = ctx.config_map_keys.get(name)
    if keys is None:
        return None, f"{field}: ConfigMap {ctx.namespace}/{name} not found"
    return _Files(name, directory, keys), None


def kernel_module_mounts(
    name: str | None, ctx: RenderContext
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """A `kernelModuleConfig` ConfigMap's files in /drivers (one mount per key, so the
    image's own files there stay visible) and its volume; none while its keys are
    unknown (no such ConfigMap)."""
    files, _ = _files(name, DRIVERS_DIR, "kernelModuleConfig.name", ctx)
    if files is None:
        return [], None
    return files.mounts(), files.volume()


@dataclass(frozen=True)
class SiteConfig:
    """What the policy's site configuration adds to a driver pod, and what it lacks."""

    kernel_modules: _Files | None
    repos: _Files | None
    certs: _Files | None
    problems: tuple[str, ...]


def site_config(spec: ClusterPolicySpec, ctx: RenderContext) -> SiteConfig:
    """The mounts the driver pod needs, or the problems that keep them from being known."""
    driver = spec.driver
    problems: list[str] = []
    modules, p1 = _files(
        driver.kernel_module_config.name if driver.kernel_module_config else None,
        DRIVERS_DIR,
        "spec.driver.kernelModuleConfig.name",
        ctx,
    )
    repos = certs = None
    p2 = p3 = None
    if not driver.use_precompiled:
        repo_name = driver.repo_config.config_map_name if driver.repo_config else None
        cert_name = driver.cert_config.name if driver.cert_config else None
        repo_dir, p2 = (
            _os_dir(REPO_DIRS, "spec.driver.repoConfig", ctx) if repo_name else (None, None)
        )
        cert_dir, p3 = (
            _os_dir(CERT_DIRS, "spec.driver.certConfig", ctx) if cert_name else (None, None)
        )
        repos, p4 = _files(repo_name, repo_dir, "spec.driver.repoConfig.configMapName", ctx)
        certs, p5 = _files(cert_name, cert_dir, "spec.driver.certConfig.name", ctx)
        problems += [p for p in (p4, p5) if p]
    problems = [p for p in (p1, p2, p3) if p] + problems
    return SiteConfig(modules, repos, certs, tuple(problems))


def config_problems(spec: ClusterPolicySpec, ctx: RenderContext) -> list[str]:
    """Why the driver's site configuration cannot be rendered (empty when it can)."""
    if not spec.driver.enabled or spec.driver.use_nvidia_driver_crd:
        return []
    return list(site_config(spec, ctx).problems)


def _containers(pod: dict[str, Any], names: tuple[str, ...]) -> Iterator[dict[str, Any]]:
    for c in pod["containers"]:
        if c["name"] in names:
            yield c


def _add_volume(volumes: list[dict[str, Any]], volume: dict[str, Any]) -> None:
    """One volume per name: two fields may name the same ConfigMap (the API server
    refuses a pod with two volumes of one name)."""
    if all(v["name"] != volume["name"] for v in volumes):
        volumes.append(volume)


def _secret_env(container: dict[str, Any], secret: str) -> None:
    container.setdefault("envFrom", []).append({"secretRef": {"name": secret}})


@dataclass(frozen=True)
class HostFiles:
    """Host files a driver pod mounts read-only by its node's OS: the volumes and the
    driver container's mounts."""

    mounts: tuple[dict[str, Any], ...] = ()
    volumes: tuple[dict[str, Any], ...] = ()

    def add_to(self, pod: dict[str, Any], containers: tuple[str, ...]) -> None:
        """Append the volumes to ``pod`` and the mounts to each of ``containers``."""
        pod["volumes"].extend(dict(v, hostPath=dict(v["hostPath"])) for v in self.volumes)
        for c in _containers(pod, containers):
            c.setdefault("volumeMounts", []).extend(dict(m) for m in self.mounts)


def subscription_files(os_id: str | None, runtime: str, *, repo_config: bool) -> HostFiles:
    """The host's subscription files for a compiled driver on ``os_id``, as upstream
    mounts them (`controllers/object_controls.go`, `transformDriverContainer` with
    `SubscriptionPathMap` and `getSubscriptionPathsToVolumeSources`; for an NVIDIADriver
    pool `internal/state/driver_volumes.go`, `getDriverAdditionalConfigs`): on RHEL
    unless the cluster's runtime is CRI-O (gpuop never runs on OpenShift, upstream's
    other exception) and on SLES and SL Micro; none on RHEL when a `repoConfig`
    ConfigMap supplies the repositories. Volume `subscription-config-<n>` per path,
    numbered in the mount paths' sorted order, each mounted read-only."""
    applies = (os_id == "rhel" and runtime != CRIO) or os_id in SUSE_OSES
    if not os_id or not applies or (repo_config and os_id == "rhel"):
        return HostFiles()
    paths = SUBSCRIPTION_PATHS[os_id]
    mounts, volumes = [], []
    for number, mount_path in enumerate(sorted(paths)):
        name = f"{SUBSCRIPTION_VOLUME}-{number}"
        host, kind = paths[mount_path]
        mounts.append({"name": name, "mountPath": mount_path, "readOnly": True})
        volumes.append({"name": name, "hostPath": {"path": host, "type": kind}})
    return HostFiles(tuple(mounts), tuple(volumes))


def suse_lib_modules(os_id: str | None, precompiled: bool) -> HostFiles:
    """The host's `/lib/modules` for a precompiled driver on SLES or SL Micro, which
    reads the host's modules at run time (`transformDriverContainer`: mounted read-only
    at `/run/host/lib/modules`, host path type Directory). A ClusterPolicy's driver
    only: upstream's NVIDIADriver pools test for it inside the branch for compiled
    drivers (`getDriverAdditionalConfigs`), so no pool ever gets it."""
    if not precompiled or os_id not in SUSE_OSES:
        return HostFiles()
    return HostFiles(
        ({"name": LIB_MODULES_VOLUME, "mountPath": LIB_MODULES_MOUNT, "readOnly": True},),
        ({"name": LIB_MODULES_VOLUME, "hostPath": {"path": "/lib/modules", "type": "Directory"}},),
    )


def _repo_config_named(spec: ClusterPolicySpec) -> bool:
    return bool(spec.driver.repo_config and spec.driver.repo_config.config_map_name)


def apply_site_config(
    pod: dict[str, Any], spec: ClusterPolicySpec, ctx: RenderContext, *, os_files: bool = True
) -> None:
    """Add the policy's site configuration to a driver pod spec, in place; with
    ``os_files`` (a ClusterPolicy's driver) also the host files of the GPU nodes' OS,
    where upstream's `transformDriverContainer` adds them (an NVIDIADriver pool adds
    its own: `components.nvidiadriver`)."""
    driver = spec.driver
    config = site_config(spec, ctx)
    volumes: list[dict[str, Any]] = pod["volumes"]
    main = next(_containers(pod, (DRIVER_CONTAINER,)))
    mounts: list[dict[str, Any]] = main.setdefault("volumeMounts", [])

    licensing = driver.licensing_config
    if licensing and (licensing.config_map_name or licensing.secret_name):
        items = [{"key": GRIDD_FILE, "path": GRIDD_FILE}]
        mounts.append(
            {
                "name": LICENSING_VOLUME,
                "readOnly": True,
                "mountPath": GRIDD_PATH,
                "subPath": GRIDD_FILE,
            }
        )
        if licensing.nls_enabled:
            items.append({"key": NLS_TOKEN_FILE, "path": NLS_TOKEN_FILE})
            mounts.append(
                {
                    "name": LICENSING_VOLUME,
                    "readOnly": True,
                    "mountPath": NLS_TOKEN_PATH,
                    "subPath": NLS_TOKEN_FILE,
                }
            )
        # A Secret wins over a ConfigMap (the token is a credential).
        source: dict[str, Any] = (
            {"secret": {"secretName": licensing.secret_name, "items": items}}
            if licensing.secret_name
            else {"configMap": {"name": licensing.config_map_name, "items": items}}
        )
        volumes.append({"name": LICENSING_VOLUME, **source})

    topology = driver.virtual_topology
    if topology and topology.config:
        mounts.append(
            {
                "name": TOPOLOGY_VOLUME,
                "readOnly": True,
                "mountPath": TOPOLOGY_PATH,
                "subPath": TOPOLOGY_FILE,
            }
        )
        volumes.append(
            {
                "name": TOPOLOGY_VOLUME,
                "configMap": {
                    "name": topology.config,
                    "items": [{"key": TOPOLOGY_FILE, "path": TOPOLOGY_FILE}],
                },
            }
        )

    if config.kernel_modules:
        mounts.extend(config.kernel_modules.mounts())
        _add_volume(volumes, config.kernel_modules.volume())
        for peermem in _containers(pod, (PEERMEM_CONTAINER,)):
            peermem.setdefault("volumeMounts", []).extend(config.kernel_modules.mounts())

    if os_files:
        suse_lib_modules(ctx.os_id, driver.use_precompiled).add_to(pod, (DRIVER_CONTAINER,))

    if driver.use_precompiled:
        return  # precompiled images build nothing: no repositories, certs or build env

    builders = [main, *_containers(pod, GPUDIRECT_CONTAINERS)]
    for files in (config.repos, config.certs):
        if files is None:
            continue
        _add_volume(volumes, files.volume())
        for builder in builders:
            builder.setdefault("volumeMounts", []).extend(files.mounts())
    if driver.secret_env:
        for builder in builders:
            _secret_env(builder, driver.secret_env)
    if os_files:
        subscriptions = subscription_files(
            ctx.os_id, ctx.container_runtime, repo_config=_repo_config_named(spec)
        )
        subscriptions.add_to(pod, (DRIVER_CONTAINER,))
