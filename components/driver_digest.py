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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

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


def digest(pod_spec: Mapping[str, Any]) -> str:
    """The decimal `DRIVER_CONFIG_DIGEST` of a driver pod spec (its own value ignored)."""
    state = install_state(pod_spec)
    text = "".join(
        f"{name}:{_spew(name, state[name])}" for name in sorted(state) if not _empty(state[name])
    )
    return str(fnv1a_32(text.encode()))


def with_digest(pod_spec: dict[str, Any], containers: Sequence[str] = ()) -> None:
    """Write the pod spec's digest into `DIGEST_ENV` of the manager and driver containers
    (and `containers`), where the variable is already listed."""
    value = digest(pod_spec)
    names = {MANAGER_CONTAINER, DRIVER_CONTAINER, *containers}
    for c in [*(pod_spec.get("initContainers") or ()), *(pod_spec.get("containers") or ())]:
        if c.get("name") not in names:
            continue
        for var in c.get("env") or ():
            if var.get("name") == DIGEST_ENV:
                var["value"] = value
