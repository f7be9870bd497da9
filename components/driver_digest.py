"""The driver's install digest (`DRIVER_CONFIG_DIGEST`), computed as NVIDIA's operator does.

The driver container and its manager compare this value with what the node last
installed: equal means the driver on the node stays (no module unload, no GPU pod
eviction), so a pod restart is enough. Only what shapes the installed driver counts:
images, command and arguments, literal environment, the driver container's mounts and
the pod's volumes, and which GPUDirect sidecars run. Probes, resources, pull secrets,
labels, annotations and tolerations do not, so changing them restarts the driver pod
without emptying the node.

The value equals upstream's for the same pod spec (so a node NVIDIA's operator set up
keeps its driver when gpuop takes over): upstream hashes, with 32-bit FNV-1a, each
non-empty field of its install-state record in field-name order, written as
`Name:` followed by the field in go-spew's typed `%#v` form. The record and that form
are reproduced here for the field types the record has.

Upstream fills that one record two ways, and so do we. A ClusterPolicy's driver pod is
read back from the finished pod spec (:func:`install_state`, :func:`digest`). An
NVIDIADriver's DaemonSets instead get the record filled from the resource itself
(:func:`resource_install_state`, :func:`resource_digest`): fewer facts, under the same
field names, so the two kinds of digest never compare equal by design.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from components.driver_config import LICENSING_VOLUME, SUBSCRIPTION_VOLUME, TOPOLOGY_VOLUME
from crd import EnvVar, NVIDIADriverSpec

DIGEST_ENV = "DRIVER_CONFIG_DIGEST"
MANAGER_CONTAINER = "k8s-driver-manager"
DRIVER_CONTAINER = "nvidia-driver-ctr"

_FNV_OFFSET = 0x811C9DC5
_FNV_PRIME = 0x01000193

#: Sidecars whose presence (and image) changes what is installed: container name ->
#: (image field, enabled field, env field or "").
_SIDECARS = {
    "nvidia-peermem-ctr": ("PeermemImage", "GPUDirectRDMAEnabled", ""),
    "nvidia-fs-ctr": ("GDSImage", "GDSEnabled", "GDSEnv"),
    "nvidia-gdrcopy-ctr": ("GDRCopyImage", "GDRCopyEnabled", "GDRCopyEnv"),
    "openshift-driver-toolkit-ctr": ("DTKImage", "DTKEnabled", ""),
}

Field = str | bool | list[str] | list[list[tuple[str, str | bool]]]


def fnv1a_32(data: bytes) -> int:
    h = _FNV_OFFSET
    for byte in data:
        h = ((h ^ byte) * _FNV_PRIME) & 0xFFFFFFFF
    return h


def _env(variables: Iterable[Mapping[str, Any]] | None) -> list[list[tuple[str, str | bool]]]:
    """Literal variables by name; downward-API ones and the digest itself do not count."""
    literal = [
        (str(v["name"]), str(v.get("value") or ""))
        for v in variables or ()
        if "valueFrom" not in v and v.get("name") != DIGEST_ENV
    ]
    return [[("Name", n), ("Value", value)] for n, value in sorted(literal, key=lambda x: x[0])]


def _mounts(mounts: Iterable[Mapping[str, Any]] | None) -> list[list[tuple[str, str | bool]]]:
    ordered = sorted(mounts or (), key=lambda m: (str(m["name"]), str(m["mountPath"])))
    return [
        [
            ("Name", str(m["name"])),
            ("MountPath", str(m["mountPath"])),
            ("SubPath", str(m.get("subPath") or "")),
            ("ReadOnly", bool(m.get("readOnly"))),
        ]
        for m in ordered
    ]


def _volumes(volumes: Iterable[Mapping[str, Any]] | None) -> list[list[tuple[str, str | bool]]]:
    ordered = sorted(volumes or (), key=lambda v: str(v["name"]))
    return [
        [
            ("Name", str(v["name"])),
            ("ConfigMapName", str((v.get("configMap") or {}).get("name") or "")),
            ("SecretName", str((v.get("secret") or {}).get("secretName") or "")),
            ("HostPath", str((v.get("hostPath") or {}).get("path") or "")),
        ]
        for v in ordered
    ]


def install_state(pod_spec: Mapping[str, Any]) -> dict[str, Field]:
    """The install-relevant facts of a driver pod spec, under upstream's field names."""
    state: dict[str, Field] = {}
    for c in pod_spec.get("initContainers") or ():
        if c.get("name") == MANAGER_CONTAINER:
            state["DriverManagerImage"] = str(c.get("image") or "")
            state["ManagerEnv"] = _env(c.get("env"))
    for c in pod_spec.get("containers") or ():
        name = c.get("name")
        if name == DRIVER_CONTAINER:
            state["DriverImage"] = str(c.get("image") or "")
            state["DriverCommand"] = [str(a) for a in c.get("command") or ()]
            state["DriverArgs"] = [str(a) for a in c.get("args") or ()]
            state["DriverEnv"] = _env(c.get("env"))
            for source in c.get("envFrom") or ():
                if source.get("secretRef"):
                    state["SecretEnvSource"] = str(source["secretRef"].get("name") or "")
            state["AdditionalVolumeMounts"] = _mounts(c.get("volumeMounts"))
        elif name in _SIDECARS:
            image_field, enabled_field, env_field = _SIDECARS[name]
            state[image_field] = str(c.get("image") or "")
            state[enabled_field] = True
            if env_field:
                state[env_field] = _env(c.get("env"))
    state["AdditionalVolumes"] = _volumes(pod_spec.get("volumes"))
    for v in pod_spec.get("volumes") or ():
        if v.get("name") == "host-root" and v.get("hostPath"):
            state["HostRoot"] = str(v["hostPath"].get("path") or "")
    return state


