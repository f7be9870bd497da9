"""A rollback's first fleet pass may see the reverted template before the revision the
DaemonSet controller renumbers for it (two watches, no order between them): the gate
then decides nothing, so the old driver's rollout never inherits the new one's halt.

Seen once in CI (``test_upgrade_rollback``): the canary failed, the rollout halted and
the rollback reverted the driver DaemonSet; a fleet pass ran after the DaemonSet's
event but before its ControllerRevision's, so the template's digest was the old
driver's while the newest revision was still the new one. That pass started a record
keyed by the old driver's digest and counted the canary, failed at the "newest"
revision, against it: halted. Every later pass read the same digest, so the canary,
back in ``upgrade-required``, stayed held under the halt of the driver it no longer
ran.
"""

from __future__ import annotations

import copy
from typing import Any, cast

import pytest
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import CollectorRegistry

import crd
from components.driver import CONFIG_DIGEST_ENV
from components.driver import DAEMONSET_NAME as DRIVER_DS
from gpuop.kube.informer import Informer, ResourceSpec
from gpuop.operator.controller.passes.node import NodeReconciler
from gpuop.operator.controller.views.driver_owners import DriverOwners
from gpuop.operator.controller.views.node_views import trim_node
from gpuop.operator.controller.views.pod_records import pod_index, trim_pod, trim_revision
from gpuop.operator.controller.views.upgrade_inputs import newest_revision, revision_lags
from gpuop.operator.controller.writers.rollout_gate import RolloutGate
from gpuop.operator.controller.writers.upgrade import Upgrades
from gpuop.operator.events import EventRecorder
from gpuop.operator.metrics import OperatorMetrics
from statemachine.rollback import ROLLBACK_ANNOTATION, RollbackRecord
from statemachine.rollout_gate import (
    RECORD_ANNOTATION,
    GateNode,
    GatePhase,
    GatePolicy,
    GateRecord,
    plan_gate,
)
from statemachine.upgrade_keys import (
    FAILED_REVISION_ANNOTATION,
    IN_PROGRESS_STATES,
    REPLACE_POD_ANNOTATION,
    STATE_LABEL,
    UpgradeState,
)
from tests.factories import node, operand_pod

Obj = dict[str, Any]
NS = "gpu-operator"
OLD, NEW = "rev-old", "rev-new"
OLD_DIGEST, NEW_DIGEST = "d-old", "d-new"
GPU = ["n0", "n1", "n2", "n3"]
UPGRADE_POLICY = {
    "autoUpgrade": True,
    "maxParallelUpgrades": 1,
    "maxUnavailable": "100%",
    "haltAfterFailures": 1,
    "canary": {"nodes": 1},
    "rollbackOnHalt": True,
    "drain": {"enable": False},
}


async def _never(**_: Any) -> None:
    raise AssertionError("not listed")


def _cache(name: str, **spec: Any) -> Informer[Any]:
    return Informer(ResourceSpec(name, _never, **spec), lambda *_: None)


def _template(digest: str) -> Obj:
    env = [{"name": CONFIG_DIGEST_ENV, "value": digest}]
    return {"spec": {"containers": [{"name": "nvidia-driver-ctr", "env": env}]}}


def _daemonset(digest: str, generation: int) -> Obj:
    return {
        "metadata": {
            "name": DRIVER_DS,
            "namespace": NS,
            "uid": "ds",
            "generation": generation,
            "resourceVersion": str(10 * generation),
        },
        "spec": {"template": _template(digest)},
    }


def _revision(hash_: str, digest: str, number: int) -> Obj:
    """A ControllerRevision as the API server holds it (the cache trims it)."""
    return {
        "metadata": {
            "name": f"{DRIVER_DS}-{hash_}",
            "namespace": NS,
            "resourceVersion": str(100 + number),
            "labels": {"controller-revision-hash": hash_},
            "ownerReferences": [{"kind": "DaemonSet", "name": DRIVER_DS, "uid": "ds"}],
        },
        "data": {"spec": {"template": {**_template(digest), "$patch": "replace"}}},
        "revision": number,
    }


def _halted_policy() -> Obj:
    """The ClusterPolicy right after the rollback started: the new driver's rollout
    halted by the canary's failure, and the record of the way back."""
    record = GateRecord(
        revision=NEW, digest=NEW_DIGEST, canary=("n0",), failed=("n0",), halted=True
    )
    rollback = RollbackRecord(key=NEW_DIGEST, revisions={DRIVER_DS: OLD})
    return {
        "apiVersion": "nvidia.com/v1",
        "kind": "ClusterPolicy",
        "metadata": {
            "name": "cluster-policy",
            "resourceVersion": "1",
            "annotations": {
                RECORD_ANNOTATION: record.dumps(),
                ROLLBACK_ANNOTATION: rollback.dumps(),
            },
        },
        "spec": {},
    }


