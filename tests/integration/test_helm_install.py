"""The chart on the real control plane: `helm install`, the operator running with the
chart's ServiceAccount token (not the admin credential) until the policy is ready,
`helm upgrade` without touching the driver, removal of the policy and `helm uninstall`.
Any 403 fails the test: the work queue counts it as a failed reconcile, the watch
caches log it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import structlog
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

import crd
from components import COMPONENTS, DEPLOY_LABELS, RenderContext, rbac
from components.dra import KINDS as DRA_KINDS
from components.dra import render as render_dra
from components.keys import GPU_PRESENT_LABEL
from gpuop.devcluster import NFD_GPU_LABEL, SIMULATED_LABEL, ClusterInfo
from gpuop.kube.kinds import KINDS, by_kind
from gpuop.kube.rest import Rest
from gpuop.operator.controller import Operator, OperatorConfig
from gpuop.operator.leader import DEFAULT_LEASES, LeaderElector
from gpuop.operator.metrics import OperatorMetrics
from statemachine.upgrade_keys import STATE_LABEL, UpgradeState
from tests.integration.harness import eventually
from tests.integration.helm_chart import CHART, helm

pytestmark = pytest.mark.integration

RELEASE = "gpu-operator"
POLICY_NAME = "cluster-policy"
POLICY = by_kind("nvidia.com/v1", "ClusterPolicy")
NODE = by_kind("v1", "Node")
DS = by_kind("apps/v1", "DaemonSet")
DEPLOYMENT = by_kind("apps/v1", "Deployment")
SA = by_kind("v1", "ServiceAccount")
CLUSTER_ROLE = by_kind("rbac.authorization.k8s.io/v1", "ClusterRole")
CLUSTER_ROLE_BINDING = by_kind("rbac.authorization.k8s.io/v1", "ClusterRoleBinding")
ROLE = by_kind("rbac.authorization.k8s.io/v1", "Role")
ROLE_BINDING = by_kind("rbac.authorization.k8s.io/v1", "RoleBinding")
RUNTIME_CLASS = by_kind("node.k8s.io/v1", "RuntimeClass")
CRD = by_kind("apiextensions.k8s.io/v1", "CustomResourceDefinition")
MANAGED = "app.kubernetes.io/managed-by=gpuop"


@pytest.fixture(scope="module")
async def admin(api_client: client.ApiClient) -> AsyncIterator[Rest]:
    """Admin access, for setting up and checking only; a module with no policy left."""
    rest = Rest(api_client, KINDS)
    for existing in (
        await rest.list(POLICY) if await rest.get(CRD, POLICY.plural + ".nvidia.com") else []
    ):
        await rest.delete(POLICY, existing["metadata"]["name"])
    yield rest
    if await rest.get(CRD, "clusterpolicies.nvidia.com"):
        for existing in await rest.list(POLICY):
            await rest.delete(POLICY, existing["metadata"]["name"])
    # Leave no node labelled by us.
    for node in await rest.list(NODE):
        labels = node["metadata"].get("labels") or {}
        ours: dict[str, str | None] = {
            k: None for k in (GPU_PRESENT_LABEL, *DEPLOY_LABELS) if labels.get(k) == "true"
        }
        if STATE_LABEL in labels:
            ours[STATE_LABEL] = None
        if ours:
            await rest.merge_patch(NODE, node["metadata"]["name"], {"metadata": {"labels": ours}})


@pytest.fixture(scope="module")
async def release(
    admin: Rest, api_client: client.ApiClient, local_cluster: ClusterInfo
) -> AsyncIterator[str]:
    """The chart installed into a fresh namespace; uninstalled and the namespace gone after."""
    namespace = f"gpuop-helm-{uuid.uuid4().hex[:6]}"
    kubeconfig = local_cluster.kubeconfig
    helm(
        "install", RELEASE, str(CHART), "-n", namespace, "--create-namespace", kubeconfig=kubeconfig
    )
    try:
        yield namespace
    finally:
        helm("uninstall", RELEASE, "-n", namespace, kubeconfig=kubeconfig, check=False)
        with contextlib.suppress(client.ApiException):
            await client.CoreV1Api(api_client).delete_namespace(namespace)


@contextlib.asynccontextmanager
async def service_account_client(
    api_client: client.ApiClient, info: ClusterInfo, namespace: str, name: str
) -> AsyncIterator[client.ApiClient]:
    """An ApiClient that authenticates as the ServiceAccount (TokenRequest API)."""
    token = await client.CoreV1Api(api_client).create_namespaced_service_account_token(
        name, namespace, client.AuthenticationV1TokenRequest(spec={"audiences": []})
    )
    config = client.Configuration()
    config.host = info.server
    config.ssl_ca_cert = str(info.directory / "pki" / "ca.crt")
    config.api_key = {"BearerToken": token.status.token}
    config.api_key_prefix = {"BearerToken": "Bearer"}
    async with client.ApiClient(config) as sa_api:
        review = await client.AuthenticationV1Api(sa_api).create_self_subject_review(
            client.V1SelfSubjectReview()
        )
        assert review.status.user_info.username == f"system:serviceaccount:{namespace}:{name}"
        yield sa_api


async def _state(admin: Rest) -> str | None:
    got = await admin.get(POLICY, POLICY_NAME)
    return ((got or {}).get("status") or {}).get("state")


async def _operand_objects(admin: Rest, namespace: str) -> list[str]:
    found: list[str] = []
    for kind in (DS, ROLE, ROLE_BINDING, SA):
        found += [
            f"{kind.kind}/{o['metadata']['name']}"
            for o in await admin.list(kind, namespace, label_selector=MANAGED)
        ]
    for kind in (RUNTIME_CLASS, CLUSTER_ROLE, CLUSTER_ROLE_BINDING):
        found += [
            f"{kind.kind}/{o['metadata']['name']}"
            for o in await admin.list(kind, label_selector=MANAGED)
        ]
    return found


async def test_install_run_as_the_chart_service_account_upgrade_and_uninstall(
    admin: Rest, release: str, api_client: client.ApiClient, local_cluster: ClusterInfo
) -> None:
    namespace = release
    listed = helm("list", "-n", namespace, "-o", "json", kubeconfig=local_cluster.kubeconfig)
    assert '"status":"deployed"' in listed
    assert await admin.get(POLICY, POLICY_NAME) is not None

    with structlog.testing.capture_logs() as logs:
        async with service_account_client(
            api_client, local_cluster, namespace, "gpu-operator"
        ) as sa_api:
            operator = Operator(
                Rest(sa_api, KINDS),
                OperatorConfig(namespace=namespace, workers=4),
                OperatorMetrics(),
            )
            # Leader election as the chart's account: create each Lease, renew it, let go.
            for lease in DEFAULT_LEASES:
                elector = LeaderElector(Rest(sa_api, KINDS), namespace, lease, "helm-test")
                assert await elector.try_acquire_or_renew()
                assert await elector.try_acquire_or_renew()
                await elector.release()
            task = asyncio.create_task(operator.run())
            try:
                assert await eventually(lambda: _ready(admin), timeout=90)
                driver = await admin.get(DS, "nvidia-driver-daemonset", namespace)
                assert driver is not None
                assert await admin.list(CLUSTER_ROLE, label_selector=MANAGED)  # granted by us

                # Pod labels on the exporter's metrics: upstream's read-pods ClusterRole,
                # granted under the chart's account (a 403 fails the reconcile count).
                _upgrade_release(local_cluster, namespace, "dcgmExporter.enablePodLabels=true")
                read_pods = "nvidia-dcgm-exporter-read-pods"
                assert await eventually(lambda: admin.get(CLUSTER_ROLE_BINDING, read_pods))
                granted = await admin.get(CLUSTER_ROLE, read_pods)
                assert granted is not None
                assert granted["rules"][0]["resources"] == ["pods"]

                # An upgrade that changes the operator and an unrelated operand only.
                _upgrade_release(
                    local_cluster,
                    namespace,
                    "dcgmExporter.enabled=false",
                    "operator.logging.level=debug",
                )
                deployment = await admin.get(DEPLOYMENT, "gpu-operator", namespace)
                assert deployment is not None
                assert (
                    "--log-level=debug"
                    in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
                )
                await eventually(lambda: _gone(admin, DS, "nvidia-dcgm-exporter", namespace))
                await eventually(lambda: _gone(admin, CLUSTER_ROLE, read_pods))
                assert await eventually(lambda: _ready(admin), timeout=60)
                after = await admin.get(DS, "nvidia-driver-daemonset", namespace)
                assert after is not None
                assert after["metadata"]["uid"] == driver["metadata"]["uid"]
                assert after["metadata"]["generation"] == driver["metadata"]["generation"]

                # A driver change through the chart upgrades every GPU node, with
                # cordon, pod deletion, a drain (one workload pod to evict: a bare pod,
                # so `force`, as kubectl drain needs) and uncordon done under the
                # chart's RBAC.
                workloads = f"{namespace}-apps"
                await admin.apply(
                    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": workloads}}
                )
                await admin.create(
                    by_kind("v1", "Pod"),
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": {"name": "app", "namespace": workloads},
                        "spec": {
                            "nodeName": "gpu-node-0000",
                            "containers": [{"name": "c", "image": "app"}],
                        },
                    },
                    workloads,
                )
                _upgrade_release(
                    local_cluster,
                    namespace,
                    "driver.version=600.10.01",
                    "driver.upgradePolicy.maxParallelUpgrades=0",
                    "driver.upgradePolicy.maxUnavailable=100%",
                    "driver.upgradePolicy.drain.enable=true",
                    "driver.upgradePolicy.drain.force=true",
                )
                await eventually(lambda: _upgraded(admin), timeout=90)
                await eventually(
                    lambda: _gone(admin, by_kind("v1", "Pod"), "app", workloads), timeout=30
                )
                assert await eventually(lambda: _ready(admin), timeout=60)
                assert operator.queue.stats.failed == 0, [
                    e.get("error") for e in logs if e.get("event") == "reconcile failed"
                ]

                # Switching operands off deletes their RBAC (Roles, ClusterRoles and
                # their bindings) through the operator, under the chart's account.
                _upgrade_release(
                    local_cluster,
                    namespace,
                    "validator.enabled=false",
                    "migManager.enabled=false",
                )
                await eventually(lambda: _gone(admin, ROLE, "nvidia-operator-validator", namespace))
                await eventually(lambda: _gone(admin, CLUSTER_ROLE, "nvidia-mig-manager"))

                # Removing the policy first lets the operator take its operands away
                # while it still holds its permissions (the documented uninstall order).
                await admin.delete(POLICY, POLICY_NAME)
                await eventually(lambda: _none_left(admin, namespace), timeout=60)
                await eventually(lambda: _no_deploy_labels(admin), timeout=30)
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            # A status write racing the policy's deletion may meet a 404; nothing else.
            failures = [
                str(e.get("error"))
                for e in logs
                if e.get("event") == "reconcile failed"
                and not ("(404)" in str(e.get("error")) and POLICY_NAME in str(e.get("error")))
            ]
            assert failures == []
    denied = [e for e in logs if "403" in str(e) or "Forbidden" in str(e)]
    assert denied == []
    await _granted_is_what_the_recorded_run_used(admin, namespace, local_cluster)

    helm("uninstall", RELEASE, "-n", namespace, kubeconfig=local_cluster.kubeconfig)
    release_objects = (
        (DEPLOYMENT, "gpu-operator", namespace),
        (DEPLOYMENT, f"{RELEASE}-node-feature-discovery-master", namespace),
        (DEPLOYMENT, f"{RELEASE}-node-feature-discovery-gc", namespace),
        (DS, f"{RELEASE}-node-feature-discovery-worker", namespace),
        (SA, "gpu-operator", namespace),
        (ROLE, "gpu-operator", namespace),
        (ROLE_BINDING, "gpu-operator", namespace),
        (CLUSTER_ROLE, "gpu-operator", None),
        (CLUSTER_ROLE_BINDING, "gpu-operator", None),
        (CLUSTER_ROLE, f"{RELEASE}-node-feature-discovery", None),
        (CLUSTER_ROLE, f"{RELEASE}-node-feature-discovery-gc", None),
        # NFD's post-delete prune hook ran and its objects went (hook-succeeded).
        (CLUSTER_ROLE, f"{RELEASE}-node-feature-discovery-prune", None),
    )
    try:
        # Helm deletes them all at once; the API server removes a CRD only after its
        # own customresourcecleanup finalizer has run, asynchronously. On a loaded CI
        # machine a CRD with no objects left stayed once over 60 s, once over 180 s.
        # That controller (kube-apiserver v1.34, crd_finalizer.go) drops its work item
        # when a status write meets a conflict and queues it again only for an update
        # beyond its Terminating condition or its informer's 5-minute resync: touching
        # a CRD still there after 60 s queues it again, and the wait covers the resync.
        try:
            await eventually(lambda: _all_gone(admin, release_objects), timeout=60)
        except AssertionError:
            await _requeue_crd_cleanup(admin, release_objects)
            await eventually(lambda: _all_gone(admin, release_objects), timeout=320)
    except AssertionError:
        left = await _still_there(admin, release_objects)
        terminating = await _terminating_crds(admin)
        raise AssertionError(
            f"left after helm uninstall: {left}; CRDs being deleted: {terminating}"
        ) from None
    # Nodes are left as they were found: no cordon, no labels or annotations of ours.
    for node in await admin.list(NODE):
        meta = node["metadata"]
        assert not node["spec"].get("unschedulable"), meta["name"]
        ours = [
            k
            for k in {**(meta.get("labels") or {}), **(meta.get("annotations") or {})}
            if k.startswith(("nvidia.com/gpu-driver-upgrade", "gpuop.io/", "nvidia.com/gpu.deploy"))
            or k == GPU_PRESENT_LABEL
        ]
        ours = [k for k in ours if k != SIMULATED_LABEL]  # the local cluster's, not ours
        assert ours == [], (meta["name"], ours)
    # Helm's CRD rule: crds/ are installed once and never deleted by Helm. NFD's are
    # there too (as NFD's chart ships them), so every NodeFeatureRule outlives us.
    assert await admin.get(CRD, "clusterpolicies.nvidia.com") is not None
    assert await admin.get(CRD, "nodefeaturerules.nfd.k8s-sigs.io") is not None


def _upgrade_release(cluster: ClusterInfo, namespace: str, *values: str) -> None:
    """`helm upgrade --reuse-values --set k=v ...`."""
    sets = [arg for value in values for arg in ("--set", value)]
    helm(
        "upgrade",
        RELEASE,
        str(CHART),
        "-n",
        namespace,
        "--reuse-values",
        *sets,
        kubeconfig=cluster.kubeconfig,
    )


def _recorded_use(audit_log: Path, user: str) -> set[tuple[str, str, str]]:
    """(apiGroup, resource[/subresource], verb) of every request ``user`` made."""
    used: set[tuple[str, str, str]] = set()
    for line in audit_log.read_text().splitlines():
        event = json.loads(line)
        if event.get("user", {}).get("username") != user or "objectRef" not in event:
            continue
        ref = event["objectRef"]
        resource = ref.get("resource", "")
        if ref.get("subresource"):
            resource = f"{resource}/{ref['subresource']}"
        used.add((ref.get("apiGroup", ""), resource, event["verb"]))
        if event["verb"] == "patch":
            # A server-side apply that creates the object is also authorized as a
            # create; the audit log records it as the patch it was sent as.
            used.add((ref.get("apiGroup", ""), resource, "create"))
    return used


async def _granted_is_what_the_recorded_run_used(
    admin: Rest, namespace: str, cluster: ClusterInfo
) -> None:
    """Least privilege against a recorded run: every (group, resource, verb) the chart
    grants the operator was used by it in this scenario, or is held only because an
    operand Role/ClusterRole the operator creates grants it (Kubernetes refuses to let
    anyone grant what they do not hold)."""
    user = f"system:serviceaccount:{namespace}:gpu-operator"
    used = _recorded_use(cluster.directory / "logs" / "audit.log", user)
    assert used, "the audit log recorded nothing for the chart's ServiceAccount"
    rendered = helm("template", RELEASE, str(CHART), "-n", namespace, kubeconfig=cluster.kubeconfig)
    granted: set[tuple[str, str, str]] = set()
    for doc in yaml.safe_load_all(rendered):
        if doc and doc["kind"] in ("ClusterRole", "Role") and doc["metadata"]["name"] == RELEASE:
            for rule in doc["rules"]:
                granted |= {
                    (g, r, v)
                    for g in rule["apiGroups"]
                    for r in rule["resources"]
                    for v in rule["verbs"]
                }
    # What the operator hands on to operands (same roles for any enabled policy).
    spec = crd.default_policy().spec
    ctx = RenderContext(namespace=namespace, operator_image="x", mig_capable=True)
    delegated = {
        (g, r, v)
        for c in COMPONENTS
        for o in c.objects(spec, ctx)
        if o["kind"] in ("ClusterRole", "Role")
        for rule in o["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    # ServiceMonitors, PrometheusRules: only with the Prometheus operator's CRDs, absent
    # in this cluster. The RuntimeClass (pre-requisites, off only with
    # cdi.nriPluginEnabled, not set here) is deleted only when the policy goes, and then
    # the garbage collector (owner references) usually wins.
    not_exercised_here = {
        ("monitoring.coreos.com", kind, v)
        for kind in ("servicemonitors", "prometheusrules")
        for v in ("get", "list", "watch", "create", "patch", "delete")
    } | {("node.k8s.io", "runtimeclasses", "delete")}
    # Only when an administrator resumes a paused GPU health remediation.
    not_exercised_here |= {("nvidia.com", "clusterpolicies", "patch")}
    # No NVIDIADriver exists in this scenario, so none has a status to write
    # (tests/integration/test_nvidiadriver.py writes them).
    not_exercised_here |= {("nvidia.com", "nvidiadrivers/status", "patch")}
    # Only when a status write meets a newer object (409) and reads it again.
    not_exercised_here |= {("nvidia.com", "clusterpolicies", "get")}
    not_exercised_here |= {("nvidia.com", "nvidiadrivers", "get")}
    # Only when a driver pool names imagePullSecrets and the upgrade pre-flight asks its
    # registry with them (tests/integration/test_upgrade_preflight.py reads one).
    not_exercised_here |= {("", "secrets", "get")}
    # Only with spec.psa.enabled, off here (tests/integration/test_psa.py labels it).
    not_exercised_here |= {("", "namespaces", "get"), ("", "namespaces", "patch")}
    # No GPUCluster exists in this scenario (tests/integration/test_gpucluster.py runs
    # one): its caches list and watch, but its stack's grants are only handed on and
    # its objects, status and finalizer never written here.
    dra_spec = crd.parse_gpucluster(
        {
            "spec": {
                "draDriver": {"featureGates": {"MPSSupport": True}},
                "dcgm": {},
                "dcgmExporter": {},
            }
        }
    ).spec
    dra = [o for objs in render_dra(dra_spec, ctx).values() for o in objs]
    for need in rbac.rendered_needs(dra, DRA_KINDS, "GPUCluster"):
        if need.why != "GPUCluster":
            delegated.add((need.group, need.resource, need.verb))  # its Roles grant it
        elif need.verb not in ("list", "watch"):  # its caches list and watch here
            not_exercised_here.add((need.group, need.resource, need.verb))
    not_exercised_here |= {
        ("nvidia.com", "gpuclusters", "get"),
        ("nvidia.com", "gpuclusters", "patch"),
        ("nvidia.com", "gpuclusters/status", "patch"),
        ("nvidia.com", "gpuclusters/finalizers", "update"),
        ("apps", "deployments", "get"),
    }
    unused = granted - used - delegated - not_exercised_here
    assert not unused, f"granted but never used in the recorded run: {sorted(unused)}"


async def _upgraded(admin: Rest) -> bool:
    states = [
        (n["metadata"].get("labels") or {}).get(STATE_LABEL)
        for n in await admin.list(NODE)
        if (n["metadata"].get("labels") or {}).get(NFD_GPU_LABEL) == "true"
    ]
    assert UpgradeState.UPGRADE_FAILED.value not in states, states
    return bool(states) and all(s == UpgradeState.UPGRADE_DONE.value for s in states)


async def _ready(admin: Rest) -> bool:
    return await _state(admin) == "ready"


async def _gone(admin: Rest, kind: Any, name: str, namespace: str | None = None) -> bool:
    return await admin.get(kind, name, namespace) is None


async def _still_there(admin: Rest, objects: Any) -> list[str]:
    """Each object still present, with what holds it (deletion started, finalizers)."""
    left = []
    for kind, name, ns in objects:
        obj = await admin.get(kind, name, ns)
        if obj is not None:
            meta = obj["metadata"]
            left.append(
                f"{kind.kind} {name}: deletionTimestamp={meta.get('deletionTimestamp')} "
                f"finalizers={meta.get('finalizers')}"
            )
    return left


async def _requeue_crd_cleanup(admin: Rest, objects: Any) -> None:
    """Annotate each CRD of `objects` whose deletion has started: an update beyond its
    Terminating condition is what the API server's CRD finalizer queues again."""
    for kind, name, ns in objects:
        if kind != CRD:
            continue
        obj = await admin.get(kind, name, ns)
        if obj is not None and obj["metadata"].get("deletionTimestamp"):
            touched = {"metadata": {"annotations": {"gpuop.io/test-requeue": str(uuid.uuid4())}}}
            try:
                await admin.merge_patch(kind, name, touched)
            except ApiException as err:
                if err.status != 404:  # gone in the meantime is what the wait wants
                    raise


async def _terminating_crds(admin: Rest) -> list[str]:
    """Every CRD whose deletion has started, with its conditions: the API server's CRD
    finalizer works through them with a few workers, so one stuck CRD can hold others."""
    found = []
    for definition in await admin.list(CRD):
        if definition["metadata"].get("deletionTimestamp"):
            conditions = [
                f"{c.get('type')}={c.get('status')}/{c.get('reason')}: {c.get('message')}"
                for c in (definition.get("status") or {}).get("conditions") or []
            ]
            found.append(f"{definition['metadata']['name']} {conditions}")
    return found


async def _all_gone(admin: Rest, objects: Any) -> bool:
    return not await _still_there(admin, objects)


async def _none_left(admin: Rest, namespace: str) -> bool:
    return not await _operand_objects(admin, namespace)


async def _no_deploy_labels(admin: Rest) -> bool:
    for node in await admin.list(NODE):
        labels = node["metadata"].get("labels") or {}
        if any(labels.get(k) == "true" for k in DEPLOY_LABELS):
            return False
    return True
