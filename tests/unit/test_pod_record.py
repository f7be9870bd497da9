"""What the caches keep of an operand pod and a node: what their readers read, no more.

The pods cache keeps a :class:`PodRecord` per operand pod (six or seven per GPU node,
the most numerous objects the operator holds). Each field a reader uses must survive
the projection, and a change to anything no reader uses must leave the record equal
(so nothing unread is held). The fixtures are operand pods as the API server sent
them in a 1,000-node benchmark.
"""

from __future__ import annotations

import copy
import json
from dataclasses import fields
from pathlib import Path
from typing import Any

from components.driver import CONFIG_DIGEST_ENV
from gpuop.operator.controller.views.node_views import trim_node
from gpuop.operator.controller.views.pod_records import PodRecord, driver_pod_view, trim_pod
from gpuop.operator.controller.views.rollout_view import pod_facts
from statemachine.upgrade_keys import DRIVER_REVISION_LABEL

PODS: list[dict[str, Any]] = json.loads(
    (Path(__file__).parent.parent / "data" / "operand_pods.json").read_text()
)
DRIVER = PODS[1]


def test_the_record_names_exactly_the_fields_its_readers_use() -> None:
    assert {f.name for f in fields(PodRecord)} == {
        "key",
        "packed_uid",
        "packed_resource_version",
        "created",
        "deleting",
        "node",
        "labels",
        "phase",
        "ready",
        "restarts",
        "waiting",
        "config_digest",
    }


def test_a_recorded_driver_pod_keeps_what_the_rollout_and_the_upgrade_read() -> None:
    raw = copy.deepcopy(DRIVER)
    raw["spec"]["containers"][0]["env"] = [{"name": CONFIG_DIGEST_ENV, "value": "d1"}]
    raw["status"]["containerStatuses"][0]["restartCount"] = 2
    raw["status"]["containerStatuses"][0]["state"] = {"waiting": {"reason": "CrashLoopBackOff"}}
    pod = trim_pod(raw)
    meta = raw["metadata"]
    assert pod.key == f"{meta['namespace']}/{meta['name']}"
    assert (pod.name, pod.namespace) == (meta["name"], meta["namespace"])
    assert (pod.uid, pod.resource_version) == (meta["uid"], meta["resourceVersion"])
    assert pod.created == meta["creationTimestamp"]
    assert pod.node == raw["spec"]["nodeName"]
    assert pod.app == "nvidia-driver-daemonset"
    assert pod.labels[DRIVER_REVISION_LABEL] == meta["labels"][DRIVER_REVISION_LABEL]
    view = driver_pod_view(pod)
    assert view.uid == meta["uid"]
    assert view.revision_hash == meta["labels"][DRIVER_REVISION_LABEL]
    assert view.config_digest == "d1"
    assert view.restart_count == 2
    assert view.waiting_reason == "CrashLoopBackOff"
    assert view.running == (raw["status"]["phase"] == "Running")
    terminating = copy.deepcopy(raw)
    terminating["metadata"]["deletionTimestamp"] = "2026-11-24T05:00:00Z"
    assert trim_pod(terminating).deleting
    assert not pod.deleting
    assert pod_facts(trim_pod(terminating)) != pod_facts(pod)


def test_uid_and_resource_version_read_back_exactly_as_sent() -> None:
    """Both are kept as integers where they are a canonical UUID and an etcd revision
    (half the bytes); anything else is kept as sent, never altered."""
    for uid, rv in (
        ("97d7821c-498b-4c86-983c-800bb78030ae", "1234567"),
        ("97D7821C-498B-4C86-983C-800BB78030AE", "007"),
        ("not-a-uuid", "opaque/1"),
        ("", ""),
        ("00000000-0000-0000-0000-000000000000", "1"),
        ("97d7821c-498b-4c86-983c-800bb78030ag", "1"),  # not hex
        ("97d7821c-498b-4c86-983c-800bb780_0ae", "1"),  # int() would take the underscore
        ("+7d7821c-498b-4c86-983c-800bb78030ae", "1"),
        ("{97d7821c-498b-4c86-983c-800bb78030ae}", "1"),  # uuid.UUID reads it; kept as sent
        ("97d7821c498b4c86983c800bb78030ae", "1"),
    ):
        raw = copy.deepcopy(DRIVER)
        raw["metadata"]["uid"] = uid
        raw["metadata"]["resourceVersion"] = rv
        pod = trim_pod(raw)
        assert (pod.uid, pod.resource_version) == (uid, rv)
    packed = trim_pod(DRIVER)
    assert isinstance(packed.packed_uid, int)
    assert isinstance(packed.packed_resource_version, int)