#: Go type names go-spew writes before each field, by field.
_GO_TYPES = {
    "ManagerEnv": "[]config.EnvVar",
    "DriverEnv": "[]config.EnvVar",
    "GDSEnv": "[]config.EnvVar",
    "GDRCopyEnv": "[]config.EnvVar",
    "AdditionalVolumeMounts": "[]config.VolumeMountConfig",
    "AdditionalVolumes": "[]config.VolumeConfig",
    "DriverCommand": "[]string",
    "DriverArgs": "[]string",
}


def _scalar(value: str | bool, typed: bool) -> str:
    text = ("true" if value else "false") if isinstance(value, bool) else value
    if not typed:
        return text
    return f"({'bool' if isinstance(value, bool) else 'string'}){text}"


def _spew(name: str, value: Field) -> str:
    """One field as go-spew's `%#v` writes it: the type in parentheses, slice elements
    untyped, struct fields `Name:` with typed values."""
    if not isinstance(value, list):
        return _scalar(value, typed=True)
    items: list[str] = []
    for item in value:
        if isinstance(item, str):
            items.append(item)
        else:
            items.append("{" + " ".join(f"{k}:{_scalar(v, typed=True)}" for k, v in item) + "}")
    return f"({_GO_TYPES[name]})[{' '.join(items)}]"


def _empty(value: Field) -> bool:
    return value in ("", False) or (isinstance(value, list) and not value)


def state_digest(state: Mapping[str, Field]) -> str:
    """The decimal digest of an install-state record: its non-empty fields, in name
    order, each as `Name:` and its go-spew form, through FNV-1a (upstream's
    `utils.GetObjectHashIgnoreEmptyKeys`)."""
    text = "".join(
        f"{name}:{_spew(name, state[name])}" for name in sorted(state) if not _empty(state[name])
    )
    return str(fnv1a_32(text.encode()))


def digest(pod_spec: Mapping[str, Any]) -> str:
    """The decimal `DRIVER_CONFIG_DIGEST` of a driver pod spec (its own value ignored)."""
    return state_digest(install_state(pod_spec))


