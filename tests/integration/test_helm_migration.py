"""Migration from NVIDIA's GPU Operator at the Helm layer, both ways a team would try it
(docs/helm-migration.md), on the real control plane.

NVIDIA's release is upstream's v26.7 chart as it renders with default values
(tests/data/upstream-helm-release: a throwaway chart whose only template is that
recording, its CRDs in the chart's crds/, its hooks kept), installed as release
`gpu-operator` in namespace `gpu-operator`. Its operator pod never runs (kwok runs no
container): what its operator had made is created beside it, as recorded
(tests/conformance/upstream/default: the operand DaemonSets owned by the release's
ClusterPolicy, the node labels and annotations it left), and a GPU workload runs on
every GPU node. A NodeFeatureRule exists before the move.

(a) `helm upgrade gpu-operator <our chart>` over that release, no `--force`.
(b) `kubectl delete clusterpolicy cluster-policy --cascade=orphan`, `helm uninstall`,
    NFD's post-delete prune (its Job cannot run here: the test strips NFD's labels as
    it does), `helm install` of ours; our operator runs while NFD's labels are away and
    then they come back (our NFD worker's first pass).

Each ends with the policy ready, no node cordoned, no workload pod removed, no
`gpu.present` or deploy label dropped, no driver reinstalled (same digest), driver pods
replaced within the upgrade budget (one node at a time: 25% of 4 GPU nodes), the
NodeFeatureRule still there. Our operator runs in this process, as the chart's
Deployment would.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client

from components import ObjectKind
from components.driver import digest_in
from components.keys import NFD_LABEL_PREFIX
from gpuop.devcluster import ClusterInfo
from gpuop.kube.kinds import by_kind, kind_of
from gpuop.kube.rest import Rest
from gpuop.operator.controller import OperatorConfig
from statemachine.driver_handoff import HANDOFF_ANNOTATION
from tests.integration.handover import Disturbances, Watcher
from tests.integration.harness import NODE, POLICY, Running, eventually, policy_state
from tests.integration.helm_chart import CHART, DATA, documents, helm, one, template
from tests.integration.test_migration import (
    UPGRADE_STATE,
    WORKLOADS,
    _daemonsets_rolled_out,
    _gpu_workload,
    _not_rolled_out,
    _recorded,
    _recorded_annotations,
)

pytestmark = pytest.mark.integration

RELEASE = "gpu-operator"
NAMESPACE = "gpu-operator"
"""Where upstream's chart (and the recording) put the release; ours goes there too."""
UPSTREAM_RELEASE = DATA / "upstream-helm-release" / "rendered.yaml"
POD = by_kind("v1", "Pod")
NS = by_kind("v1", "Namespace")
DEPLOYMENT = by_kind("apps/v1", "Deployment")
DAEMONSET = by_kind("apps/v1", "DaemonSet")
CRD = by_kind("apiextensions.k8s.io/v1", "CustomResourceDefinition")
NODE_FEATURE_RULE = ObjectKind("nfd.k8s-sigs.io/v1alpha1", "NodeFeatureRule", "nodefeaturerules")
RULE_NAME = "site-gpu-rule"
NFD_CRDS = (
    "nodefeatures.nfd.k8s-sigs.io",
    "nodefeaturerules.nfd.k8s-sigs.io",
    "nodefeaturegroups.nfd.k8s-sigs.io",
)
#: GFD's labels on the simulated nodes: GFD publishes them through NFD (its features.d
#: file), so NFD's prune strips them with NFD's own.
GFD_LABELS = (
    "nvidia.com/gpu.product",
    "nvidia.com/gpu.count",
    "nvidia.com/gpu.memory",
    "nvidia.com/gpu.family",
    "nvidia.com/gpu.compute.major",
    "nvidia.com/gpu.compute.minor",
    "nvidia.com/mig.capable",
)
BUDGET = 1
"""The chart's default driver upgrade budget on 4 GPU nodes: maxUnavailable 25%."""


