"""The Helm chart rendered offline: lint, templates for default values, seed 004's
values and everything disabled, the ClusterPolicy it builds, least-privilege RBAC,
and the plain manifests kept equal to `helm template`. Needs only the cached Helm
binary (built by `gpuop cluster build`), not the control plane."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

import crd
from components import COMPONENTS, RenderContext, monitoring, rbac
from components.dra import KINDS as DRA_KINDS
from components.dra import render as render_dra
from gpuop.devcluster._build import ensure_helm
from gpuop.kube.rest import Kind
from gpuop.nodeagent import health
from gpuop.operator.controller.base.optional_watches import OWNED_CLUSTER, OWNED_NAMESPACED
from gpuop.operator.leader import DEFAULT_LEASES
from tests.integration.helm_chart import (
    CHART,
    CHART_FILES,
    DATA,
    DATA_FILES,
    DRA_RBAC_MANIFESTS,
    MANIFESTS,
    NAMESPACE,
    RELEASE,
    ROOT,
    VALUES_SCHEMA,
    by_kind,
    documents,
    helm,
    one,
    render_dra_rbac_manifests,
    render_manifests,
    template,
)
from tests.integration.values_schema import render_values_schema

SEED004 = (DATA / "values_seed004.yaml", DATA / "values_seed004_monitoring.yaml")

_CLUSTER_SCOPED = (
    "ClusterRole",
    "ClusterRoleBinding",
    "ClusterPolicy",
    "CustomResourceDefinition",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
)

#: Every switch the chart has, off: the operator alone.
ALL_DISABLED = [
    f"{section}.enabled=false"
    for section in (
        "driver",
        "toolkit",
        "devicePlugin",
        "dcgm",
        "dcgmExporter",
        "gfd",
        "migManager",
        "nodeStatusExporter",
        "validator",
        "gds",
        "gdrcopy",
        "vgpuManager",
        "vgpuDeviceManager",
        "vfioManager",
        "sandboxDevicePlugin",
        "kataManager",
        "ccManager",
        "nfd",
        "psa",
        "cdi",
    )
]

#: Values that switch on every operand that brings its own RBAC or ServiceMonitor, and
#: the chart's monitoring ConfigMaps.
EVERYTHING_ON = [
    "dcgm.enabled=true",
    "nodeStatusExporter.enabled=true",
    "devicePlugin.config.name=plugin-config",
    "devicePlugin.config.default=default",
    "dcgmExporter.serviceMonitor.enabled=true",
    "dcgmExporter.enablePodLabels=true",
    "operator.metrics.serviceMonitor.interval=30s",
]


def _group(kind: Kind) -> str:
    return kind.api_version.rpartition("/")[0]


def _set(pairs: Iterable[str]) -> list[str]:
    return [a for p in pairs for a in ("--set", p)]


@pytest.fixture(scope="module")
def default_docs() -> list[dict[str, Any]]:
    return documents(template())


@pytest.fixture(scope="module")
def seed_docs() -> list[dict[str, Any]]:
    return documents(template(values=SEED004))


def _policy(docs: list[dict[str, Any]]) -> crd.ClusterPolicy:
    raw = one(docs, "ClusterPolicy")
    policy, problems = crd.parse_policy(raw)
    assert problems == [], problems
    assert policy is not None
    # Strict: every key the chart writes is a ClusterPolicy field (nothing pruned).
    assert crd.ClusterPolicy.model_validate(raw) == policy
    return policy


def test_lint_is_clean() -> None:
    out = helm("lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in out
    # No warning on any command (a symlink in the chart used to print two each time).
    for args in (["lint", "--strict"], ["template", "gpu-operator"]):
        proc = subprocess.run(
            [str(ensure_helm()), *args, str(CHART)], capture_output=True, text=True, check=False
        )
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr == "", proc.stderr
    for name in DATA_FILES:
        shipped = CHART_FILES / name
        assert not shipped.is_symlink(), shipped
        assert shipped.read_bytes() == (ROOT / "components" / "data" / name).read_bytes(), (
            f"{shipped} differs from components/data: regenerate with "
            "`python -m tests.integration.helm_chart`"
        )
    out = helm("lint", "--strict", str(CHART), *[a for v in SEED004 for a in ("-f", str(v))])
    assert "0 chart(s) failed" in out


def test_default_values_render_the_operator_and_a_default_policy(
    default_docs: list[dict[str, Any]],
) -> None:
    kinds = {d["kind"] for d in default_docs}
    assert {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Deployment",
        "ClusterPolicy",
        "DaemonSet",  # NFD worker, on by default like upstream
    } <= kinds
    # The metrics Service is the operator's own (component operator-metrics); a chart
    # copy would fight it for the same object.
    assert "ServiceMonitor" not in kinds
    assert "Service" not in kinds
    policy = _policy(default_docs)
    assert policy.name == crd.DEFAULT_POLICY_NAME
    # The chart's defaults are the models' defaults but for the values upstream's chart
    # writes over its CRD defaults (docker as the fallback runtime, as in both).
    expected = crd.ClusterPolicy.model_validate(crd.sample_policy()).spec
    assert policy.spec.model_dump(exclude_none=True) == expected.model_dump(exclude_none=True)
    for doc in default_docs:
        if doc["kind"] not in _CLUSTER_SCOPED:
            assert doc["metadata"]["namespace"] == NAMESPACE, doc["metadata"]["name"]


def test_operator_deployment_is_locked_down(default_docs: list[dict[str, Any]]) -> None:
    deployment = one(default_docs, "Deployment", "gpu-operator")
    spec = deployment["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"]["type"] == "RollingUpdate"
    labels = spec["template"]["metadata"]["labels"]
    assert labels["nvidia.com/gpu-driver-upgrade-drain.skip"] == "true"  # never drained
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == "gpu-operator"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    (container,) = pod["containers"]
    assert container["image"] == "ghcr.io/gpuop/gpuop:0.1.0"
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["resources"]["requests"]
    assert container["resources"]["limits"]
    assert container["args"][2:5] == [
        "run",
        "--namespace=$(OPERATOR_NAMESPACE)",
        "--leader-elect",
    ]
    env = {e["name"]: e for e in container["env"]}
    assert env["OPERATOR_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert env["GPUOP_OPERATOR_IMAGE"]["value"] == container["image"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": 8080, "probes": 8081}
    # The operator's metrics Service selects the pods by `app`.
    metrics = next(c for c in COMPONENTS if c.name == "operator-metrics")
    ctx = RenderContext(namespace=NAMESPACE, operator_image="x")
    (service,) = [
        o for o in metrics.objects(crd.default_policy().spec, ctx) if o["kind"] == "Service"
    ]
    assert service["spec"]["selector"].items() <= spec["template"]["metadata"]["labels"].items()
    assert service["spec"]["ports"][0]["targetPort"] == ports["metrics"]


def _leaves(value: Any, path: str = "") -> Iterable[tuple[str, Any]]:
    if isinstance(value, dict) and value:
        for key, item in value.items():
            yield from _leaves(item, f"{path}.{key}")
    else:
        yield path, value


def _at(obj: Any, path: str) -> Any:
    for part in path.strip(".").split("."):
        if not isinstance(obj, dict) or part not in obj:
            return None
        obj = obj[part]
    return obj


def test_seed004_values_install_unchanged(seed_docs: list[dict[str, Any]]) -> None:
    """The marketplace sample (nested under `gpu-operator:`) moves every image."""
    _policy(seed_docs)
    rendered = one(seed_docs, "ClusterPolicy")["spec"]
    expected = yaml.safe_load((DATA / "clusterpolicy_seed004.yaml").read_text())["spec"]
    for path, value in _leaves(expected):
        got = _at(rendered, path)
        if value in ({}, []):
            assert got in (None, value), path
        else:
            assert got == value, f"spec{path}: {got!r} != {value!r}"
    deployment = one(seed_docs, "Deployment", "gpu-operator")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "dockerhub.kubekey.local/kse/nvidia/gpu-operator:0.1.0"
    for doc in by_kind(seed_docs, "DaemonSet") + by_kind(seed_docs, "Deployment"):
        for c in doc["spec"]["template"]["spec"]["containers"]:
            assert c["image"].startswith("dockerhub.kubekey.local/kse/"), c["image"]
    assert "monitoring.coreos.com" in {
        g for rule in one(seed_docs, "Role", "gpu-operator")["rules"] for g in rule["apiGroups"]
    }


def test_everything_disabled_renders_only_the_operator() -> None:
    docs = documents(template(*_set(ALL_DISABLED)))
    policy = _policy(docs)
    spec = policy.spec
    for section in (
        spec.driver,
        spec.toolkit,
        spec.device_plugin,
        spec.dcgm,
        spec.dcgm_exporter,
        spec.gfd,
        spec.mig_manager,
        spec.node_status_exporter,
        spec.validator,
        spec.vgpu_device_manager,
        spec.vfio_manager,
        spec.sandbox_device_plugin,
    ):
        assert section.enabled is False
    ctx = RenderContext(namespace=NAMESPACE, operator_image="x", mig_capable=True)
    wanted = {c.name for c in COMPONENTS if c.objects(spec, ctx)}
    assert wanted == {"pre-requisites", "operator-metrics"}  # always there
    assert not by_kind(docs, "DaemonSet")
    assert not by_kind(docs, "CustomResourceDefinition")
    assert {d["metadata"]["name"] for d in by_kind(docs, "Deployment")} == {"gpu-operator"}
    off = documents(template("--set", "clusterPolicy.deployCR=false", *_set(ALL_DISABLED)))
    assert not by_kind(off, "ClusterPolicy")


def test_one_replica_without_leader_election_recreates() -> None:
    docs = documents(
        template("--set", "operator.replicas=1", "--set", "operator.leaderElection.enabled=false")
    )
    deployment = one(docs, "Deployment", "gpu-operator")
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    assert "--leader-elect" not in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "coordination.k8s.io" not in {
        g for rule in one(docs, "Role", "gpu-operator")["rules"] for g in rule["apiGroups"]
    }
    refused = helm(
        "template", "x", str(CHART), "--set", "operator.leaderElection.enabled=false", check=False
    )
    assert "needs operator.leaderElection.enabled" in refused


def test_upgrade_policy_values_map_to_the_policy() -> None:
    docs = documents(
        template(
            *_set(
                [
                    "driver.upgradePolicy.gpuPodDeletion.force=true",
                    "driver.upgradePolicy.gpuPodDeletion.timeoutSeconds=60",
                    "driver.upgradePolicy.gpuPodDeletion.deleteEmptyDir=true",
                    "driver.upgradePolicy.maxParallelUpgrades=3",
                    "driver.upgradePolicy.maxUnavailable=2",
                    "driver.upgradePolicy.drain.enable=true",
                    "driver.upgradePolicy.drain.podSelector=app=batch",
                    "driver.upgradePolicy.waitForCompletion.podSelector=job=train",
                    "driver.version=550.127.08",
                    "mig.strategy=mixed",
                ]
            )
        )
    )
    spec = _policy(docs).spec
    upgrade = spec.driver.upgrade_policy
    assert upgrade.pod_deletion.force is True
    assert upgrade.pod_deletion.timeout_seconds == 60
    assert upgrade.pod_deletion.delete_empty_dir is True
    assert upgrade.max_parallel_upgrades == 3
    assert upgrade.max_unavailable == 2
    assert upgrade.drain.enable is True
    assert upgrade.drain.pod_selector == "app=batch"
    assert upgrade.wait_for_completion.pod_selector == "job=train"
    assert spec.driver.version == "550.127.08"
    assert spec.mig.strategy == "mixed"


# ----------------------------------------------------------------------- RBAC
def _rules(docs: list[dict[str, Any]], kind: str, name: str = RELEASE) -> list[dict[str, Any]]:
    return [r for d in by_kind(docs, kind) if d["metadata"]["name"] == name for r in d["rules"]]


def _allows(
    rules: list[dict[str, Any]], group: str, resource: str, verb: str, name: str = ""
) -> bool:
    return rbac.allows(rules, rbac.Need(False, group, resource, verb, name))


@pytest.mark.parametrize("values", [(), ALL_DISABLED, EVERYTHING_ON], ids=["default", "off", "on"])
def test_no_wildcards_anywhere(values: list[str]) -> None:
    docs = documents(template(*_set(values)))
    for doc in by_kind(docs, "ClusterRole") + by_kind(docs, "Role"):
        for rule in doc["rules"]:
            for key in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert all("*" not in v for v in rule.get(key, [])), (doc["metadata"], rule)
            assert "nonResourceURLs" not in rule
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])
            # Secrets: only read by name, in its own namespace (the upgrade pre-flight's
            # pull Secrets); never listed, watched or written, never cluster-wide.
            if "secrets" in rule["resources"]:
                assert doc["kind"] == "Role", rule
                assert rule["verbs"] == ["get"], rule


def test_operator_holds_what_it_does_and_what_it_grants_nothing_more() -> None:
    """Every call the operator makes and every permission an operand Role or
    ClusterRole grants is covered (Kubernetes refuses to let it grant what it does not
    hold), and every rule the chart grants is needed by one of those. The GPUCluster's
    DRA stack needs more (cluster-wide pod patch and Lease writes, among others, only
    to pass them on): the chart grants that in roles of their own, only with
    gpuCluster.rbac (or deployCR), so the default install holds none of it."""
    docs = documents(template(*_set([*EVERYTHING_ON, "gpuCluster.rbac=true"])))
    base_cluster, base_role = _rules(docs, "ClusterRole"), _rules(docs, "Role")
    dra_cluster = _rules(docs, "ClusterRole", f"{RELEASE}-dra")
    dra_role = _rules(docs, "Role", f"{RELEASE}-dra")
    assert dra_cluster
    assert dra_role
    needed: list[tuple[bool, str, str, str, str]] = []  # (cluster-wide, group, res, verb, name)

    def need(
        cluster_wide: bool, group: str, resource: str, verbs: Iterable[str], name: str = ""
    ) -> None:
        needed.extend((cluster_wide, group, resource, v, name) for v in verbs)

    # The operator's own calls (see gpuop/operator/controller/wiring/operator.py).
    need(True, "", "nodes", ["get", "list", "watch", "patch"])
    need(True, "nvidia.com", "clusterpolicies", ["list", "watch"])
    # GPU health remediation: removing the administrator's resume annotation.
    need(True, "nvidia.com", "clusterpolicies", ["patch"])
    need(True, "nvidia.com", "clusterpolicies/status", ["patch"])
    # NVIDIADrivers (gpuop/operator/controller/passes/nvidiadriver.py).
    need(True, "nvidia.com", "nvidiadrivers", ["list", "watch"])
    need(True, "nvidia.com", "nvidiadrivers/status", ["patch"])
    need(False, "", "pods", ["list", "watch"])
    need(False, "apps", "controllerrevisions", ["list", "watch"])
    for kind in OWNED_NAMESPACED:
        need(False, _group(kind), kind.plural, ["list", "watch", "create", "patch", "delete"])
    # Driver upgrades (cordon is a node patch): evict or delete GPU pods anywhere.
    need(True, "", "pods", ["delete"])
    need(True, "", "pods/eviction", ["create"])
    # Events about the policy (in `default`), nodes and pods (gpuop/operator/events.py).
    need(True, "", "events", ["create"])
    # spec.psa.enabled: its own namespace's Pod Security labels
    # (gpuop/operator/controller/writers/pod_security.py).
    need(True, "", "namespaces", ["get", "patch"], NAMESPACE)
    # The driver's site configuration: keys of the namespace's ConfigMaps (_site_config.py).
    need(False, "", "configmaps", ["list", "watch"])
    # The upgrade pre-flight: driver pools' pull Secrets
    # (gpuop/operator/controller/writers/preflight.py).
    need(False, "", "secrets", ["get"])
    # Leader election (gpuop/operator/leader.py).
    need(False, "coordination.k8s.io", "leases", ["create"])
    for lease in DEFAULT_LEASES:
        need(False, "coordination.k8s.io", "leases", ["get", "update"], lease)
    # What the operands' roles grant.
    policy = _policy(docs)
    ctx = RenderContext(namespace=NAMESPACE, operator_image="x", mig_capable=True)
    objects = [o for c in COMPONENTS for o in c.objects(policy.spec, ctx)]
    cluster_named = {
        (o["kind"], o["metadata"]["name"]) for o in objects if "namespace" not in o["metadata"]
    }
    for kind in OWNED_CLUSTER:
        assert {k for k, _ in cluster_named} >= {kind.kind} or kind.kind == "RuntimeClass"
        need(True, _group(kind), kind.plural, rbac.CLUSTER_VERBS)
    # Cluster-scoped objects are created by server-side apply, authorized by name.
    for kind_name, name in cluster_named:
        kind = next(k for k in OWNED_CLUSTER if k.kind == kind_name)
        need(True, _group(kind), kind.plural, rbac.CLUSTER_NAMED_VERBS, name)
    for obj in objects:
        if obj["kind"] in ("ClusterRole", "Role"):
            for rule in obj["rules"]:
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        need(obj["kind"] == "ClusterRole", group, resource, rule["verbs"])
    kinds = {o["kind"] for o in objects}
    assert {"ClusterRole", "Role", "ServiceMonitor", "PrometheusRule"} <= kinds
    for plural in ("servicemonitors", "prometheusrules"):
        need(False, "monitoring.coreos.com", plural, ["list", "watch", "create", "patch", "delete"])
    # The GPUCluster (gpuop/operator/controller/passes/gpucluster.py): its cache and its stack's
    # caches
    # run under any policy, and a GPUCluster the chart gives no DRA rights is reported in
    # its own status.
    need(True, "nvidia.com", "gpuclusters", ["get", "list", "watch", "patch"])
    need(True, "nvidia.com", "gpuclusters/status", ["patch"])
    gates = {"MPSSupport": True}
    dra_doc = {"draDriver": {"featureGates": gates}, "dcgm": {"enabled": True}, "dcgmExporter": {}}
    dra_spec = crd.parse_gpucluster({"spec": dra_doc}).spec
    dra = [o for objs in render_dra(dra_spec, ctx).values() for o in objs]
    dra_needs = rbac.rendered_needs(dra, DRA_KINDS, "GPUCluster")
    for n in dra_needs:
        if n.why == "GPUCluster" and n.verb in ("list", "watch"):
            need(n.cluster_wide, n.group, n.resource, [n.verb], n.name)
    # Only with a GPUCluster enabled: writing its stack, and the finalizers its objects'
    # blockOwnerDeletion needs.
    dra_only: list[tuple[bool, str, str, str, str]] = [
        (n.cluster_wide, n.group, n.resource, n.verb, n.name) for n in dra_needs
    ]
    dra_only.append((True, "nvidia.com", "gpuclusters/finalizers", "update", ""))

    def check(
        wanted: list[tuple[bool, str, str, str, str]], cluster: list[Any], role: list[Any]
    ) -> None:
        for cluster_wide, group, resource, verb, name in wanted:
            rules = cluster if cluster_wide else [*cluster, *role]
            assert _allows(rules, group, resource, verb, name), (
                f"the chart does not grant {verb} {group or 'core'}/{resource} {name}".strip()
            )

    check(needed, base_cluster, base_role)
    check(dra_only, [*base_cluster, *dra_cluster], [*base_role, *dra_role])
    # Nothing beyond: each granted (group, resource, verb) is needed; the DRA roles
    # grant only what the DRA stack needs and the base roles do not already hold.
    # get comes with list for names we apply.
    for granted, wanted_list in (
        ([*base_cluster, *base_role], needed),
        ([*dra_cluster, *dra_role], dra_only),
    ):
        wanted = {(g, r, v) for _, g, r, v, _ in wanted_list}
        for rule in granted:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        assert (group, resource, verb) in wanted or (
                            verb == "get" and (group, resource, "list") in wanted
                        ), f"granted but unused: {verb} {group or 'core'}/{resource}"
    # The pass-through rights the default install must not hold (issue 43).
    for group, resource, verb in (
        ("", "pods", "patch"),
        ("coordination.k8s.io", "leases", "update"),
        ("coordination.k8s.io", "leases", "get"),
    ):
        assert not _allows(base_cluster, group, resource, verb), (group, resource, verb)
        assert _allows(dra_cluster, group, resource, verb), (group, resource, verb)


def test_health_remediation_is_absent_unless_set() -> None:
    assert "healthRemediation" not in one(documents(template()), "ClusterPolicy")["spec"]
    docs = documents(
        template(
            *_set(
                [
                    "healthRemediation.enabled=true",
                    "healthRemediation.action=drain",
                    "healthRemediation.maxUnhealthy=25%",
                ]
            )
        )
    )
    section = _policy(docs).spec.health_remediation
    assert section is not None
    assert (section.enabled, section.action, section.max_unhealthy) == (True, "drain", "25%")
    assert section.settle_seconds == 300


def test_node_agent_may_patch_only_node_status() -> None:
    """The node agent reports GPUHealthy on its Node: read the Node, patch its status."""
    docs = documents(template())
    role = one(docs, "ClusterRole", "gpuop-node-agent")
    granted = {
        (g, r, v)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    assert granted == {("", "nodes", "get"), ("", "nodes/status", "patch")}
    binding = one(docs, "ClusterRoleBinding", "gpuop-node-agent")
    assert binding["roleRef"]["name"] == "gpuop-node-agent"
    ctx = RenderContext(namespace=NAMESPACE, operator_image="x")
    spec = crd.default_policy().spec.model_copy(
        update={"node_status_exporter": crd.NodeStatusExporterSpec(enabled=True)}
    )
    exporter = next(c for c in COMPONENTS if c.name == "node-status-exporter")
    accounts = {
        o["metadata"]["name"] for o in exporter.objects(spec, ctx) if o["kind"] == "ServiceAccount"
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE} for name in accounts
    ]


@pytest.mark.parametrize("namespace", [NAMESPACE, "gpu-system"])
def test_node_agent_writes_are_narrowed_to_its_own_node(namespace: str) -> None:
    """RBAC cannot say "its own node": an admission policy on the agent's account does
    (enforcement: tests/integration/test_nodeagent_api.py), failing closed, for the
    release's namespace, keyed on the node-name claim, keeping the agent's condition."""
    docs = documents(template(namespace=namespace))
    binding = one(docs, "ValidatingAdmissionPolicyBinding", "gpuop-node-agent")
    assert binding["spec"] == {"policyName": "gpuop-node-agent", "validationActions": ["Deny"]}
    policy = one(docs, "ValidatingAdmissionPolicy", "gpuop-node-agent")["spec"]
    assert policy["failurePolicy"] == "Fail"
    assert policy["matchConstraints"]["resourceRules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["*"],
            "operations": ["UPDATE"],
            "resources": ["nodes/status"],
        }
    ]
    subject = one(docs, "ClusterRoleBinding", "gpuop-node-agent")["subjects"][0]
    (match,) = policy["matchConditions"]
    user = f"system:serviceaccount:{namespace}:{subject['name']}"
    assert match["expression"].split() == ["request.userInfo.username", "==", f"'{user}'"]
    variables = {v["name"]: v["expression"] for v in policy["variables"]}
    assert yaml.safe_load(variables["ownConditions"]) == [health.CONDITION_TYPE]
    assert (
        "request.userInfo.extra['authentication.kubernetes.io/node-name']"
        in (variables["nodeClaim"])
    )
    assert all(v["reason"] == "Forbidden" for v in policy["validations"])


# ------------------------------------------------------------------ manifests
def test_plain_manifests_equal_helm_template() -> None:
    for path, rendered in (
        (MANIFESTS, render_manifests()),
        (DRA_RBAC_MANIFESTS, render_dra_rbac_manifests()),
    ):
        assert path.read_text() == rendered, (
            f"{path} is out of date: regenerate with `python -m tests.integration.helm_chart`"
        )


def test_chart_default_policy_equals_the_sample_in_deploy(
    default_docs: list[dict[str, Any]],
) -> None:
    """deploy/clusterpolicy.yaml is what `helm install` with default values creates."""
    sample = yaml.safe_load((CHART.parents[2] / crd.SAMPLE_POLICY_FILE).read_text())
    rendered = one(default_docs, "ClusterPolicy")
    assert rendered["metadata"]["name"] == sample["metadata"]["name"]
    assert rendered["spec"] == sample["spec"]


# ------------------------------------------------------------ upstream values
UPSTREAM_VALUES = DATA / "upstream" / "values.yaml"


def _value_paths(value: Any, path: str = "") -> set[str]:
    if isinstance(value, dict) and value:
        return {p for key, item in value.items() for p in _value_paths(item, f"{path}.{key}")}
    return {path}


def test_every_upstream_values_key_is_in_ours() -> None:
    """Each key of upstream v26.7's values.yaml is a key of ours too (with a value or a
    sub-tree), so `helm show values` documents everything an upstream values file sets,
    the `node-feature-discovery.*` ones of its bundled NFD chart included."""
    theirs = _value_paths(yaml.safe_load(UPSTREAM_VALUES.read_text()))
    ours = _value_paths(yaml.safe_load((CHART / "values.yaml").read_text()))
    missing = sorted(
        path
        for path in theirs - ours
        if not any(mine.startswith(f"{path}.") or path.startswith(f"{mine}.") for mine in ours)
    )
    assert missing == []


#: What upstream's values.yaml needs on top: gpuop's operator image, not NVIDIA's.
OUR_OPERATOR_IMAGE = ("--set", "operator.repository=ghcr.io/gpuop", "--set", "operator.image=gpuop")


def test_upstream_values_file_installs_a_policy_without_problems() -> None:
    """Upstream's own values.yaml, given to our chart (with gpuop's operator image), yields
    a policy with upstream's chart-default settings (and its pinned images) that parses
    with no problem."""
    docs = documents(template(*OUR_OPERATOR_IMAGE, values=[UPSTREAM_VALUES]))
    raw = one(docs, "ClusterPolicy")
    policy, problems = crd.parse_policy(raw)
    assert problems == []
    assert policy is not None
    upstream = yaml.safe_load(
        (ROOT / "tests" / "conformance" / "upstream" / "default" / "policy.yaml").read_text()
    )
    theirs = crd.ClusterPolicy.model_validate(upstream).spec
    for section in ("driver", "toolkit", "devicePlugin", "dcgmExporter", "gfd", "migManager"):
        assert crd.component_image(policy.spec, section) == crd.component_image(theirs, section)
    ours_monitor = policy.spec.dcgm_exporter.service_monitor
    their_monitor = theirs.dcgm_exporter.service_monitor
    assert ours_monitor is not None
    assert their_monitor is not None
    fields = ("enabled", "interval", "scrape_timeout", "honor_labels")
    assert [getattr(ours_monitor, f) for f in fields] == [getattr(their_monitor, f) for f in fields]
    assert policy.spec.sandbox_workloads == theirs.sandbox_workloads
    assert policy.spec.kata_sandbox_device_plugin.enabled


def test_upstream_only_values_reach_the_policy() -> None:
    """The v26.7 values keys our chart gained go to the ClusterPolicy where upstream's
    template puts them."""
    values = [
        "hostPaths.kubeletRootDir=/data/kubelet",
        "sandboxWorkloads.mode=kata",
        "cdi.nriPluginEnabled=true",
        "driver.secretEnv=driver-secrets",
        "driver.hostNetwork=true",
        "validator.hostNetwork=true",
        "dcgmExporter.hostPID=true",
        "dcgmExporter.enablePodLabels=true",
        "dcgmExporter.enablePodUID=true",
        "dcgmExporter.annotations.team=gpu",
        "dcgmExporter.podLabelAllowlistRegex={^app$,^team$}",
        "dcgmExporter.hpcJobMapping.enabled=true",
        "dcgmExporter.hpcJobMapping.directory=/run/slurm/jobs",
        "dcgmExporter.serviceMonitor.scrapeTimeout=20s",
        "vgpuManager.kernelModuleConfig.name=vgpu-modules",
        "kataSandboxDevicePlugin.hostNetwork=true",
        "operator.metrics.serviceMonitor.enabled=true",
    ]
    spec = _policy(documents(template(*_set(values)))).spec
    assert spec.host_paths.kubelet_root_dir == "/data/kubelet"
    assert spec.sandbox_workloads.mode == "kata"
    assert spec.cdi.nri_plugin_enabled
    assert spec.driver.secret_env == "driver-secrets"
    assert spec.driver.host_network
    assert spec.validator.host_network
    exporter = spec.dcgm_exporter
    assert exporter.host_pid
    assert exporter.enable_pod_labels
    assert exporter.enable_pod_uid
    assert exporter.annotations == {"team": "gpu"}
    assert exporter.pod_label_allowlist_regex == ["^app$", "^team$"]
    assert exporter.hpc_job_mapping is not None
    assert exporter.hpc_job_mapping.enabled
    assert exporter.hpc_job_mapping.directory == "/run/slurm/jobs"
    assert exporter.service_monitor is not None
    assert exporter.service_monitor.scrape_timeout == "20s"
    assert spec.vgpu_manager.kernel_module_config is not None
    assert spec.vgpu_manager.kernel_module_config.name == "vgpu-modules"
    assert spec.kata_sandbox_device_plugin.host_network
    assert spec.operator.metrics is not None
    assert spec.operator.metrics.service_monitor is not None
    assert spec.operator.metrics.service_monitor.enabled
    fields = {f.path for f in crd.unsupported_fields(spec)}
    # acted on: components.driver_config, _k8s (pod settings), dcgm_exporter, toolkit,
    # the sandbox operands (kata_device_plugin)
    for acted_on in (
        "spec.kataSandboxDevicePlugin.hostNetwork",
        "spec.driver.secretEnv",
        "spec.cdi.nriPluginEnabled",
        "spec.hostPaths.kubeletRootDir",
        "spec.driver.hostNetwork",
        "spec.validator.hostNetwork",
        "spec.dcgmExporter.hostPID",
        "spec.dcgmExporter.enablePodLabels",
        "spec.dcgmExporter.annotations",
    ):
        assert acted_on not in fields


def test_nvidias_operator_image_is_refused_naming_the_keys_to_set() -> None:
    """Upstream's values.yaml names NVIDIA's operator image, which gpuop cannot run (and
    which has no tag of gpuop's appVersion): the chart refuses it in one line naming
    operator.repository, operator.image and operator.version, whatever the version; gpuop's
    image, or a mirror under any other name, renders as given."""
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    version: tuple[str, ...] = ("--set", "operator.version=v26.7.0")
    for extra in ((), version):
        refused = helm(
            "template", RELEASE, str(CHART), "--values", str(UPSTREAM_VALUES), *extra,
            check=False,
        )  # fmt: skip
        (line,) = [ln for ln in refused.splitlines() if "operator.version" in ln]
        assert "nvcr.io/nvidia/gpu-operator" in line
        assert "operator.repository" in line
        assert "operator.image" in line
        assert "Error:" in line
        assert "kind: Deployment" not in refused
    # Also with repository empty and the full name in `image`, or a trailing slash.
    for pairs in (
        ["operator.repository=", "operator.image=nvcr.io/nvidia/gpu-operator"],
        ["operator.repository=nvcr.io/nvidia/", "operator.image=gpu-operator"],
    ):
        assert "operator.version" in helm("template", "r", str(CHART), *_set(pairs), check=False)
    renders: list[tuple[tuple[str, ...], str]] = [
        (OUR_OPERATOR_IMAGE, f"ghcr.io/gpuop/gpuop:{app_version}"),
        (
            (*OUR_OPERATOR_IMAGE, "--set", "operator.version=0.0.9"),
            "ghcr.io/gpuop/gpuop:0.0.9",
        ),
        (
            ("--set", "operator.repository=registry.example.com/nvidia"),
            f"registry.example.com/nvidia/gpu-operator:{app_version}",
        ),
    ]
    for extra, image in renders:
        docs = documents(template(*extra, values=[UPSTREAM_VALUES]))
        deployment = one(docs, "Deployment", "gpu-operator")
        assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == image


METRICS_CSV = """# DCGM field, Prometheus type, help
DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization (in %).
DCGM_FI_DEV_FB_USED, gauge, Framebuffer memory used (in MiB)."""


def test_dcgm_exporter_metrics_config_map_is_created_as_upstream(tmp_path: Path) -> None:
    """Upstream: deployments/gpu-operator/templates/dcgm_exporter_config.yaml writes a
    ConfigMap named `dcgmExporter.config.name` in the release namespace, holding `data`
    under `dcgm-metrics.csv`, when `create` is set and `data` is not empty; the policy
    names it so the exporter mounts it."""
    config = {"name": "custom-metrics", "create": True, "data": METRICS_CSV}
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"dcgmExporter": {"config": config}}))
    docs = documents(template(values=[values]))
    (made,) = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"] == "custom-metrics"]
    assert made["metadata"]["namespace"] == NAMESPACE
    assert made["data"] == {"dcgm-metrics.csv": METRICS_CSV + "\n"}
    exporter = _policy(docs).spec.dcgm_exporter
    assert exporter.config is not None
    assert exporter.config.name == "custom-metrics"
    # Without create, or without data, the ConfigMap is the administrator's own.
    for extra in ([], ["dcgmExporter.config.create=true"]):
        others = documents(template(*_set(["dcgmExporter.config.name=custom-metrics", *extra])))
        assert "custom-metrics" not in {d["metadata"]["name"] for d in by_kind(others, "ConfigMap")}


def test_monitoring_configmaps_ship_the_rules_and_the_dashboard() -> None:
    """Without the Prometheus Operator: the rule file and the Grafana dashboard as
    ConfigMaps (off by default), the same files the operator and deploy/ use."""
    kinds = {(d["kind"], d["metadata"]["name"]) for d in documents(template())}
    assert ("ConfigMap", "gpu-operator-alert-rules") not in kinds
    assert ("ConfigMap", "gpu-operator-dashboard") not in kinds
    docs = documents(
        template(
            *_set(
                [
                    "monitoring.alertRules.configMap=true",
                    "monitoring.dashboard.enabled=true",
                    "monitoring.dashboard.namespace=monitoring",
                ]
            )
        )
    )
    rules = one(docs, "ConfigMap", "gpu-operator-alert-rules")
    assert rules["metadata"]["namespace"] == NAMESPACE
    shipped = yaml.safe_load(rules["data"][monitoring.RULES_FILE])
    assert shipped == yaml.safe_load(monitoring.data_text(monitoring.RULES_FILE))
    board = one(docs, "ConfigMap", "gpu-operator-dashboard")
    assert board["metadata"]["namespace"] == "monitoring"
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads(board["data"][monitoring.DASHBOARD_FILE])
    assert shipped == json.loads(monitoring.data_text(monitoring.DASHBOARD_FILE))


def test_crd_hooks_apply_on_upgrade_and_delete_on_uninstall_as_upstream() -> None:
    """Helm never upgrades crds/: upstream's chart applies the CRDs in a pre-upgrade hook
    Job (`operator.upgradeCRD`, on by default) and deletes them in a pre-delete hook Job
    (`operator.cleanupCRD`, off by default), each with a ServiceAccount whose ClusterRole
    reaches CRDs only. Ours run `gpuop crds apply|delete` from the operator image."""
    default = documents(template())
    jobs = {d["metadata"]["name"]: d for d in default if _crd_hook_job(d)}
    assert set(jobs) == {"gpu-operator-upgrade-crd"}
    job = jobs["gpu-operator-upgrade-crd"]
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-upgrade"
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == ["crds", "apply"]
    operator = one(default, "Deployment", "gpu-operator")["spec"]["template"]["spec"]
    assert container["image"] == operator["containers"][0]["image"]
    role = one(default, "ClusterRole", "gpu-operator-upgrade-crd-hook-role")
    assert role["rules"] == [
        {
            "apiGroups": ["apiextensions.k8s.io"],
            "resources": ["customresourcedefinitions"],
            "verbs": ["create", "get", "list", "watch", "patch", "update"],
        }
    ]
    both = documents(template(*_set(["operator.cleanupCRD=true"])))
    cleanup = one(both, "Job", "gpu-operator-cleanup-crd")
    assert cleanup["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
    assert cleanup["spec"]["template"]["spec"]["containers"][0]["args"] == ["crds", "delete"]
    none = documents(template(*_set(["operator.upgradeCRD=false"])))
    assert not [d for d in none if _crd_hook_job(d)]


def _crd_hook_job(doc: dict[str, Any]) -> bool:
    """A Job of the chart's own hooks (not NFD's post-delete prune, tested with NFD)."""
    labels = doc["metadata"].get("labels") or {}
    return doc["kind"] == "Job" and labels.get("app.kubernetes.io/name") != (
        "node-feature-discovery"
    )


def test_the_chart_installs_the_compute_domain_crds_and_its_hooks_reach_them() -> None:
    """A GPUCluster's compute-domain controller watches NVIDIA's ComputeDomain kinds: the
    chart's crds/ carries their CRDs (what `gpuop crds apply`, its upgrade hook, applies
    too), and the cleanup hook may list ComputeDomains (it keeps the CRDs while any
    exists)."""
    crds = {
        d["metadata"]["name"]: d
        for d in documents(template("--include-crds"))
        if d["kind"] == "CustomResourceDefinition"
    }
    for manifest in crd.compute_domain_crd_manifests():
        assert crds[manifest["metadata"]["name"]] == manifest
    cleanup = documents(template(*_set(["operator.cleanupCRD=true"])))
    role = one(cleanup, "ClusterRole", "gpu-operator-cleanup-crd-hook-role")
    assert {
        "apiGroups": [crd.CD_GROUP],
        "resources": ["computedomains"],
        "verbs": ["list"],
    } in role["rules"]


#: The values keys the chart accepts but does not act on, each with a value that asks for
#: something; NOTES.txt must name every one.
INERT_VALUES: dict[str, Any] = {
    "fullnameOverride": "my-operator",
    "platform.openshift": True,
    "nfd.nodefeaturerules": True,
    "operator.logging.develMode": True,
    "operator.logging.timeEncoding": "iso8601",
}
#: The same keys asking for nothing.
INERT_OFF: dict[str, Any] = {
    "fullnameOverride": "",
    "platform.openshift": False,
    "nfd.nodefeaturerules": False,
    "operator.logging.develMode": False,
    "operator.logging.timeEncoding": "epoch",
}


def _nested(flat: dict[str, Any]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for path, value in flat.items():
        node = tree
        *parents, leaf = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return tree


def _values_file(folder: Path, name: str, flat: dict[str, Any]) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(_nested(flat)))
    return path


PROMETHEUS_RULE_API = ("--api-versions", "monitoring.coreos.com/v1/PrometheusRule")


def test_the_chart_ships_the_operator_down_rules_where_prometheus_rules_are_served() -> None:
    """GPUOperatorDown cannot come from the operator (a dead one creates nothing): the
    chart's PrometheusRule gpu-operator-down carries the down rules file, by default
    only where the PrometheusRule API is served; its jobs follow monitoring.operatorDown,
    and the alert-rules ConfigMap holds the same file for a Prometheus without the
    Prometheus Operator."""
    down_file = yaml.safe_load(monitoring.data_text(monitoring.DOWN_RULES_FILE))
    assert not by_kind(documents(template()), "PrometheusRule")
    rule = one(documents(template(*PROMETHEUS_RULE_API)), "PrometheusRule", "gpu-operator-down")
    assert rule["metadata"]["namespace"] == NAMESPACE
    assert rule["spec"] == down_file
    off = template(*PROMETHEUS_RULE_API, "--set", "monitoring.operatorDown.prometheusRule=false")
    assert not by_kind(documents(off), "PrometheusRule")

    docs = documents(
        template(
            *_set(
                [
                    "monitoring.operatorDown.prometheusRule=true",
                    "monitoring.operatorDown.job=kubernetes-service-endpoints",
                    "monitoring.alertRules.configMap=true",
                ]
            )
        )
    )
    exprs = [r["expr"] for g in one(docs, "PrometheusRule")["spec"]["groups"] for r in g["rules"]]
    assert 'up{job="kubernetes-service-endpoints"}' in exprs[0]
    assert 'job="gpu-operator"' not in exprs[0]
    assert 'up{job="nvidia-node-status-exporter"}' in exprs[1]
    shipped = one(docs, "ConfigMap", "gpu-operator-alert-rules")["data"]
    assert (
        yaml.safe_load(shipped[monitoring.DOWN_RULES_FILE])["groups"]
        == (one(docs, "PrometheusRule")["spec"]["groups"])
    )


def test_monitoring_labels_reach_every_service_monitor_and_prometheus_rule() -> None:
    """monitoring.labels (kube-prometheus-stack's `release`) label the chart's
    PrometheusRule and, through the policy's serviceMonitor.additionalLabels (whose own
    values win), every ServiceMonitor and PrometheusRule the operator creates."""
    docs = documents(
        template(
            *PROMETHEUS_RULE_API,
            *_set(
                [
                    "monitoring.labels.release=kps",
                    "nodeStatusExporter.enabled=true",
                    "nodeStatusExporter.serviceMonitor.interval=30s",
                    "dcgmExporter.serviceMonitor.additionalLabels.release=mine",
                ]
            ),
        )
    )
    assert one(docs, "PrometheusRule", "gpu-operator-down")["metadata"]["labels"]["release"] == (
        "kps"
    )
    spec = _policy(docs).spec
    assert spec.operator.metrics is not None
    assert spec.operator.metrics.service_monitor is not None
    assert spec.operator.metrics.service_monitor.additional_labels == {"release": "kps"}
    assert spec.node_status_exporter.service_monitor is not None
    assert spec.node_status_exporter.service_monitor.interval == "30s"
    assert spec.dcgm_exporter.service_monitor is not None
    assert spec.dcgm_exporter.service_monitor.additional_labels == {"release": "mine"}
    ctx = RenderContext(namespace=NAMESPACE, operator_image="x")
    objects = [o for c in COMPONENTS for o in c.objects(spec, ctx)]
    monitors = {
        (o["kind"], o["metadata"]["name"]): o["metadata"]["labels"].get("release")
        for o in objects
        if o["kind"] in ("ServiceMonitor", "PrometheusRule")
    }
    assert monitors == {
        ("ServiceMonitor", "gpu-operator"): "kps",
        ("PrometheusRule", "nvidia-gpu-operator-metrics"): "kps",
        ("ServiceMonitor", "nvidia-node-status-exporter"): "kps",
        ("PrometheusRule", "nvidia-node-status-exporter-alerts"): "kps",
        ("ServiceMonitor", "nvidia-dcgm-exporter"): "mine",
    }
    # Without monitoring.labels the policy carries nothing it did not before.
    plain = _policy(documents(template())).spec
    assert plain.operator.metrics is None
    assert plain.node_status_exporter.service_monitor is None


def _notes(folder: Path, values: Sequence[Path] = ()) -> str:
    """NOTES.txt as `helm install` prints it: `helm template` leaves NOTES out, so a copy
    of the chart renders it, unchanged, inside a ConfigMap."""
    chart = folder / "chart"
    if not chart.exists():
        shutil.copytree(CHART, chart)  # symlinked files copied as their contents
        notes = chart / "templates" / "NOTES.txt"
        (chart / "templates" / "_notes.tpl").write_text(
            '{{- define "test.notes" -}}\n' + notes.read_text() + "\n{{- end -}}\n"
        )
        notes.unlink()
        (chart / "templates" / "notes-test.yaml").write_text(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n"
            'data:\n  notes: {{ include "test.notes" . | toJson }}\n'
        )
    files = [a for v in values for a in ("--values", str(v))]
    out = helm(
        "template", "r", str(chart), "--namespace", NAMESPACE, "--show-only",
        "templates/notes-test.yaml", *files,
    )  # fmt: skip
    notes_text: str = one(documents(out), "ConfigMap")["data"]["notes"]
    return notes_text


def _warned(notes: str) -> set[str]:
    _, _, named = notes.partition("NVIDIA's chart): ")
    return {n.strip() for n in named.split("\n")[0].split(",") if n.strip()}


def test_notes_name_every_values_key_that_does_nothing(tmp_path: Path) -> None:
    """Each inert key, set, is named in NOTES; and it is truly inert: the manifests are
    the same as with it asking for nothing."""
    on = _values_file(tmp_path, "on", INERT_VALUES)
    off = _values_file(tmp_path, "off", INERT_OFF)
    assert _warned(_notes(tmp_path, [on])) == set(INERT_VALUES)
    assert _warned(_notes(tmp_path, [off])) == set()
    assert template(values=[on]) == template(values=[off])
    # The defaults ask for nothing inert (upgradeCRD acts: the pre-upgrade hook); with
    # it off, NOTES say how to keep the CRDs current by hand.
    defaults = _notes(tmp_path)
    assert _warned(defaults) == set()
    assert "Helm never upgrades crds/" not in defaults
    no_hook = _values_file(tmp_path, "nohook", {"operator.upgradeCRD": False})
    assert "Helm never upgrades crds/" in _notes(tmp_path, [no_hook])


#: Sections switched on for the sweep below, so keys only read when they are on count.
_SWEEP_BASE: dict[str, Any] = {
    "driver.nvidiaDriverCRD.enabled": True,
    "driver.licensingConfig.secretName": "licence",
    "devicePlugin.config.name": "plugin-config",
    "devicePlugin.config.create": True,
    "devicePlugin.config.data": {"a": "b"},
    "migManager.config.name": "mig-config",
    "migManager.config.create": True,
    "migManager.config.data": {"a": "b"},
    "monitoring.alertRules.configMap": True,
    "monitoring.dashboard.enabled": True,
    "monitoring.operatorDown.prometheusRule": True,
    # the time zone is written only beside windows
    "driver.upgradePolicy.maintenanceWindows": ["0 2 * * * 1h"],
}

#: Keys (by prefix) read only under another base: the GPUCluster's, which cannot coexist
#: with the ClusterPolicy (the chart refuses both).
_SWEEP_OTHER_BASE: dict[str, dict[str, Any]] = {
    "draDriver.": {"gpuCluster.deployCR": True, "clusterPolicy.deployCR": False},
}

#: A GPUCluster renders only where the DRA API is served.
_DRA_API = ("--api-versions", "resource.k8s.io/v1/DeviceClass")


def _changed(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 7
    if isinstance(value, str):
        return f"{value}-changed" if value else "changed"
    if isinstance(value, list):
        return [*value, value[0]] if value else ["changed"]
    if isinstance(value, dict):
        return {"changed": "yes"}
    return "changed"


def _value_leaves(tree: Any, path: tuple[str, ...] = ()) -> Iterable[tuple[tuple[str, ...], Any]]:
    if isinstance(tree, dict) and tree:
        for key, value in tree.items():
            yield from _value_leaves(value, (*path, key))
    else:
        yield path, tree


def test_every_other_values_key_changes_what_the_chart_renders(tmp_path: Path) -> None:
    """Every key of values.yaml not in INERT_VALUES (and NOTES) acts: changed alone, on
    top of a base that switches the conditional sections on, it changes the rendered
    objects (or is refused by the chart's own checks)."""
    base_file = _values_file(tmp_path, "base", _SWEEP_BASE)
    base = template("--include-crds", *_DRA_API, values=[base_file])
    effective = {**dict(_value_leaves(yaml.safe_load((CHART / "values.yaml").read_text())))}
    effective.update({tuple(k.split(".")): v for k, v in _SWEEP_BASE.items()})
    inert = {tuple(k.split(".")) for k in INERT_VALUES}

    other_files = {p: _values_file(tmp_path, f"other{i}", flat) for i, (p, flat) in
                   enumerate(_SWEEP_OTHER_BASE.items())}  # fmt: skip
    other_base = {
        p: template("--include-crds", *_DRA_API, values=[base_file, f])
        for p, f in other_files.items()
    }

    def acts(item: tuple[int, tuple[tuple[str, ...], Any]]) -> str | None:
        i, (path, value) = item
        key = ".".join(path)
        override = _values_file(tmp_path, f"k{i}", {key: _changed(value)})
        prefix = next((p for p in other_files if key.startswith(p)), None)
        extra = [str(other_files[prefix])] if prefix else []
        proc = subprocess.run(
            [str(ensure_helm()), "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
             "--include-crds", *_DRA_API, "--values", str(base_file),
             *[a for f in extra for a in ("--values", f)], "--values", str(override)],
            capture_output=True, text=True, check=False, timeout=120,
        )  # fmt: skip
        if proc.returncode != 0 or proc.stdout != (other_base[prefix] if prefix else base):
            return None
        return key

    items = [(p, v) for p, v in effective.items() if p not in inert and p[:1] not in inert]
    with ThreadPoolExecutor(2) as pool:
        silent = sorted(k for k in pool.map(acts, enumerate(items)) if k is not None)
    assert silent == []


def test_gpucluster_deploy_cr_renders_a_gpucluster_with_the_dra_driver_values() -> None:
    """gpuCluster.deployCR writes the GPUCluster our models parse, carrying draDriver
    and the dcgm, dcgmExporter, hostPaths and daemonsets values; kept on uninstall."""
    docs = documents(
        template(
            *_DRA_API,
            *_set(
                [
                    "gpuCluster.deployCR=true",
                    "clusterPolicy.deployCR=false",
                    "driver.nvidiaDriverCRD.enabled=true",
                    "draDriver.version=v9.9.9",
                    "draDriver.featureGates.MPSSupport=true",
                    "draDriver.computeDomains.enabled=false",
                    "dcgm.enabled=true",
                ]
            ),
        )
    )
    gc = one(docs, "GPUCluster")
    assert gc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    spec = crd.parse_gpucluster(gc).spec
    assert spec.dra_driver.version == "v9.9.9"
    assert spec.dra_driver.feature_gates == {"MPSSupport": True}
    assert not spec.dra_driver.compute_domains.enabled
    assert spec.dcgm_enabled
    assert spec.exporter_enabled
    assert not [d for d in docs if d["kind"] == "ClusterPolicy"]
    assert not [d for d in documents(template()) if d["kind"] == "GPUCluster"]


# --------------------------------------------------------------- chart parity
def test_operator_pod_annotations_node_selector_and_name_override_as_upstream(
    default_docs: list[dict[str, Any]],
) -> None:
    """As upstream's chart: operator.annotations annotate the operator pods (the pod
    template, not the Deployment), the operator runs on Linux nodes by default, and
    nameOverride sets the app.kubernetes.io/name label of the chart's objects while
    every object name, the operator's selector and NFD's labels stay fixed."""
    deployment = one(default_docs, "Deployment", "gpu-operator")
    pod = deployment["spec"]["template"]
    assert pod["spec"]["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert "annotations" not in deployment["metadata"]
    assert "annotations" not in pod["metadata"]
    docs = documents(
        template(
            *_set(
                [
                    "operator.annotations.team=gpu",
                    "operator.annotations.shared=operator",
                    "operator.podAnnotations.shared=pod",
                    "nameOverride=gpu-stack",
                    "fullnameOverride=ignored",
                ]
            )
        )
    )
    deployment = one(docs, "Deployment", "gpu-operator")
    assert "annotations" not in deployment["metadata"]
    pod = deployment["spec"]["template"]
    assert pod["metadata"]["annotations"] == {"team": "gpu", "shared": "pod"}
    assert pod["metadata"]["labels"]["app.kubernetes.io/name"] == "gpu-stack"
    assert deployment["metadata"]["labels"]["app.kubernetes.io/name"] == "gpu-stack"
    assert (
        deployment["spec"]["selector"]
        == one(default_docs, "Deployment", "gpu-operator")["spec"]["selector"]
    )
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert names == {(d["kind"], d["metadata"]["name"]) for d in default_docs}
    for doc in docs:
        label = doc["metadata"].get("labels", {}).get("app.kubernetes.io/name")
        assert label in (None, "gpu-stack", "node-feature-discovery"), doc["metadata"]["name"]
    # The umbrella form sets it too.
    nested = documents(template("--set", "gpu-operator.nameOverride=nested"))
    labels = one(nested, "Deployment", "gpu-operator")["metadata"]["labels"]
    assert labels["app.kubernetes.io/name"] == "nested"


#: What upstream's chart refuses at template time (its templates/validations.yaml), as
#: --set pairs, with a key each refusal's one line names.
REFUSED: list[tuple[list[str], str]] = [
    (["gpuCluster.deployCR=true"], "clusterPolicy.deployCR"),
    (
        ["gpuCluster.deployCR=true", "clusterPolicy.deployCR=false"],
        "driver.nvidiaDriverCRD.enabled",
    ),
    (["cdi.enabled=false", "cdi.nriPluginEnabled=true"], "cdi.enabled"),
    (["toolkit.enabled=false", "cdi.nriPluginEnabled=true"], "toolkit.enabled"),
    (
        ["devicePlugin.config.create=true", "devicePlugin.config.name=plugin-config"],
        "devicePlugin.config.data",
    ),
    (
        ["devicePlugin.config.create=true", "devicePlugin.config.data.a=b"],
        "devicePlugin.config.name",
    ),
]


@pytest.mark.parametrize(("pairs", "named"), REFUSED, ids=[r[1] for r in REFUSED])
def test_the_chart_refuses_what_upstreams_refuses_in_one_line(pairs: list[str], named: str) -> None:
    out = helm("template", RELEASE, str(CHART), *_DRA_API, *_set(pairs), check=False)
    errors = [line for line in out.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, out
    assert named in errors[0]
    assert "kind:" not in out


def test_a_gpucluster_needs_the_dra_api_served() -> None:
    pairs = ["gpuCluster.deployCR=true", "clusterPolicy.deployCR=false", "driver.enabled=false"]
    refused = helm("template", RELEASE, str(CHART), *_set(pairs), check=False)
    (line,) = [ln for ln in refused.splitlines() if ln.startswith("Error:")]
    assert "gpuCluster.deployCR" in line
    assert "resource.k8s.io" in line
    for version in ("v1", "v1beta2", "v1beta1"):
        api = ("--api-versions", f"resource.k8s.io/{version}/DeviceClass")
        assert by_kind(documents(template(*api, *_set(pairs))), "GPUCluster")


# -------------------------------------------------------------- values schema
def test_values_schema_is_generated_from_values_yaml() -> None:
    assert VALUES_SCHEMA.read_text() == render_values_schema(CHART / "values.yaml"), (
        f"{VALUES_SCHEMA} is out of date: regenerate with `python -m tests.integration.helm_chart`"
    )


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--set", "operator.replicas=two"], "/operator/replicas"),
        (["--set-string", "driver.enabled=yes"], "/driver/enabled"),
        (["--set", "operatr.replicas=2"], "'operatr'"),
        (["--set", "gpu-operator.operator.replicas=two"], "/gpu-operator/operator/replicas"),
        (["--set", "gpu-operator.operatr.replicas=2"], "'operatr'"),
        (["--set", "healthRemediation.action=reboot"], "/healthRemediation/action"),
    ],
    ids=["type", "bool", "unknown", "umbrella-type", "umbrella-unknown", "model"],
)
def test_values_schema_refuses_a_wrong_type_or_unknown_key_naming_it(
    args: list[str], named: str
) -> None:
    refused = helm("template", RELEASE, str(CHART), *args, check=False)
    assert "don't meet the specifications of the schema" in refused, refused
    assert named in refused, refused
    assert "kind:" not in refused


def test_every_values_file_of_the_tests_meets_the_schema() -> None:
    """Upstream's values.yaml (with gpuop's operator image, the one key it must change)
    and the marketplace samples pass the schema; so do keys only documented in
    values.yaml (healthRemediation, operator.metrics) and Helm's `global`."""
    for path in (UPSTREAM_VALUES, *SEED004, *sorted(DATA.glob("values*.yaml"))):
        template(*OUR_OPERATOR_IMAGE, values=[path])
    template(
        *_set(
            [
                "healthRemediation.enabled=true",
                "healthRemediation.maxUnhealthy=2",
                "operator.metrics.serviceMonitor.interval=30s",
                "global.imageRegistry=x",
                "operator.version=1.2",
                "driver.upgradePolicy.maxUnavailable=3",
            ]
        )
    )


# ------------------------------------------------------------ release artefacts
def test_helm_package_renders_as_the_chart_directory(tmp_path: Path) -> None:
    """`helm package` makes the release artefact; it holds the schema and renders what the
    directory does (the plain-file copies under files/ included)."""
    helm("package", str(CHART), "--destination", str(tmp_path))
    chart_meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    (package,) = tmp_path.glob("*.tgz")
    assert package.name == f"{chart_meta['name']}-{chart_meta['version']}.tgz"
    for args in (("--include-crds",), ("--include-crds", *_set(EVERYTHING_ON))):
        from_package = helm("template", RELEASE, str(package), "--namespace", NAMESPACE, *args)
        assert from_package == template(*args)
    refused = helm("template", RELEASE, str(package), "--set", "operator.replicas=two", check=False)
    assert "/operator/replicas" in refused


# ------------------------------------------------------------------ NFD parity
UPSTREAM_RENDERED = DATA / "upstream-helm-release" / "rendered.yaml"
_NFD_SOURCE = "# Source: gpu-operator/charts/node-feature-discovery/templates/"


def _upstream_nfd_docs() -> list[dict[str, Any]]:
    """The objects of upstream's bundled NFD chart (not its CRDs: ours are in crds/)."""
    chunks = UPSTREAM_RENDERED.read_text().split("\n---\n")
    return [yaml.safe_load(c) for c in chunks if c.lstrip().startswith(_NFD_SOURCE)]


def _without_documented_differences(doc: Any) -> Any:
    """The differences kept on purpose: `helm.sh/chart` names our chart (NFD's 0.19.0
    chart is not a subchart of ours), the pods' `checksum/config` hashes our own
    ConfigMap text; and fields upstream renders empty (`revisionHistoryLimit:`,
    `imagePullSecrets:`), which the API server drops, are left out by ours."""
    if isinstance(doc, dict):
        return {
            k: _without_documented_differences(v)
            for k, v in doc.items()
            if v is not None and k not in ("helm.sh/chart", "checksum/config")
        }
    if isinstance(doc, list):
        return [_without_documented_differences(v) for v in doc]
    return doc


def test_nfd_objects_are_upstreams() -> None:
    """Our NFD bundle, given upstream's values file, renders upstream's NFD objects
    (master, worker, gc, their ConfigMaps and RBAC, the prune hook): same kinds, names,
    image v0.19.0 and fields, with the documented differences only."""
    theirs = {(d["kind"], d["metadata"]["name"]): d for d in _upstream_nfd_docs()}
    ours_all = documents(template(*OUR_OPERATOR_IMAGE, values=[UPSTREAM_VALUES]))
    ours = {
        (d["kind"], d["metadata"]["name"]): d
        for d in ours_all
        if d["metadata"].get("labels", {}).get("app.kubernetes.io/name") == "node-feature-discovery"
        and d["kind"] != "CustomResourceDefinition"
    }
    assert len(theirs) == 16
    assert sorted(ours) == sorted(theirs)
    for key, doc in theirs.items():
        assert _without_documented_differences(ours[key]) == _without_documented_differences(doc), (
            key
        )
    # The pods restart when their configuration changes, as upstream's.
    for key in (("DaemonSet", f"{RELEASE}-node-feature-discovery-worker"),
                ("Deployment", f"{RELEASE}-node-feature-discovery-master")):  # fmt: skip
        assert "checksum/config" in ours[key]["spec"]["template"]["metadata"]["annotations"]
    assert ours[key]["metadata"]["labels"]["helm.sh/chart"].startswith("gpu-operator-")