def _spec_env(variables: Iterable[EnvVar] | None) -> list[list[tuple[str, str | bool]]]:
    """A resource's variables as upstream's record takes them from the resource: every
    one, as name and literal value (its API type has no other field), ordered by name.

    Upstream copies them in the resource's order (`toConfigEnvVars`) and sorts the
    copies by name just before hashing (`buildDriverInstallConfig`), so the order they
    are listed in does not count. A name listed twice keeps its two values in the
    resource's order: Python's sort is stable, and Go's `sort.Slice` sorts up to 12
    elements by insertion, stably (longer lists with repeated names may differ)."""
    pairs = [(v.name, v.value or "") for v in variables or ()]
    return [[("Name", n), ("Value", value)] for n, value in sorted(pairs, key=lambda x: x[0])]


def _image(pod_spec: Mapping[str, Any], name: str, init: bool = False) -> str:
    key = "initContainers" if init else "containers"
    for c in pod_spec.get(key) or ():
        if c.get("name") == name:
            return str(c.get("image") or "")
    return ""


def _config_volumes(spec: NVIDIADriverSpec) -> set[str]:
    """Names of the volumes (and their mounts) that upstream lists as the resource's
    additional configuration (`internal/state/driver_volumes.go`,
    `getDriverAdditionalConfigs`): repository and certificate ConfigMaps (compiled
    drivers only), kernel module parameters, licensing and virtual topology."""
    names: set[str] = set()
    if not spec.precompiled:
        if spec.repo_config and spec.repo_config.name:
            names.add(spec.repo_config.name)
        if spec.cert_config and spec.cert_config.name:
            names.add(spec.cert_config.name)
    if spec.kernel_module_config and spec.kernel_module_config.name:
        names.add(spec.kernel_module_config.name)
    licensing = spec.licensing_config
    if licensing and (licensing.name or licensing.secret_name):
        names.add(LICENSING_VOLUME)
    if spec.virtual_topology_config and spec.virtual_topology_config.name:
        names.add(TOPOLOGY_VOLUME)
    return names