def _upstream_chart(folder: Path) -> Path:
    """A throwaway chart holding upstream's recorded release: its CRDs in crds/, every
    other object (hooks included, with their annotations) its only template."""
    docs = [d for d in yaml.safe_load_all(UPSTREAM_RELEASE.read_text()) if d]
    chart = folder / "upstream-gpu-operator"
    (chart / "crds").mkdir(parents=True)
    (chart / "templates").mkdir()
    (chart / "Chart.yaml").write_text(
        "apiVersion: v2\nname: gpu-operator\nversion: 26.7.0\nappVersion: v26.7.0\n"
    )
    crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    rest = [d for d in docs if d["kind"] != "CustomResourceDefinition"]
    (chart / "crds" / "crds.yaml").write_text(yaml.safe_dump_all(crds))
    text = yaml.safe_dump_all(rest)
    assert "{{" not in text  # Helm would read it as a template
    (chart / "templates" / "release.yaml").write_text(text)
    return chart


def _owned(obj: dict[str, Any], owner: dict[str, Any]) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    obj["metadata"]["ownerReferences"] = [owner]
    return obj


async def _gone(rest: Rest, kind: Any, name: str, namespace: str | None = None) -> bool:
    return await rest.get(kind, name, namespace) is None


async def _clean(rest: Rest, kubeconfig: Path) -> None:
    """No release, policy, namespace or operand object of ours or NVIDIA's left."""
    helm("uninstall", RELEASE, "-n", NAMESPACE, "--no-hooks", kubeconfig=kubeconfig, check=False)
    for policy in await rest.list(POLICY):
        await rest.delete(POLICY, policy["metadata"]["name"])
    await rest.delete(NODE_FEATURE_RULE, RULE_NAME)
    for name in (NAMESPACE, WORKLOADS):
        await rest.delete(NS, name)

    async def gone() -> bool:
        return all([await rest.get(NS, n) is None for n in (NAMESPACE, WORKLOADS)])

    await eventually(gone, timeout=180, what="namespaces deleted")


#: NFD's workloads, upstream's names on both sides of the move.
NFD_WORKLOADS = (
    (DEPLOYMENT, f"{RELEASE}-node-feature-discovery-master"),
    (DAEMONSET, f"{RELEASE}-node-feature-discovery-worker"),
    (DEPLOYMENT, f"{RELEASE}-node-feature-discovery-gc"),
)


async def _nfd_pods(rest: Rest) -> dict[str, str]:
    """uid -> name of NFD's running (not deleted) pods."""
    return {
        p["metadata"]["uid"]: p["metadata"]["name"]
        for p in await rest.list(POD, NAMESPACE)
        if (p["metadata"].get("labels") or {}).get("app.kubernetes.io/name")
        == "node-feature-discovery"
        and not p["metadata"].get("deletionTimestamp")
    }


def _operand_pods(pods: list[dict[str, Any]]) -> dict[str, str]:
    """uid -> name of the operand pods (not the operator's, not NFD's)."""
    return {
        p["metadata"]["uid"]: p["metadata"]["name"]
        for p in pods
        if not p["metadata"]["name"].startswith(("gpu-operator-", "nfd-"))
        and not p["metadata"].get("deletionTimestamp")
    }


