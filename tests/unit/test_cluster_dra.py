"""The simulated DRA publisher's slices, built from the simulated nodes' facts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuop.devcluster import GPU_MODELS, node_manifest
from gpuop.devcluster._dra import (
    DEVICE_CLASS_SELECTOR,
    DRIVER,
    MIG_CAPABLE_ATTRIBUTE,
    _same,
    desired_slices,
    device_class,
    model_of,
    resource_slice,
)
from gpuop.devcluster.nvml_fake import A100_SXM4_80GB, H100_80GB_HBM3, TESLA_T4, make_gpus

MiB = 1024 * 1024
RECORDED = Path(__file__).parents[1] / "conformance/upstream/gpucluster-default/rendered.yaml"


def _node(index: int, gpu: bool, uid: str = "uid-1") -> dict[str, Any]:
    node = node_manifest(index, gpu)
    node["metadata"]["uid"] = uid
    return node


@pytest.mark.parametrize("index", range(len(GPU_MODELS)))
def test_one_device_per_gpu_in_a_pool_named_after_the_node(index: int) -> None:
    model = GPU_MODELS[index]
    node = _node(index, True)
    name = node["metadata"]["name"]
    (slice_,) = desired_slices([node]).values()
    spec = slice_["spec"]
    assert spec["driver"] == DRIVER == "gpu.nvidia.com"
    assert spec["nodeName"] == name
    assert spec["pool"] == {"name": name, "generation": 1, "resourceSliceCount": 1}
    assert [d["name"] for d in spec["devices"]] == [f"gpu-{i}" for i in range(model.count)]
    assert len(spec["devices"]) == int(node["metadata"]["labels"]["nvidia.com/gpu.count"])
    for dev in spec["devices"]:
        memory = dev["capacity"]["memory"]["value"]
        assert memory == f"{node['metadata']['labels']['nvidia.com/gpu.memory']}Mi"
    assert slice_["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": name, "uid": "uid-1"}
    ]


def test_attributes_are_upstreams_with_their_types() -> None:
    a100, t4, h100, l4 = (desired_slices([_node(i, True)]) for i in range(4))
    dev = next(iter(a100.values()))["spec"]["devices"][0]
    attrs = dev["attributes"]
    assert attrs["type"] == {"string": "gpu"}
    assert attrs["productName"] == {"string": "NVIDIA A100-SXM4-80GB"}
    assert attrs["brand"] == {"string": "Nvidia"}
    assert attrs["architecture"] == {"string": "Ampere"}
    assert attrs["cudaComputeCapability"] == {"version": "8.0.0"}
    # the fake NVML's driver 595.91.07: a strict semantic version has no leading zero
    assert attrs["driverVersion"] == {"version": "595.91.7"}
    assert attrs["cudaDriverVersion"] == {"version": "13.0.0"}
    assert attrs["resource.kubernetes.io/pciBusID"] == {"string": "0000:01:00.0"}
    assert attrs[MIG_CAPABLE_ATTRIBUTE] == {"bool": True}
    t4_attrs = next(iter(t4.values()))["spec"]["devices"][0]["attributes"]
    assert t4_attrs["productName"] == {"string": "Tesla T4"}
    assert t4_attrs["architecture"] == {"string": "Turing"}
    assert t4_attrs["cudaComputeCapability"] == {"version": "7.5.0"}
    assert t4_attrs[MIG_CAPABLE_ATTRIBUTE] == {"bool": False}
    h100_attrs = next(iter(h100.values()))["spec"]["devices"][7]["attributes"]
    assert h100_attrs["productName"] == {"string": "NVIDIA H100 80GB HBM3"}
    assert h100_attrs["architecture"] == {"string": "Hopper"}
    l4_attrs = next(iter(l4.values()))["spec"]["devices"][1]["attributes"]
    assert l4_attrs["architecture"] == {"string": "Ada Lovelace"}
    assert l4_attrs["cudaComputeCapability"] == {"version": "8.9.0"}
    # the API server allows 32 attributes and capacities per device
    assert len(attrs) + len(dev["capacity"]) <= 32


def test_uuids_are_deterministic_distinct_and_the_fake_nvmls() -> None:
    node = _node(0, True)
    devices = next(iter(desired_slices([node]).values()))["spec"]["devices"]
    uuids = [d["attributes"]["uuid"]["string"] for d in devices]
    assert len(set(uuids)) == len(uuids) == 8
    again = next(iter(desired_slices([_node(0, True, uid="other")]).values()))["spec"]["devices"]
    assert [d["attributes"]["uuid"]["string"] for d in again] == uuids
    fake = make_gpus(*[A100_SXM4_80GB] * 8, seed=node["metadata"]["name"])
    assert [g.uuid for g in fake] == uuids
    other = next(iter(desired_slices([_node(4, True)]).values()))["spec"]["devices"]
    assert not {d["attributes"]["uuid"]["string"] for d in other} & set(uuids)


def test_product_names_and_memory_agree_with_the_fake_nvml_models() -> None:
    for index, fake in ((0, A100_SXM4_80GB), (1, TESLA_T4), (2, H100_80GB_HBM3)):
        dev = next(iter(desired_slices([_node(index, True)]).values()))["spec"]["devices"][0]
        assert dev["attributes"]["productName"]["string"] == fake.name
        assert dev["capacity"]["memory"]["value"] == f"{fake.memory_total_bytes // MiB}Mi"


def test_only_simulated_gpu_nodes_get_slices() -> None:
    cpu = _node(0, False)
    foreign = _node(1, True)
    del foreign["metadata"]["labels"]["gpuop.io/simulated"]
    legacy = _node(2, True)
    labels = legacy["metadata"]["labels"]
    labels["gpuop.dev/simulated"] = labels.pop("gpuop.io/simulated")
    assert model_of(cpu) is None
    assert model_of(foreign) is None
    assert model_of(legacy) == GPU_MODELS[2]
    assert list(desired_slices([cpu, foreign, legacy])) == ["gpu-node-0002-gpu.nvidia.com"]


def test_device_class_is_upstreams() -> None:
    cls = device_class()
    assert cls["metadata"] == {"name": "gpu.nvidia.com"}
    assert cls["spec"]["selectors"] == [
        {
            "cel": {
                "expression": "device.driver == 'gpu.nvidia.com' && "
                "device.attributes['gpu.nvidia.com'].type == 'gpu'"
            }
        }
    ]
    assert DEVICE_CLASS_SELECTOR in str(cls)
    # what NVIDIA's operator created for its sample GPUCluster
    recorded = next(
        d
        for d in yaml.safe_load_all(RECORDED.read_text())
        if d and d.get("kind") == "DeviceClass" and d["metadata"]["name"] == "gpu.nvidia.com"
    )
    assert cls["apiVersion"] == recorded["apiVersion"]
    assert cls["spec"] == recorded["spec"]


def test_a_stored_slice_as_the_server_writes_it_is_unchanged() -> None:
    wanted = resource_slice("gpu-node-0000", "uid-1", GPU_MODELS[0])
    stored = resource_slice("gpu-node-0000", "uid-1", GPU_MODELS[0], generation=3)
    for dev in stored["spec"]["devices"]:
        dev["capacity"]["memory"]["value"] = "80Gi"  # the server's canonical form
    assert _same(stored, wanted)
    fewer = resource_slice("gpu-node-0000", "uid-1", GPU_MODELS[0])
    fewer["spec"]["devices"].pop()
    assert not _same(fewer, wanted)
    recreated_node = resource_slice("gpu-node-0000", "uid-2", GPU_MODELS[0])
    assert not _same(recreated_node, wanted)


def test_cluster_up_publishes_unless_told_not_to() -> None:
    from gpuop.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["cluster", "up"]).dra is True
    assert parser.parse_args(["cluster", "up", "--no-dra"]).dra is False
