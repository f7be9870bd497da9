"""Simulated DRA for the local cluster: what NVIDIA's DRA kubelet plugin would publish.

On a real node the plugin (github.com/NVIDIA/k8s-dra-driver-gpu) asks NVML for its
GPUs and keeps one ``ResourceSlice`` per node up to date for driver
``gpu.nvidia.com``: one device per full GPU (``gpu-0``, ``gpu-1``, ...) with its
UUID, product name, brand, architecture, CUDA compute capability, driver versions
and PCI placement as attributes and its memory as capacity. A simulated node has
no plugin, so kube-scheduler would find nothing to allocate; this module writes
the same slices from the facts the node was created with (``_nodes.GPU_MODELS``).

A static publisher is enough here: a simulated GPU never changes, fails or gets
re-partitioned, so the slice written once at ``cluster up`` stays true for the
node's life. It is re-applied idempotently (unchanged slices are left alone), and
each slice is owned by its Node, so the garbage collector removes it with the
node. The simulator lives in the local-cluster package only: the operator never
imports it, and nothing here runs against a real cluster.
"""

from __future__ import annotations

import asyncio
import uuid as uuidlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from components import ObjectKind
from gpuop.devcluster.nvml_fake import DEFAULT_CUDA_VERSION, DEFAULT_DRIVER_VERSION
from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Obj, Rest

from ._nodes import GPU_MODELS, LEGACY_SIMULATED_LABEL, SIMULATED_LABEL, GpuModel

DRIVER = "gpu.nvidia.com"
"""The driver name NVIDIA's plugin registers; also its DeviceClass's name."""
DEVICE_CLASS_NAME = "gpu.nvidia.com"
#: Upstream's selector for full GPUs (MIG and VFIO devices share the driver).
DEVICE_CLASS_SELECTOR = (
    f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'gpu'"
)
#: gpuop's own attribute (upstream publishes none for it): whether the GPU could be
#: split into MIG devices, so a claim can ask for a MIG-capable part.
MIG_CAPABLE_ATTRIBUTE = "gpuop.io/migCapable"
#: Where a real plugin gets its PCI placement attributes (Kubernetes' standard names).
PCI_BUS_ID_ATTRIBUTE = "resource.kubernetes.io/pciBusID"
PCIE_ROOT_ATTRIBUTE = "resource.kubernetes.io/pcieRoot"

RESOURCE_SLICE = ObjectKind("resource.k8s.io/v1", "ResourceSlice", "resourceslices", False)
DEVICE_CLASS = ObjectKind("resource.k8s.io/v1", "DeviceClass", "deviceclasses", False)

_PRODUCT_LABEL = "nvidia.com/gpu.product"
#: NVML's names for the simulated models (GPU feature discovery's label replaces the
#: spaces with dashes, so the label alone cannot be turned back into the name).
_NVML_NAMES = {
    "NVIDIA-A100-SXM4-80GB": "NVIDIA A100-SXM4-80GB",
    "Tesla-T4": "Tesla T4",
    "NVIDIA-H100-80GB-HBM3": "NVIDIA H100 80GB HBM3",
    "NVIDIA-L4": "NVIDIA L4",
}


def _semver(version: str) -> str:
    """A strict semantic version, as the API server requires of version attributes
    (NVIDIA's ``595.91.07`` has a leading zero; ``8.0`` lacks a patch)."""
    parts = [str(int(p)) for p in version.split(".")]
    return ".".join([*parts, "0", "0"][:3])


def gpu_uuid(node: str, index: int) -> str:
    """The same UUID the fake NVML gives GPU ``index`` of a node seeded with its name."""
    return f"GPU-{uuidlib.uuid5(uuidlib.NAMESPACE_OID, f'{node}/{index}')}"


def device(node: str, model: GpuModel, index: int) -> dict[str, Any]:
    """One full GPU, with the attributes and capacity upstream's plugin publishes."""
    attributes: dict[str, dict[str, Any]] = {
        "type": {"string": "gpu"},
        "uuid": {"string": gpu_uuid(node, index)},
        "productName": {"string": _NVML_NAMES.get(model.product, model.product)},
        "brand": {"string": "Nvidia"},
        "architecture": {"string": model.family.replace("-", " ").title()},
        "cudaComputeCapability": {
            "version": _semver(f"{model.compute_major}.{model.compute_minor}")
        },
        "driverVersion": {"version": _semver(DEFAULT_DRIVER_VERSION)},
        "cudaDriverVersion": {
            "version": _semver(f"{DEFAULT_CUDA_VERSION.major}.{DEFAULT_CUDA_VERSION.minor}")
        },
        PCI_BUS_ID_ATTRIBUTE: {"string": f"0000:{index + 1:02x}:00.0"},
        PCIE_ROOT_ATTRIBUTE: {"string": "pci0000:00"},
        MIG_CAPABLE_ATTRIBUTE: {"bool": model.mig_capable},
    }
    return {
        "name": f"gpu-{index}",
        "attributes": attributes,
        "capacity": {"memory": {"value": f"{model.memory_mib}Mi"}},
    }