class Migration:
    """Upstream's release with what its operator made, a workload on every GPU node and
    a NodeFeatureRule; what the checks compare against."""

    def __init__(self, rest: Rest, api: client.ApiClient, kubeconfig: Path) -> None:
        self.rest = rest
        self.api = api
        self.kubeconfig = kubeconfig
        self.gpu_nodes: list[str] = []
        self.workload_uids: set[str] = set()
        self.operand_pods: dict[str, str] = {}
        self.recorded_digest = ""
        self.nfd_labels: dict[str, dict[str, str]] = {}

    async def set_up(self, folder: Path) -> None:
        rest = self.rest
        await _clean(rest, self.kubeconfig)
        helm(
            "install", RELEASE, str(_upstream_chart(folder)), "-n", NAMESPACE,
            "--create-namespace", kubeconfig=self.kubeconfig,
        )  # fmt: skip
        policy = await rest.get(POLICY, "cluster-policy")
        assert policy is not None, "upstream's release made no ClusterPolicy"
        owner = {
            "apiVersion": "nvidia.com/v1",
            "kind": "ClusterPolicy",
            "name": "cluster-policy",
            "uid": policy["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
        objects, node_labels = _recorded()
        for obj in objects:
            meta = obj["metadata"]
            if not meta.get("namespace"):
                await rest.delete(kind_of(obj), meta["name"])  # an earlier test's
            await rest.create(kind_of(obj), _owned(obj, owner), meta.get("namespace"))
        annotations = _recorded_annotations()
        for node, labels in node_labels.items():
            meta = {"labels": labels, "annotations": annotations.get(node) or {}}
            await rest.merge_patch(NODE, node, {"metadata": meta})
        self.gpu_nodes = sorted(node_labels)
        driver = next(o for o in objects if o["metadata"]["name"] == "nvidia-driver-daemonset")
        self.recorded_digest = digest_in(driver["spec"]["template"]["spec"])
        deadline = time.monotonic() + 120
        while not await _daemonsets_rolled_out(rest, NAMESPACE):
            late = await _not_rolled_out(rest, NAMESPACE)
            assert time.monotonic() < deadline, f"NVIDIA's DaemonSets not running: {late}"
            await asyncio.sleep(0.5)
        await rest.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": WORKLOADS}})
        await rest.create(DEPLOYMENT, _gpu_workload(len(self.gpu_nodes)), WORKLOADS)

        async def workload_running() -> bool:
            pods = await rest.list(POD, WORKLOADS)
            return len(pods) == len(self.gpu_nodes) and all(
                (p.get("status") or {}).get("phase") == "Running" for p in pods
            )

        await eventually(workload_running, timeout=120, what="GPU workload running")
        self.workload_uids = {p["metadata"]["uid"] for p in await rest.list(POD, WORKLOADS)}
        self.operand_pods = _operand_pods(await rest.list(POD, NAMESPACE))
        await rest.create(
            NODE_FEATURE_RULE,
            {
                "apiVersion": "nfd.k8s-sigs.io/v1alpha1",
                "kind": "NodeFeatureRule",
                "metadata": {"name": RULE_NAME},
                "spec": {"rules": [{"name": "site", "labels": {"example.com/site": "a"}}]},
            },
        )

    async def prune_nfd_labels(self) -> None:
        """What NFD's post-delete prune Job (`nfd-master -prune`) does to every node: the
        labels NFD published (its own and GFD's) go."""
        for node in await self.rest.list(NODE):
            labels = node["metadata"].get("labels") or {}
            published = {
                k: v for k, v in labels.items() if k.startswith(NFD_LABEL_PREFIX) or k in GFD_LABELS
            }
            self.nfd_labels[node["metadata"]["name"]] = published
            patch = {"metadata": {"labels": dict.fromkeys(published)}}
            await self.rest.merge_patch(NODE, node["metadata"]["name"], patch)

    async def nfd_labels_back(self) -> None:
        """Our NFD worker's first pass: every node labelled as before."""
        for node, labels in self.nfd_labels.items():
            await self.rest.merge_patch(NODE, node, {"metadata": {"labels": labels}})

    async def handed_over(self) -> bool:
        nodes = {n["metadata"]["name"]: n for n in await self.rest.list(NODE)}
        done = all(
            nodes[n]["metadata"]["labels"].get(UPGRADE_STATE) == "upgrade-done"
            for n in self.gpu_nodes
        )
        return done and await _daemonsets_rolled_out(self.rest, NAMESPACE)

    async def ready_and_handed_over(self, run: Running, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while not (await policy_state(self.rest) == "ready" and await self.handed_over()):
            if time.monotonic() > deadline:
                policy = await self.rest.get(POLICY, "cluster-policy")
                raise AssertionError(
                    f"policy {(policy or {}).get('status')}; "
                    f"DaemonSets: {await _not_rolled_out(self.rest, NAMESPACE)}"
                )
            await asyncio.sleep(0.5)
        await run.settle()
        assert await policy_state(self.rest) == "ready"
        assert run.operator.queue.stats.failed == 0

    async def check(self, seen: Disturbances, path: str) -> dict[str, Any]:
        """The checks both paths share; returns what was measured."""
        rest = self.rest
        assert seen.cordons == []
        assert seen.workload_pods_removed == []
        assert seen.labels_dropped == []
        assert seen.digest_changes == {}
        assert {d for ds in seen.driver_digests.values() for d in ds} == {self.recorded_digest}
        assert seen.most_drivers_down <= BUDGET, seen.drivers_down_at_once
        after = {p["metadata"]["uid"] for p in await rest.list(POD, WORKLOADS)}
        assert after == self.workload_uids
        assert await rest.get(NODE_FEATURE_RULE, RULE_NAME) is not None
        for name in NFD_CRDS:
            assert await rest.get(CRD, name) is not None, name
        listed = helm("list", "-n", NAMESPACE, "-o", "json", kubeconfig=self.kubeconfig)
        assert '"status":"deployed"' in listed
        assert '"chart":"gpu-operator-0.1.0"' in listed
        for node in self.gpu_nodes:
            live = await rest.get(NODE, node)
            assert live is not None
            assert (live["metadata"].get("annotations") or {}).get(HANDOFF_ANNOTATION) == "true"
        now = _operand_pods(await rest.list(POD, NAMESPACE))
        replaced = sorted(name for uid, name in self.operand_pods.items() if uid not in now)
        measured = {
            "path": path,
            "operand_pods_before": len(self.operand_pods),
            "operand_pods_replaced": len(replaced),
            "replaced": replaced,
            "driver_pods_replaced": seen.driver_pods_replaced,
            "most_driver_nodes_down_at_once": seen.most_drivers_down,
            "drivers_down": seen.drivers_down_at_once,
            "cordons": len(seen.cordons),
            "workload_pods_removed": len(seen.workload_pods_removed),
        }
        print(f"\nhelm migration measured: {measured}")
        return measured


def test_what_helm_upgrade_over_nvidias_release_needs_of_the_chart() -> None:
    """The operator Deployment's immutable selector is upstream's; NFD's CRDs are no
    templates (Helm would refuse to adopt the ones NVIDIA's release left: "invalid
    ownership metadata") but in crds/, so no uninstall and no `nfd.enabled=false` ever
    deletes them (nor the NodeFeatureRules)."""
    upstream = documents(UPSTREAM_RELEASE.read_text())
    theirs = one(upstream, "Deployment", "gpu-operator")
    ours = one(documents(template()), "Deployment", "gpu-operator")
    assert ours["spec"]["selector"] == theirs["spec"]["selector"]
    assert ours["spec"]["selector"]["matchLabels"].items() <= (
        ours["spec"]["template"]["metadata"]["labels"].items()
    )
    for sets in ((), ("--set", "nfd.enabled=false")):
        rendered = documents(template(*sets))
        assert not [d for d in rendered if d["kind"] == "CustomResourceDefinition"]
        with_crds = documents(template("--include-crds", *sets))
        shipped = {
            d["metadata"]["name"] for d in with_crds if d["kind"] == "CustomResourceDefinition"
        }
        assert set(NFD_CRDS) <= shipped
    upstream_nfd = {
        d["metadata"]["name"]
        for d in upstream
        if d["kind"] == "CustomResourceDefinition" and d["spec"]["group"] == "nfd.k8s-sigs.io"
    }
    assert upstream_nfd == set(NFD_CRDS)


@pytest.fixture
async def migration(
    rest: Rest, api_client: client.ApiClient, local_cluster: ClusterInfo, tmp_path: Path
) -> AsyncIterator[Migration]:
    m = Migration(rest, api_client, local_cluster.kubeconfig)
    try:
        await m.set_up(tmp_path)
        yield m
    finally:
        for node in m.gpu_nodes:
            await rest.merge_patch(
                NODE, node, {"metadata": {"annotations": {HANDOFF_ANNOTATION: None}}}
            )
        if m.nfd_labels:
            await m.nfd_labels_back()
        await _clean(rest, local_cluster.kubeconfig)


async def test_helm_upgrade_over_nvidias_release(
    migration: Migration, api_client: client.ApiClient
) -> None:
    """`helm upgrade gpu-operator <our chart>` over upstream's release: no 422 (the
    operator Deployment's selector is upstream's), no ownership conflict (NFD's CRDs
    are in crds/ on both sides), the operator Deployment updated in place."""
    rest = migration.rest
    before = await rest.get(DEPLOYMENT, "gpu-operator", NAMESPACE)
    assert before is not None
    nfd_before = {(k, name): await rest.get(k, name, NAMESPACE) for k, name in NFD_WORKLOADS}
    assert all(nfd_before.values()), nfd_before
    nfd_pods_before = await _nfd_pods(rest)
    config = OperatorConfig(namespace=NAMESPACE, workers=4)
    async with Watcher(api_client, workload_namespace=WORKLOADS) as watcher:
        helm("upgrade", RELEASE, str(CHART), "-n", NAMESPACE, kubeconfig=migration.kubeconfig)
        async with Running(api_client, config) as run:
            await migration.ready_and_handed_over(run)
    after = await rest.get(DEPLOYMENT, "gpu-operator", NAMESPACE)
    assert after is not None
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert after["spec"]["template"]["spec"]["containers"][0]["args"][2] == "run"
    # Our NFD objects are upstream's (names, selectors): updated in place, same uid, on
    # NFD v0.19.0 as before. Only the master's and worker's pods roll (their
    # checksum/config annotation hashes our ConfigMap text; the workers tolerate every
    # taint by our default); nfd-gc's template is upstream's exactly, its pod stays.
    for (kind, name), old in nfd_before.items():
        new = await rest.get(kind, name, NAMESPACE)
        assert new is not None, name
        assert new["metadata"]["uid"] == old["metadata"]["uid"], name
        assert new["spec"]["selector"] == old["spec"]["selector"], name
        old_spec, new_spec = (
            {k: v for k, v in o["spec"]["template"]["spec"].items() if k != "tolerations"}
            for o in (old, new)
        )
        assert new_spec == old_spec, name
    nfd_pods_after = await _nfd_pods(rest)
    kept = {uid: n for uid, n in nfd_pods_after.items() if uid in nfd_pods_before}
    print(f"\nNFD pods before: {sorted(nfd_pods_before.values())}; "
          f"after: {sorted(nfd_pods_after.values())}; kept: {sorted(kept.values())}")  # fmt: skip
    assert any(n.startswith(f"{RELEASE}-node-feature-discovery-gc-") for n in kept.values())
    await migration.check(watcher.seen, "helm upgrade")


async def test_uninstall_then_install_through_nfds_prune(
    migration: Migration, api_client: client.ApiClient
) -> None:
    """The policy deleted with its dependents orphaned (or the garbage collector takes
    every operand, drivers included, off every node at once), upstream's release
    uninstalled, NFD's prune, ours installed: while NFD's labels are away our operator
    keeps every GPU node's labels and leaves the driver as it is; once they are back the
    take-over completes as the in-place upgrade's does."""
    rest = migration.rest
    orphan = {"propagationPolicy": "Orphan"}
    config = OperatorConfig(namespace=NAMESPACE, workers=4)
    async with Watcher(api_client, workload_namespace=WORKLOADS) as watcher:
        assert await rest.delete(POLICY, "cluster-policy", body=orphan)
        await eventually(lambda: _gone(rest, POLICY, "cluster-policy"), what="policy deleted")
        helm("uninstall", RELEASE, "-n", NAMESPACE, kubeconfig=migration.kubeconfig)
        driver = await rest.get(DAEMONSET, "nvidia-driver-daemonset", NAMESPACE)
        assert driver is not None, "the driver DaemonSet went with the policy"
        await migration.prune_nfd_labels()
        helm("install", RELEASE, str(CHART), "-n", NAMESPACE, kubeconfig=migration.kubeconfig)
        async with Running(api_client, config) as run:
            # NFD's labels away: our operator's passes run, nothing is taken off a node.
            await asyncio.sleep(5)
            await run.settle()
            policy = await rest.get(POLICY, "cluster-policy")
            assert policy is not None
            assert policy["status"]["state"] == "notReady", policy["status"]
            held = await rest.get(DAEMONSET, "nvidia-driver-daemonset", NAMESPACE)
            assert held is not None
            assert held["metadata"]["uid"] == driver["metadata"]["uid"]
            assert held["spec"]["template"] == driver["spec"]["template"]
            assert watcher.seen.labels_dropped == []
            assert watcher.seen.driver_pods_replaced == 0
            await migration.nfd_labels_back()
            await migration.ready_and_handed_over(run)
    await migration.check(watcher.seen, "uninstall, install")
