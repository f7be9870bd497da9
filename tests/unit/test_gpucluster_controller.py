"""The GPUCluster controller's decisions from cached state, with a recording API stand-in:
an invalid spec is a status condition written once (no crash, no apply, then no writes),
and a deleted GPUCluster drains its claim-holding DaemonSets in the foreground before
its finalizer goes. The real API server runs these in tests/integration/test_gpucluster.py."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from gpuop.kube.informer import Informer, Obj, ResourceSpec
from gpuop.operator.controller.base.result import Result
from gpuop.operator.controller.passes.gpucluster import (
    DRAIN_RETRY_S,
    FINALIZER,
    FOREGROUND,
    GPUClusters,
)

NS = "gpu-operator"
UID = "gc-uid"


class _Rest:
    """Records writes; answers a merge patch with the stored object patched."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, str, Any]] = []
        self.stored: dict[str, Obj] = {}

    def lister(self, kind: Any, namespace: str | None = None) -> Any:
        async def never(**_: Any) -> None:
            raise AssertionError("not listed in a unit test")

        return never

    async def get(self, kind: Any, name: str, namespace: str | None = None) -> Obj | None:
        return {
            "metadata": {"name": name, "labels": {"resource.kubernetes.io/admin-access": "true"}}
        }

    async def merge_patch(
        self,
        kind: Any,
        name: str,
        patch: Obj,
        namespace: str | None = None,
        subresource: str | None = None,
    ) -> Obj:
        self.writes.append(("patch", f"{kind.plural}/{subresource or ''}", patch))
        obj = copy.deepcopy(self.stored[name])
        if "status" in patch:
            obj["status"] = patch["status"]
        if "finalizers" in patch.get("metadata", {}):
            obj["metadata"]["finalizers"] = patch["metadata"]["finalizers"]
        obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
        self.stored[name] = obj
        return obj

    async def delete(
        self, kind: Any, name: str, namespace: str | None = None, body: Obj | None = None
    ) -> bool:
        self.writes.append(("delete", f"{kind.plural}/{name}", body))
        return True

    async def apply(self, obj: Obj) -> Obj:
        self.writes.append(("apply", obj["kind"], obj["metadata"]["name"]))
        return obj


class _Events:
    def __init__(self) -> None:
        self.reasons: list[str] = []

    async def record(self, involved: Obj, reason: str, message: str, warning: bool = False) -> None:
        self.reasons.append(reason)


def _controller(rest: _Rest, gpucluster: Obj, *daemonsets: Obj) -> tuple[GPUClusters, _Events]:
    events = _Events()
    policies = Informer(ResourceSpec("clusterpolicies", rest.lister(None)), lambda *_: None)
    ctl = GPUClusters(
        rest,  # type: ignore[arg-type]
        NS,
        policies,
        events,  # type: ignore[arg-type]
        "gpuop:test",
        on_cluster=lambda *_: None,
        on_object=lambda *_: None,
        on_known=lambda: None,
        on_listed=lambda: None,
    )
    rest.stored[gpucluster["metadata"]["name"]] = gpucluster
    ctl.clusters.store[gpucluster["metadata"]["name"]] = gpucluster
    for ds in daemonsets:
        ctl.owned["DaemonSet"].store[f"{NS}/{ds['metadata']['name']}"] = ds
    for informer in (*ctl.informers, policies):
        informer.synced.set()
    return ctl, events


def _gpucluster(spec: Obj, **meta: Any) -> Obj:
    return {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "GPUCluster",
        "metadata": {
            "name": "gpu-cluster",
            "uid": UID,
            "resourceVersion": "1",
            "generation": 1,
            "finalizers": [FINALIZER],
            **meta,
        },
        "spec": spec,
    }