def resource_install_state(
    spec: NVIDIADriverSpec,
    pod_spec: Mapping[str, Any],
    *,
    kernel: str | None = None,
    host_root: str = "/",
) -> dict[str, Field]:
    """The install-state record of one NVIDIADriver pool, filled as upstream fills it
    from the resource (`internal/state/driver.go`, `buildDriverInstallConfig`, over the
    render data `getManifestObjects` builds for the pool), not from the pod.

    ``pod_spec`` is the pool's rendered driver pod: it supplies the image references
    (driver, manager, GDS, GDRCopy, which upstream computes from the same fields the
    pod's images come from) and the additional configuration volumes and driver mounts,
    which our pod names as upstream's `driver_volumes.go` does. ``kernel`` is the pool's
    kernel (NFD's label, as is) for precompiled drivers; ``host_root`` the host root the
    controller hands the pool (the ClusterPolicy's `hostPaths.rootFS`).

    Counted: driver and manager images, driver type, kernel module type (`open` where
    the deprecated `useOpenKernelModules` asks for it, as our pod does), driver args,
    `secretEnv`, driver and manager env; the names of the licensing Secret (only a
    Secret: a licensing ConfigMap's name is not recorded), virtual topology, kernel
    module, repository and certificate configs; GPUDirect RDMA (enabled, nvidia-peermem
    from the driver image, host MOFED); GDS and GDRCopy only when the resource enables
    them (image, enabled, env); precompiled (the flag and the kernel); the host root;
    and the additional volumes and mounts. Upstream's OpenShift fields (cluster
    version, Driver Toolkit, proxy) stay empty: gpuop does not run on OpenShift.

    The subscription mounts of a compiled driver on RHEL (off CRI-O), SLES and SL Micro
    pools (`subscription-config-<n>` host paths) count with the additional volumes and
    mounts, as upstream lists them there; upstream's `lib-modules` mount for
    precompiled SUSE pools sits in a branch only compiled drivers reach, so neither
    pod nor record has it.
    Where two of the configs name one ConfigMap, upstream lists its volume twice (a pod
    the API server refuses) and our pod once; no running upstream driver has that digest.
    """
    state: dict[str, Field] = {}
    driver_image = _image(pod_spec, DRIVER_CONTAINER)
    state["DriverImage"] = driver_image
    state["DriverManagerImage"] = _image(pod_spec, MANAGER_CONTAINER, init=True)
    state["DriverType"] = spec.driver_type
    # upstream records `kernelModuleType` as is (it no longer reads the deprecated
    # useOpenKernelModules); our pod still honours that flag (KERNEL_MODULE_TYPE=open),
    # so the record takes the type the pod installs, which is upstream's whenever the
    # pod's is
    state["KernelModuleType"] = "open" if spec.use_open_kernel_modules else spec.kernel_module_type
    state["DriverArgs"] = list(spec.args or ())
    state["SecretEnvSource"] = spec.secret_env or ""
    state["DriverEnv"] = _spec_env(spec.env)
    state["ManagerEnv"] = _spec_env(spec.manager.env if spec.manager else None)
    licensing = spec.licensing_config
    state["LicensingConfigName"] = (licensing.secret_name or "") if licensing else ""
    for field_name, config in (
        ("VirtualTopologyConfig", spec.virtual_topology_config),
        ("KernelModuleConfig", spec.kernel_module_config),
        ("RepoConfig", spec.repo_config),
        ("CertConfig", spec.cert_config),
    ):
        state[field_name] = (config.name or "") if config else ""
    if spec.rdma and spec.rdma.enabled:
        state["GPUDirectRDMAEnabled"] = True
        state["PeermemImage"] = driver_image
        state["UseHostMOFED"] = spec.rdma.use_host_mofed
    # upstream's render data has GDS / GDRCopy only for a resource that enables them
    # (`getGDSSpec`, `getGDRCopySpec`); then they are recorded as enabled
    for sidecar, feature in (("nvidia-fs-ctr", spec.gds), ("nvidia-gdrcopy-ctr", spec.gdrcopy)):
        if feature is None or not feature.enabled:
            continue
        image_field, enabled_field, env_field = _SIDECARS[sidecar]
        state[image_field] = _image(pod_spec, sidecar)
        state[enabled_field] = True
        state[env_field] = _spec_env(feature.env)
    if spec.precompiled:
        state["UsePrecompiled"] = True
        state["KernelVersion"] = kernel or ""
    names = _config_volumes(spec) | {
        str(v.get("name"))
        for v in pod_spec.get("volumes") or ()
        if str(v.get("name")).startswith(f"{SUBSCRIPTION_VOLUME}-")
    }
    mounts = [
        m
        for c in pod_spec.get("containers") or ()
        if c.get("name") == DRIVER_CONTAINER
        for m in c.get("volumeMounts") or ()
        if m.get("name") in names
    ]
    state["AdditionalVolumeMounts"] = _mounts(mounts)
    state["AdditionalVolumes"] = _volumes(
        v for v in pod_spec.get("volumes") or () if v.get("name") in names
    )
    state["HostRoot"] = host_root
    return state


def resource_digest(
    spec: NVIDIADriverSpec,
    pod_spec: Mapping[str, Any],
    *,
    kernel: str | None = None,
    host_root: str = "/",
) -> str:
    """The decimal `DRIVER_CONFIG_DIGEST` of one NVIDIADriver pool's DaemonSet (see
    :func:`resource_install_state`); upstream's `ConfigDigest` of the pool's render
    data."""
    return state_digest(resource_install_state(spec, pod_spec, kernel=kernel, host_root=host_root))


def write_digest(pod_spec: dict[str, Any], value: str, containers: Sequence[str] = ()) -> None:
    """Write ``value`` into `DIGEST_ENV` of the manager and driver containers (and
    `containers`), where the variable is already listed."""
    names = {MANAGER_CONTAINER, DRIVER_CONTAINER, *containers}
    for c in [*(pod_spec.get("initContainers") or ()), *(pod_spec.get("containers") or ())]:
        if c.get("name") not in names:
            continue
        for var in c.get("env") or ():
            if var.get("name") == DIGEST_ENV:
                var["value"] = value


def with_digest(pod_spec: dict[str, Any], containers: Sequence[str] = ()) -> None:
    """Write the pod spec's own digest (:func:`digest`) into it: the ClusterPolicy
    driver's."""
    write_digest(pod_spec, digest(pod_spec), containers)
