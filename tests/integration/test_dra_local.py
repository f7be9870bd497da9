"""DRA on the local cluster: `cluster up` publishes each simulated GPU node's GPUs as
`gpu.nvidia.com` devices, and kube-scheduler really allocates them to claims."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio import client

from components import ObjectKind
from gpuop.devcluster import GPU_MODELS, node_manifest
from gpuop.devcluster._dra import DEVICE_CLASS, DRIVER, RESOURCE_SLICE, Published, publish
from gpuop.kube.kinds import KINDS, by_kind
from gpuop.kube.rest import Rest
from tests.conftest import TEST_GPU_NODES
from tests.integration.harness import NODE, eventually

pytestmark = pytest.mark.integration

POD = by_kind("v1", "Pod")
EVENT = by_kind("v1", "Event")
CLAIM = ObjectKind("resource.k8s.io/v1", "ResourceClaim", "resourceclaims", True)
CLAIM_TEMPLATE = ObjectKind(
    "resource.k8s.io/v1", "ResourceClaimTemplate", "resourceclaimtemplates", True
)

AT_LEAST_40GI = f'device.capacity["{DRIVER}"].memory.compareTo(quantity("40Gi")) >= 0'
AT_LEAST_1000GI = f'device.capacity["{DRIVER}"].memory.compareTo(quantity("1000Gi")) >= 0'
BIG_PRODUCTS = {m.product for m in GPU_MODELS if m.memory_mib >= 40 * 1024}
#: Half the session's GPU nodes are big: four pods all landing there by chance is 1 in 16.
PODS = 4


@pytest.fixture
def rest(api_client: client.ApiClient) -> Rest:
    return Rest(api_client, KINDS)


def _claim_spec(expression: str) -> dict[str, Any]:
    return {
        "devices": {
            "requests": [
                {
                    "name": "gpu",
                    "exactly": {
                        "deviceClassName": "gpu.nvidia.com",
                        "allocationMode": "ExactCount",
                        "count": 1,
                        "selectors": [{"cel": {"expression": expression}}],
                    },
                }
            ]
        }
    }


def _pod(name: str, claim: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {
                    "name": "cuda",
                    "image": "cuda-sample:simulated",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "resourceClaims": [{"name": "gpu", **claim}],
        },
    }


@pytest.fixture
async def published(rest: Rest) -> Published:
    """The simulator's pass, idempotent: puts back the DeviceClass should another
    module's GPUCluster have taken it away with itself (the slices are ours alone)."""
    return await publish(rest)


async def test_cluster_up_publishes_one_slice_per_gpu_node(rest: Rest) -> None:
    slices = [s for s in await rest.list(RESOURCE_SLICE) if s["spec"]["driver"] == DRIVER]
    by_node = {s["spec"]["nodeName"]: s for s in slices}
    assert len(slices) == len(by_node) == TEST_GPU_NODES
    for index in range(TEST_GPU_NODES):
        node = node_manifest(index, True)["metadata"]
        labels = node["labels"]
        spec = by_node[node["name"]]["spec"]
        assert spec["pool"]["name"] == node["name"]
        assert len(spec["devices"]) == int(labels["nvidia.com/gpu.count"])
        memory = {d["capacity"]["memory"]["value"] for d in spec["devices"]}
        assert len(memory) == 1  # the server's canonical form of the label's MiB
    # cluster up wrote every slice: a pass now finds them all in place
    first = await publish(rest)
    assert (first.created, first.replaced, first.deleted) == ((), (), ())
    assert await rest.get(DEVICE_CLASS, "gpu.nvidia.com") is not None
    again = Rest(rest.api, KINDS)
    assert await publish(again) == Published()
    assert again.writes == 0