def slice_name(node: str) -> str:
    """Fixed per node (the real plugin's carry a random suffix), so re-applying finds it."""
    return f"{node}-{DRIVER}"


def resource_slice(node: str, node_uid: str, model: GpuModel, generation: int = 1) -> Obj:
    """The node's only slice of its pool (pool = node name, as the plugin names it),
    owned by the Node so it goes when the node goes."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {
            "name": slice_name(node),
            "labels": {SIMULATED_LABEL: "true"},
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}
            ],
        },
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": [device(node, model, i) for i in range(model.count)],
        },
    }


def device_class() -> Obj:
    """Upstream's ``gpu.nvidia.com`` class, less the GPUCluster owner and state label it
    has there, and with no label of ours: a GPUCluster that applies its own class over
    this one ends up with exactly upstream's object."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DEVICE_CLASS_NAME},
        "spec": {"selectors": [{"cel": {"expression": DEVICE_CLASS_SELECTOR}}]},
    }


def model_of(node: Mapping[str, Any]) -> GpuModel | None:
    """The simulated model of a Node object, from its product label; ``None`` for a
    node that is not one of ours or has no GPU."""
    labels: Mapping[str, str] = node.get("metadata", {}).get("labels") or {}
    if "true" not in (labels.get(SIMULATED_LABEL), labels.get(LEGACY_SIMULATED_LABEL)):
        return None
    product = labels.get(_PRODUCT_LABEL)
    return next((m for m in GPU_MODELS if m.product == product), None)


def desired_slices(nodes: Iterable[Mapping[str, Any]]) -> dict[str, Obj]:
    """Slice name -> slice, for every simulated GPU node among ``nodes``."""
    wanted: dict[str, Obj] = {}
    for node in nodes:
        model = model_of(node)
        if model is not None:
            meta = node["metadata"]
            wanted[slice_name(meta["name"])] = resource_slice(meta["name"], meta["uid"], model)
    return wanted


def _same(existing: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Whether a stored slice already says what we would write (pool generation aside)."""
    have, want = existing.get("spec", {}), wanted["spec"]
    return (
        have.get("driver") == want["driver"]
        and have.get("nodeName") == want["nodeName"]
        and have.get("pool", {}).get("name") == want["pool"]["name"]
        and _devices(have.get("devices") or []) == _devices(want["devices"])
        and (existing.get("metadata", {}).get("ownerReferences") or [{}])[0].get("uid")
        == wanted["metadata"]["ownerReferences"][0]["uid"]
    )


def _devices(devices: list[Mapping[str, Any]]) -> list[tuple[str, Any, Any]]:
    """Devices compared by name, attributes and memory (the server writes ``80Gi``
    for our ``81920Mi``, so memory is compared in bytes)."""
    return [
        (
            d["name"],
            d.get("attributes"),
            _bytes(str(d.get("capacity", {}).get("memory", {}).get("value", "0"))),
        )
        for d in devices
    ]


_SUFFIXES = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}


def _bytes(quantity: str) -> int:
    for suffix, factor in _SUFFIXES.items():
        if quantity.endswith(suffix):
            return int(quantity[: -len(suffix)]) * factor
    return int(quantity)


@dataclass(frozen=True)
class Published:
    """What one pass wrote: slice names created, replaced and deleted."""

    created: tuple[str, ...] = ()
    replaced: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()


async def publish(rest: Rest, concurrency: int = 32) -> Published:
    """Make the cluster's ``gpu.nvidia.com`` slices match its simulated GPU nodes.

    Creates the DeviceClass when missing (one an installed DRA driver made is left
    as it is), creates missing slices, replaces changed ones with the pool's
    generation raised, deletes ours for nodes that are no longer simulated GPU
    nodes, and writes nothing when all is in place."""
    if await rest.get(DEVICE_CLASS, DEVICE_CLASS_NAME) is None:
        await rest.create(DEVICE_CLASS, device_class())
    nodes = await rest.list(by_kind("v1", "Node"))
    wanted = desired_slices(nodes)
    ours = {
        s["metadata"]["name"]: s
        for s in await rest.list(RESOURCE_SLICE, label_selector=f"{SIMULATED_LABEL}=true")
        if s.get("spec", {}).get("driver") == DRIVER
    }
    sem = asyncio.Semaphore(concurrency)
    created: list[str] = []
    replaced: list[str] = []

    async def put(name: str, body: Obj) -> None:
        async with sem:
            existing = ours.get(name)
            if existing is None:
                await rest.create(RESOURCE_SLICE, body)
                created.append(name)
            elif not _same(existing, body):
                body["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
                pool = body["spec"]["pool"]
                pool["generation"] = int(existing["spec"]["pool"].get("generation", 0)) + 1
                await rest.replace(RESOURCE_SLICE, body)
                replaced.append(name)

    async def drop(name: str) -> None:
        async with sem:
            await rest.delete(RESOURCE_SLICE, name)

    gone = sorted(set(ours) - set(wanted))
    await asyncio.gather(*(put(n, b) for n, b in wanted.items()), *(drop(n) for n in gone))
    return Published(tuple(sorted(created)), tuple(sorted(replaced)), tuple(gone))