def _merge(values: dict[str, Any], patch: dict[str, Any] | None) -> None:
    for key, value in (patch or {}).items():
        if value is None:
            values.pop(key, None)
        else:
            values[key] = value


class _Server:
    """The nodes and the ClusterPolicy as the API server holds them (merge patches,
    the nodes' guarded by resourceVersion); Events are taken and dropped."""

    def __init__(self, nodes: dict[str, Obj], policy: Obj) -> None:
        self.objects: dict[str, Obj] = {**nodes, "cluster-policy": policy}

    async def merge_patch(self, kind: Any, name: str, patch: Obj, **kw: Any) -> Obj:
        obj = copy.deepcopy(self.objects[name])
        meta, pmeta = obj["metadata"], patch.get("metadata") or {}
        if "resourceVersion" in pmeta and pmeta["resourceVersion"] != meta["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        if kw.get("subresource") == "status":
            obj["status"] = {**(obj.get("status") or {}), **patch["status"]}
        else:
            _merge(meta.setdefault("labels", {}), pmeta.get("labels"))
            _merge(meta.setdefault("annotations", {}), pmeta.get("annotations"))
            _merge(obj.setdefault("spec", {}), patch.get("spec"))
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
        self.objects[name] = obj
        return copy.deepcopy(obj)

    async def get(self, kind: Any, name: str, namespace: str | None = None) -> Obj:
        return copy.deepcopy(self.objects[name])

    async def create(self, *_: Any, **__: Any) -> Obj:
        return {}

    def state(self, name: str) -> str:
        return str(self.objects[name]["metadata"]["labels"].get(STATE_LABEL))

    def record(self) -> GateRecord | None:
        annotations = self.objects["cluster-policy"]["metadata"]["annotations"]
        return GateRecord.loads(annotations.get(RECORD_ANNOTATION))


class _Queue:
    def __init__(self) -> None:
        self.added: list[str] = []

    def add(self, key: str) -> None:
        self.added.append(key)


class Fleet:
    """The operator's caches, its fleet pass (real: gate, rollback, budget), and the API
    server it writes to; the test delivers the watch events one by one."""

    def __init__(self) -> None:
        nodes = {
            # The canary: failed at the new driver, cordoned, no driver pod (it could not start).
            "n0": _node("n0", "upgrade-failed", unschedulable=True, failed_at=NEW),
            # The rest: held by the halt, still on the old driver.
            **{n: _node(n, "upgrade-required") for n in GPU[1:]},
        }
        self.server = _Server(nodes, _halted_policy())
        self.nodes = _cache("nodes", transform=trim_node)
        self.pods = _cache("pods", transform=trim_pod, index=pod_index)
        self.daemonsets = _cache("daemonsets")
        self.revisions = _cache("controllerrevisions", transform=trim_revision)
        self.policies = _cache("clusterpolicies")
        drivers = _cache("nvidiadrivers")
        drivers.synced.set()
        for obj in nodes.values():
            self.nodes.observe(obj)
        for name in GPU[1:]:
            self.pods.observe(operand_pod(DRIVER_DS, name, OLD, uid=f"uid-{name}"))
        self.policies.observe(self.server.objects["cluster-policy"])
        # What the caches held while the new driver's rollout halted.
        self.daemonsets.observe(_daemonset(NEW_DIGEST, generation=2))
        self.revisions.observe(_revision(OLD, OLD_DIGEST, 1))
        self.revisions.observe(_revision(NEW, NEW_DIGEST, 2))

        spec = crd.ClusterPolicySpec.model_validate({"driver": {"upgradePolicy": UPGRADE_POLICY}})
        model = crd.ClusterPolicy(metadata={"name": "cluster-policy"}, spec=spec)
        rest = cast(Any, self.server)
        metrics = OperatorMetrics(CollectorRegistry())
        events = EventRecorder(rest)
        owners = DriverOwners(drivers, self.nodes, self.daemonsets, lambda: spec)
        upgrades = Upgrades(
            rest,
            metrics,
            events,
            NS,
            pods=self.pods,
            revisions=self.revisions,
            daemonsets=self.daemonsets,
            nodes=self.nodes,
            owners=owners,
        )
        self.queue = _Queue()
        self.passes = NodeReconciler(
            rest=rest,
            nodes=self.nodes,
            queue=cast(Any, self.queue),
            active_policy=lambda: (self.policies.get("cluster-policy"), model, []),
            upgrades=upgrades,
            gate=RolloutGate(rest, metrics, events, self.policies),
            owners=owners,
            workloads=cast(Any, None),
        )

    # --------------------------------------------------------- the watch events
    def daemonset_reverted(self) -> None:
        """The rollback's apply: the template of the old driver again (generation 3)."""
        self.daemonsets.observe(_daemonset(OLD_DIGEST, generation=3))

    def revision_renumbered(self) -> None:
        """The DaemonSet controller found the old template's revision and made it the
        newest (a revert reuses a revision: its number is bumped)."""
        self.revisions.observe(_revision(OLD, OLD_DIGEST, 3))

    async def node_passes_followed(self) -> None:
        """What the node passes wrote once the revert was current: the held nodes run
        the newest driver (done), the canary is retried (its driver changed again) and,
        its taint gone, the old driver's pod is back on it."""
        for name in GPU[1:]:
            await self._set_state(name, "upgrade-done")
        await self._set_state("n0", "upgrade-required")
        self.pods.observe(operand_pod(DRIVER_DS, "n0", OLD, uid="uid-n0"))

    async def _set_state(self, name: str, state: str) -> None:
        patch = {"metadata": {"labels": {STATE_LABEL: state}}}
        self.nodes.observe(await self.server.merge_patch(None, name, patch))

    async def fleet_pass(self) -> None:
        await self.passes.reconcile_upgrades()


def _node(name: str, state: str, *, unschedulable: bool = False, failed_at: str = "") -> Obj:
    annotations = {}
    if failed_at:  # what its upgrade recorded: where it failed, the pod it replaced
        annotations = {FAILED_REVISION_ANNOTATION: failed_at, REPLACE_POD_ANNOTATION: "uid-gone"}
    labels = {STATE_LABEL: state}
    return node(
        name, labels, annotations=annotations, gpu=True, ready=True, unschedulable=unschedulable
    )


@pytest.mark.parametrize("first", ["daemonset", "revision"])
async def test_the_canary_goes_back_whichever_watch_event_comes_first(first: str) -> None:
    fleet = Fleet()
    if first == "daemonset":
        fleet.daemonset_reverted()
    else:
        fleet.revision_renumbered()
    # A fleet pass between the two events (woken by anything: a pass marked to run again).
    await fleet.fleet_pass()
    record = fleet.server.record()
    assert record is not None
    assert record.digest == NEW_DIGEST, "a record was started from a revision of another driver"
    assert fleet.server.state("n0") == "upgrade-failed"

    # The other event; the node passes follow the revert.
    if first == "daemonset":
        fleet.revision_renumbered()
    else:
        fleet.daemonset_reverted()
    await fleet.node_passes_followed()
    await fleet.fleet_pass()

    # The old driver's rollout is a new one, not halted: the canary gets its slot back.
    record = fleet.server.record()
    assert record is not None
    assert (record.digest, record.halted) == (OLD_DIGEST, False)
    assert UpgradeState(fleet.server.state("n0")) in IN_PROGRESS_STATES
    assert "node/n0" in fleet.queue.added


async def test_a_pass_before_the_revision_holds_the_candidates_and_writes_nothing() -> None:
    fleet = Fleet()
    fleet.daemonset_reverted()
    before = copy.deepcopy(fleet.server.objects["cluster-policy"])
    await fleet.fleet_pass()
    assert fleet.server.objects["cluster-policy"] == before
    assert all(fleet.server.state(n) == "upgrade-required" for n in GPU[1:])


# ------------------------------------------------------------------- the pieces


def test_the_trimmed_revision_keeps_the_digest_its_template_installs() -> None:
    trimmed = trim_revision(_revision(OLD, OLD_DIGEST, 1))
    assert trimmed["configDigest"] == OLD_DIGEST
    assert "data" not in trimmed


def test_a_revision_lags_only_when_both_digests_are_known_and_differ() -> None:
    revisions = [trim_revision(_revision(OLD, OLD_DIGEST, 1))]
    revisions.append(trim_revision(_revision(NEW, NEW_DIGEST, 2)))
    assert newest_revision(_daemonset(OLD_DIGEST, 3), revisions) == NEW
    assert revision_lags(_daemonset(OLD_DIGEST, 3), revisions)
    assert not revision_lags(_daemonset(NEW_DIGEST, 2), revisions)
    undigested = [{**r, "configDigest": ""} for r in revisions]
    assert not revision_lags(_daemonset(OLD_DIGEST, 3), undigested)
    assert not revision_lags(_daemonset(OLD_DIGEST, 3), [])
    assert not revision_lags(None, revisions)


def test_an_unsettled_gate_holds_its_candidates_and_records_nothing() -> None:
    policy = GatePolicy(canary_nodes=1, halt_after_failures=1)
    halted = GateRecord(revision=NEW, digest=NEW_DIGEST, failed=("n0",), halted=True)
    nodes = [
        GateNode("n0", UpgradeState.UPGRADE_FAILED, None, failed_revision=NEW),
        GateNode("n1", UpgradeState.UPGRADE_REQUIRED, OLD),
    ]
    d = plan_gate(policy, nodes, NEW, halted, now=1.0, digest=OLD_DIGEST, settled=False)
    assert d.settling
    assert d.record is None
    assert set(d.held) == {"n1"}
    assert d.phase is GatePhase.HALTED  # what the record shows; nothing new decided