def _daemonset(name: str, claims: bool, **meta: Any) -> Obj:
    pod: Obj = {"containers": [{"name": "c", "image": "i"}]}
    if claims:
        pod["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "t"}]
    owner = {"apiVersion": "nvidia.com/v1alpha1", "kind": "GPUCluster", "name": "gpu-cluster"}
    return {
        "metadata": {
            "name": name,
            "namespace": NS,
            "ownerReferences": [{**owner, "uid": UID, "controller": True}],
            **meta,
        },
        "spec": {"template": {"spec": pod}},
    }


def test_an_invalid_spec_is_a_condition_written_once_and_nothing_applied() -> None:
    rest = _Rest()
    ctl, _ = _controller(rest, _gpucluster({"draDriver": {"gpus": {"bogus": True}}}))
    asyncio.run(ctl.reconcile())
    ((verb, where, patch),) = rest.writes
    assert (verb, where) == ("patch", "gpuclusters/status")
    status = patch["status"]
    assert status["state"] == "notReady"
    error = next(c for c in status["conditions"] if c["type"] == "Error")
    assert (error["status"], error["reason"]) == ("True", "InvalidSpec")
    assert "draDriver.gpus.bogus" in error["message"]
    ctl.clusters.store["gpu-cluster"] = rest.stored["gpu-cluster"]  # the watch event
    asyncio.run(ctl.reconcile())
    assert len(rest.writes) == 1  # the same verdict again writes nothing


def test_delete_drains_claim_holders_in_the_foreground_then_releases() -> None:
    rest = _Rest()
    deleting = _gpucluster({"draDriver": {}}, deletionTimestamp="2026-01-01T00:00:00Z")
    plugin = _daemonset("nvidia-dra-driver-kubelet-plugin", claims=False)
    validator = _daemonset("nvidia-dra-validator", claims=True)
    exporter = _daemonset("nvidia-dcgm-exporter-dra", claims=True)
    ctl, events = _controller(rest, deleting, plugin, validator, exporter)

    # The pass says when it looks again (a backstop): it touches no queue.
    assert asyncio.run(ctl.reconcile()) == Result(DRAIN_RETRY_S)
    assert rest.writes == [
        ("delete", "daemonsets/nvidia-dra-validator", FOREGROUND),
        ("delete", "daemonsets/nvidia-dcgm-exporter-dra", FOREGROUND),
    ]
    assert events.reasons == ["DrainingClaimConsumers"]

    # Deleting (foreground: still there until their pods are gone): no second delete.
    for ds in (validator, exporter):
        key = f"{NS}/{ds['metadata']['name']}"
        ctl.owned["DaemonSet"].store[key] = {
            **ds,
            "metadata": {**ds["metadata"], "deletionTimestamp": "2026-01-01T00:00:01Z"},
        }
    asyncio.run(ctl.reconcile())
    assert len(rest.writes) == 2
    assert events.reasons == ["DrainingClaimConsumers"]

    # Gone: the finalizer goes; the plugin is left to garbage collection.
    for ds in (validator, exporter):
        del ctl.owned["DaemonSet"].store[f"{NS}/{ds['metadata']['name']}"]
    assert asyncio.run(ctl.reconcile()) == Result()  # released: only news wakes it
    verb, where, patch = rest.writes[-1]
    assert (verb, where) == ("patch", "gpuclusters/")
    assert patch["metadata"]["finalizers"] == []
    assert not [w for w in rest.writes if "kubelet-plugin" in w[1]]


class _MonitoringRest(_Rest):
    """Serves (or not) the Prometheus Operator's ServiceMonitor kind; counts the asks."""

    def __init__(self, served: bool) -> None:
        super().__init__()
        self.served = served
        self.asked = 0

    async def api_resource_exists(self, api_version: str, plural: str) -> bool:
        assert (api_version, plural) == ("monitoring.coreos.com/v1", "servicemonitors")
        self.asked += 1
        return self.served


_MONITORED = {
    "draDriver": {},
    "dcgmExporter": {
        "enabled": True,
        "serviceMonitor": {"enabled": True, "additionalLabels": {"release": "prom"}},
    },
    "daemonsets": {"updateStrategy": "OnDelete"},  # upstream's DRA manifests never read it
}


def _status_writes(rest: _Rest) -> list[Obj]:
    return [p["status"] for verb, where, p in rest.writes if where == "gpuclusters/status"]


def test_unsupported_fields_are_a_condition_and_one_warning_per_generation() -> None:
    rest = _MonitoringRest(served=True)
    ctl, events = _controller(rest, _gpucluster(_MONITORED))
    asyncio.run(ctl.reconcile())
    (status,) = _status_writes(rest)
    condition = next(c for c in status["conditions"] if c["type"] == "UnsupportedFields")
    assert condition["status"] == "True"
    assert condition["observedGeneration"] == 1
    assert "spec.daemonsets.updateStrategy (no effect" in condition["message"]
    assert events.reasons == ["FieldsNotActedOn"]
    ctl.clusters.store["gpu-cluster"] = rest.stored["gpu-cluster"]  # the watch event
    asyncio.run(ctl.reconcile())
    assert len(_status_writes(rest)) == 1  # the same verdict again writes nothing
    assert events.reasons == ["FieldsNotActedOn"]
    assert rest.asked == 1  # discovery once per generation


def test_a_spec_we_honour_whole_has_no_unsupported_condition() -> None:
    rest = _MonitoringRest(served=False)
    ctl, events = _controller(rest, _gpucluster({"draDriver": {}}))
    asyncio.run(ctl.reconcile())
    (status,) = _status_writes(rest)
    assert "UnsupportedFields" not in [c["type"] for c in status["conditions"]]
    assert events.reasons == []
    # Discovery once per generation even with no ServiceMonitor wanted: where the kind
    # is served it is watched, so one switched off is pruned (after a restart too).
    assert rest.asked == 1


def test_the_exporter_service_monitor_is_applied_only_where_the_kind_is_served() -> None:
    for served in (True, False):
        rest = _MonitoringRest(served=served)
        ctl, _ = _controller(rest, _gpucluster(_MONITORED))
        asyncio.run(ctl.reconcile())
        applied = [(kind, name) for verb, kind, name in rest.writes if verb == "apply"]
        assert (("ServiceMonitor", "nvidia-dcgm-exporter-dra") in applied) is served