async def test_a_claim_for_40gib_is_allocated_on_a_matching_node(
    rest: Rest, namespace: str, published: Published
) -> None:
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "big-gpu"},
        "spec": {"spec": _claim_spec(AT_LEAST_40GI)},
    }
    await rest.create(CLAIM_TEMPLATE, template, namespace)
    # several pods, so a selector the scheduler ignored could not pass by luck
    names = [f"trainer-{i}" for i in range(PODS)]
    for name in names:
        await rest.create(POD, _pod(name, {"resourceClaimTemplateName": "big-gpu"}), namespace)
    for name in names:
        await _check_allocated_on_a_big_gpu(rest, namespace, name)


async def _check_allocated_on_a_big_gpu(rest: Rest, namespace: str, name: str) -> None:
    async def running() -> dict[str, Any] | None:
        pod = await rest.get(POD, name, namespace)
        ok = pod and pod["spec"].get("nodeName") and pod["status"].get("phase") == "Running"
        return pod if ok else None

    pod = await eventually(running, timeout=60, what=f"{name} runs")
    node_name = pod["spec"]["nodeName"]
    node = await rest.get(NODE, node_name)
    assert node is not None
    assert node["metadata"]["labels"]["nvidia.com/gpu.product"] in BIG_PRODUCTS
    (status,) = pod["status"]["resourceClaimStatuses"]
    claim = await rest.get(CLAIM, status["resourceClaimName"], namespace)
    assert claim is not None
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["driver"] == DRIVER
    assert result["pool"] == node_name
    slice_ = await rest.get(RESOURCE_SLICE, f"{node_name}-{DRIVER}")
    assert slice_ is not None
    assert result["device"] in {d["name"] for d in slice_["spec"]["devices"]}
    assert [r["name"] for r in claim["status"]["reservedFor"]] == [name]


async def test_a_claim_nothing_matches_stays_pending_with_the_schedulers_reason(
    rest: Rest, namespace: str, published: Published
) -> None:
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "huge-gpu"},
        "spec": _claim_spec(AT_LEAST_1000GI),
    }
    await rest.create(CLAIM, claim, namespace)
    await rest.create(POD, _pod("dreamer", {"resourceClaimName": "huge-gpu"}), namespace)

    async def unschedulable() -> dict[str, Any] | None:
        pod = await rest.get(POD, "dreamer", namespace)
        conditions = (pod or {}).get("status", {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == "PodScheduled"), None)

    condition = await eventually(unschedulable, timeout=60, what="the scheduler's verdict")
    assert condition["status"] == "False"
    assert condition["reason"] == "Unschedulable"
    assert "cannot allocate all claims" in condition["message"]

    async def failed_scheduling() -> bool:
        events = await rest.list(EVENT, namespace, field_selector="involvedObject.name=dreamer")
        return any(e["reason"] == "FailedScheduling" for e in events)

    assert await eventually(failed_scheduling, timeout=30, what="a FailedScheduling event")
    pod = await rest.get(POD, "dreamer", namespace)
    assert pod is not None
    assert not pod["spec"].get("nodeName")
    stored = await rest.get(CLAIM, "huge-gpu", namespace)
    assert stored is not None
    assert "allocation" not in (stored.get("status") or {})


async def test_a_new_gpu_node_is_published_and_its_slice_goes_with_it(rest: Rest) -> None:
    node = node_manifest(100, True)  # an A100 node beyond the session's fleet
    name = node["metadata"]["name"]
    await rest.create(NODE, node)
    try:
        done = await publish(rest)
        assert done == Published(created=(f"{name}-{DRIVER}",))
        stored = await rest.get(RESOURCE_SLICE, f"{name}-{DRIVER}")
        assert stored is not None
        assert len(stored["spec"]["devices"]) == GPU_MODELS[0].count
    finally:
        await rest.delete(NODE, name)

    async def gone() -> bool:
        return await rest.get(RESOURCE_SLICE, f"{name}-{DRIVER}") is None

    assert await eventually(gone, timeout=60, what="the garbage collector removes the slice")