def test_readiness_follows_the_ready_condition_only() -> None:
    raw = copy.deepcopy(DRIVER)
    ready = [c for c in raw["status"]["conditions"] if c["type"] == "Ready"]
    assert ready
    ready[0]["status"] = "True"
    assert trim_pod(raw).ready
    ready[0]["status"] = "False"
    assert not trim_pod(raw).ready
    raw["status"]["conditions"] = [{"type": "ContainersReady", "status": "True"}]
    assert not trim_pod(raw).ready


def test_unread_fields_leave_the_record_unchanged() -> None:
    """Big fields no reader uses (managedFields, the pod spec, owner references,
    annotations, container images and statuses beyond restarts and waiting) are not
    kept: changing them gives an equal record."""
    for raw in PODS:
        changed = copy.deepcopy(raw)
        meta = changed["metadata"]
        meta["managedFields"] = [{"manager": "x" * 10_000}]
        meta["annotations"] = {"big": "y" * 10_000}
        meta["ownerReferences"] = [{"kind": "DaemonSet", "name": "other", "uid": "u2"}]
        meta["generateName"] = "other-"
        spec = changed["spec"]
        spec["volumes"] = [{"name": "v", "hostPath": {"path": "/" + "z" * 1000}}]
        spec["tolerations"] = []
        for c in spec["containers"]:
            c["image"] = "registry.example/other:1"
            c["args"] = ["--big", "w" * 1000]
        for c in changed["status"].get("containerStatuses") or []:
            c["imageID"] = "sha256:" + "0" * 64
            c["image"] = "registry.example/other:1"
        changed["status"]["hostIP"] = "10.9.9.9"
        changed["status"]["podIPs"] = [{"ip": "10.9.9.9"}]
        assert trim_pod(changed) == trim_pod(raw)
        assert len(repr(trim_pod(changed))) < len(json.dumps(raw)) / 5


def test_pods_of_one_daemonset_revision_share_their_labels() -> None:
    a, b = copy.deepcopy(DRIVER), copy.deepcopy(DRIVER)
    b["metadata"]["name"] = "nvidia-driver-daemonset-other"
    b["metadata"]["uid"] = "another-uid"
    b["spec"]["nodeName"] = "another-node"
    assert trim_pod(a).labels is trim_pod(b).labels


def _node() -> dict[str, Any]:
    return {
        "metadata": {
            "name": "gpu-1",
            "uid": "u1",
            "resourceVersion": "5",
            "creationTimestamp": "2026-11-24T04:00:00Z",
            "labels": {
                "nvidia.com/gpu.present": "true",
                "feature.node.kubernetes.io/pci-10de.present": "true",
                "kubernetes.io/hostname": "gpu-1",
            },
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
            "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}],
        },
        "spec": {"unschedulable": True, "podCIDR": "10.0.0.0/24", "providerID": "kwok://gpu-1"},
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True", "lastHeartbeatTime": "2026-11-24T04:01:00Z"},
                {"type": "MemoryPressure", "status": "False"},
            ],
            "allocatable": {"nvidia.com/gpu": "8", "cpu": "64"},
            "capacity": {"nvidia.com/gpu": "8", "cpu": "64"},
            "nodeInfo": {"containerRuntimeVersion": "containerd://1.7", "kernelVersion": "6.1"},
            "images": [{"names": ["registry.example/image:1"], "sizeBytes": 1_000_000}] * 50,
            "volumesInUse": ["kubernetes.io/csi/x"],
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
        },
    }


def test_a_node_keeps_what_is_read_and_drops_images_and_managed_fields() -> None:
    node = trim_node(_node())
    assert node["metadata"]["labels"] == {
        "nvidia.com/gpu.present": "true",
        "feature.node.kubernetes.io/pci-10de.present": "true",
    }
    assert node["spec"] == {"unschedulable": True}
    assert node["status"]["conditions"] == [{"type": "Ready", "status": "True"}]
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert node["status"]["nodeInfo"] == {"containerRuntimeVersion": "containerd://1.7"}
    text = json.dumps(node)
    for dropped in ("managedFields", "images", "volumesInUse", "capacity", "hostname", "podCIDR"):
        assert dropped not in text
    bare = _node()
    for key in ("images", "volumesInUse", "addresses", "capacity"):
        del bare["status"][key]
    del bare["metadata"]["managedFields"]
    assert trim_node(bare) == node
