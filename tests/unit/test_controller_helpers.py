"""Pure helpers of the controller: status patches, node trimming, pod classes."""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

import crd
from components import node_facts
from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import collection_path, item_path
from gpuop.operator.controller.views.node_views import is_ready, node_fingerprint, trim_node
from gpuop.operator.controller.views.upgrade_inputs import policy_view
from gpuop.operator.controller.writers.eviction import eviction_error
from gpuop.operator.controller.writers.status_write import status_patch


def test_status_patch_is_none_when_equal_and_nulls_removed_keys() -> None:
    same = {"state": "ready", "namespace": "gpu-operator"}
    assert status_patch(same, dict(same)) is None
    assert status_patch({"state": "ready", "old": 1}, {"state": "notReady"}) == {
        "status": {"state": "notReady", "old": None}
    }
    assert status_patch(None, {"state": "ready"}) == {"status": {"state": "ready"}}


def _node(**status: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "n",
            "uid": "u",
            "resourceVersion": "5",
            "labels": {"a": "b"},
            "annotations": {},
            "managedFields": [{"manager": "x"}],
        },
        "spec": {"podCIDR": "10.0.0.0/24", "unschedulable": True},
        "status": {
            "conditions": [
                {"type": "MemoryPressure", "status": "False"},
                {"type": "Ready", "status": "True", "lastHeartbeatTime": "t1"},
            ],
            "images": [{"names": ["big"] * 50}],
            "allocatable": {"nvidia.com/gpu": "8"},
            **status,
        },
    }


def test_trim_node_keeps_only_what_is_read() -> None:
    trimmed = trim_node(_node())
    assert "managedFields" not in trimmed["metadata"]
    assert "images" not in trimmed["status"]
    assert trimmed["spec"] == {"unschedulable": True}
    assert trimmed["status"]["conditions"] == [{"type": "Ready", "status": "True"}]
    assert is_ready(trimmed)


def test_heartbeats_do_not_change_the_fingerprint() -> None:
    a = trim_node(_node())
    b_raw = _node()
    b_raw["status"]["conditions"][1]["lastHeartbeatTime"] = "t2"
    b_raw["metadata"]["resourceVersion"] = "6"
    assert node_fingerprint(a) == node_fingerprint(trim_node(b_raw))
    c_raw = _node()
    c_raw["metadata"]["labels"]["nvidia.com/gpu.deploy.driver"] = "false"
    assert node_fingerprint(a) != node_fingerprint(trim_node(c_raw))


def test_labels_and_annotations_the_operator_never_reads_are_not_kept() -> None:
    raw = _node()
    raw["metadata"]["labels"].update(
        {
            "feature.node.kubernetes.io/cpu-cpuid.AVX512F": "true",
            "feature.node.kubernetes.io/pci-10de.present": "true",
            "nvidia.com/gpu.product": "A100",
            "topology.kubernetes.io/zone": "z1",
        }
    )
    raw["metadata"]["annotations"] = {
        "nvidia.com/gpu-driver-upgrade-requested": "true",
        "gpuop.io/driver-upgrade-reason": "r",
        "node.alpha.kubernetes.io/ttl": "0",
    }
    trimmed = trim_node(raw)
    assert set(trimmed["metadata"]["labels"]) == {
        "feature.node.kubernetes.io/pci-10de.present",
        "nvidia.com/gpu.product",
    }
    assert set(trimmed["metadata"]["annotations"]) == {
        "nvidia.com/gpu-driver-upgrade-requested",
        "gpuop.io/driver-upgrade-reason",
    }
    # A change to a label nobody reads wakes no reconcile.
    other = _node()
    other["metadata"]["labels"]["topology.kubernetes.io/zone"] = "z2"
    assert node_fingerprint(trim_node(_node())) == node_fingerprint(trim_node(other))


def test_eviction_error_names_the_budget() -> None:
    """A 429 from the Eviction API names the budget only in its causes."""
    err = ApiException(status=429, reason="Too Many Requests")
    err.body = (
        '{"kind":"Status","message":"Cannot evict pod as it would violate the pod\'s '
        'disruption budget.","reason":"TooManyRequests","details":{"causes":[{"reason":'
        '"DisruptionBudget","message":"The disruption budget guard needs 1 healthy pods '
        'and has 1 currently"}]},"code":429}'
    )
    assert eviction_error(err) == (
        "Cannot evict pod as it would violate the pod's disruption budget: "
        "The disruption budget guard needs 1 healthy pods and has 1 currently"
    )
    bare = ApiException(status=500, reason="Internal Server Error")
    assert eviction_error(bare) == "500 Internal Server Error"
    # gpuop.kube.rest raises with the response body as the reason: read there too.
    raised = ApiException(status=429, reason=err.body)
    assert eviction_error(raised) == eviction_error(err)


def test_policy_view_follows_the_spec() -> None:
    spec = crd.ClusterPolicy.model_validate(crd.sample_policy()).spec  # auto-upgrade on
    view = policy_view(spec)
    assert view.auto_upgrade is True
    assert view.max_parallel_upgrades == 1
    assert view.max_unavailable == "25%"
    assert view.drain.timeout_seconds == 300
    disabled = spec.model_copy(update={"driver": spec.driver.model_copy(update={"enabled": False})})
    assert policy_view(disabled).auto_upgrade is False


def test_rest_paths() -> None:
    ds = by_kind("apps/v1", "DaemonSet")
    assert item_path(ds, "x", "ns") == "/apis/apps/v1/namespaces/ns/daemonsets/x"
    node = by_kind("v1", "Node")
    assert item_path(node, "n", "ignored") == "/api/v1/nodes/n"
    assert collection_path(by_kind("nvidia.com/v1", "ClusterPolicy")) == (
        "/apis/nvidia.com/v1/clusterpolicies"
    )


def test_only_driver_and_validator_pods_are_watched() -> None:
    from gpuop.operator.controller.views.pod_records import pod_selector

    assert pod_selector("app.kubernetes.io/managed-by=gpuop") == (
        "app.kubernetes.io/managed-by=gpuop,"
        "app in (nvidia-driver-daemonset,nvidia-operator-validator)"
    )


def test_trimmed_node_keeps_the_facts_rendering_needs() -> None:
    """Driver image tag (OS), precompiled kernel and toolkit runtime come from the node."""
    raw = _node()
    raw["metadata"]["labels"].update(
        {
            "feature.node.kubernetes.io/system-os_release.ID": "ubuntu",
            "feature.node.kubernetes.io/system-os_release.VERSION_ID": "22.04",
            "feature.node.kubernetes.io/kernel-version.full": "5.15.0-124-generic",
            "feature.node.kubernetes.io/system-os_release.VERSION_CODENAME": "jammy",
        }
    )
    raw["status"]["nodeInfo"] = {
        "containerRuntimeVersion": "cri-o://1.30.2",
        "kernelVersion": "5.15.0-124-generic",
    }
    trimmed = trim_node(raw)
    assert (
        "feature.node.kubernetes.io/system-os_release.VERSION_CODENAME"
        not in (trimmed["metadata"]["labels"])
    )
    facts = node_facts(trimmed)
    assert (facts.os_tag, facts.kernel, facts.runtime) == (
        "ubuntu22.04",
        "5.15.0-124-generic",
        "crio",
    )
    other = trim_node({**raw, "status": {**raw["status"], "nodeInfo": {}}})
    assert node_fingerprint(other) != node_fingerprint(trimmed)


def test_trimmed_driver_pod_keeps_why_it_is_not_running() -> None:
    """The failure reason of a driver pod that never turns Ready names ImagePullBackOff."""
    from gpuop.operator.controller.views.pod_records import trim_pod

    raw = {
        "metadata": {"name": "d", "namespace": "gpu-operator", "uid": "u", "labels": {}},
        "spec": {"nodeName": "n"},
        "status": {
            "phase": "Pending",
            "containerStatuses": [
                {
                    "name": "c",
                    "restartCount": 0,
                    "state": {"waiting": {"reason": "ImagePullBackOff"}},
                },
                {"name": "r", "restartCount": 0, "state": {"running": {}}},
            ],
        },
    }
    assert trim_pod(raw).waiting == "ImagePullBackOff"
