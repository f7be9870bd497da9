"""The operand registry is the one list: operands declare honestly what they render and
grant, the chart's RBAC holds what they declare, and a new operand needs one module and
its registry line, nothing else."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import components as c
from components import rbac
from components.component import Rule
from tests.unit.test_components_render import ctx, everything, load_spec, spec

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "deploy" / "manifests" / "gpu-operator.yaml"
"""The chart rendered with its default values (kept equal to `helm template` by
tests/integration/test_helm.py), so this needs no Helm binary."""
DRA_RBAC_MANIFESTS = ROOT / "deploy" / "manifests" / "gpu-operator-dra-rbac.yaml"
"""The chart's DRA rights (gpuCluster.rbac=true), kept equal to `helm template` too."""
OPERATOR = "gpu-operator"

POLICIES = {
    "default": spec(),
    "everything": everything(),
    "everything-kata": everything("kata"),
    "seed004": load_spec("clusterpolicy_seed004.yaml"),
    "off": spec(**{s: {"enabled": False} for s in ("driver", "toolkit", "devicePlugin")}),
}
CONTEXTS = [ctx(), ctx(mig_capable=False, service_monitor_crd=False)]


def _rendered(comp: c.Component) -> list[c.Manifest]:
    return [o for p in POLICIES.values() for x in CONTEXTS for o in comp.objects(p, x)]


@pytest.mark.parametrize("comp", c.COMPONENTS, ids=lambda x: x.name)
def test_declared_kinds_are_the_rendered_ones(comp: c.Component) -> None:
    """Each kind rendered is declared (so it is watched and pruned), and each declared
    kind is rendered by some policy (no stale declaration)."""
    rendered = {(o["apiVersion"], o["kind"]) for o in _rendered(comp)}
    declared = {(k.api_version, k.kind) for k in comp.kinds}
    assert rendered == declared
    for obj in _rendered(comp):
        kind = next(k for k in comp.kinds if k.kind == obj["kind"])
        assert ("namespace" in obj["metadata"]) == kind.namespaced, obj["metadata"]


@pytest.mark.parametrize("comp", c.COMPONENTS, ids=lambda x: x.name)
def test_declared_permissions_are_what_the_operand_grants(comp: c.Component) -> None:
    objects = [*comp.objects(everything(), ctx())]
    if not objects:  # the Kata device plugin and the CC manager: mode kata only
        objects = comp.objects(everything("kata"), ctx())
    roles = [r for o in objects if o["kind"] == "Role" for r in o["rules"]]
    cluster_roles = [r for o in objects if o["kind"] == "ClusterRole" for r in o["rules"]]
    assert roles == list(comp.permissions.role)
    assert cluster_roles == list(comp.permissions.cluster)


@pytest.mark.parametrize("comp", c.COMPONENTS, ids=lambda x: x.name)
def test_declared_cluster_roles_are_the_rendered_ones(comp: c.Component) -> None:
    """The chart lets the operator write only the declared ClusterRoles: each rendered
    one (and its binding) is declared, and each declared one is rendered."""
    for kind in ("ClusterRole", "ClusterRoleBinding"):
        rendered = {o["metadata"]["name"] for o in _rendered(comp) if o["kind"] == kind}
        assert rendered == set(comp.cluster_roles), kind


def test_the_charts_operand_roles_are_generated_from_the_registry() -> None:
    """deploy/helm/gpu-operator/files/operand-roles.yaml is `rbac.chart_roles_yaml`'s
    (regenerate with `python -m tests.integration.helm_chart`)."""
    text = (ROOT / rbac.CHART_ROLES_FILE).read_text()
    assert text == rbac.chart_roles_yaml(c.COMPONENTS)
    assert rbac.chart_roles_missing(text, c.COMPONENTS) == []
    without = text.replace("- nvidia-kata-sandbox-device-plugin\n", "")
    assert rbac.chart_roles_missing(without, c.COMPONENTS) == ["nvidia-kata-sandbox-device-plugin"]


def test_prometheus_operator_kinds_are_owned_but_watched_only_where_served() -> None:
    for kind in ("ServiceMonitor", "PrometheusRule"):
        found = next(k for k in c.OWNED_KINDS if k.kind == kind)
        assert found.optional
        assert found.group == "monitoring.coreos.com"
    assert [k.kind for k in c.OWNED_KINDS if k.optional] == ["ServiceMonitor", "PrometheusRule"]


def test_derived_lists() -> None:
    assert tuple(x.name for x in c.COMPONENTS) == c.ROLLOUT_ORDER
    # Every owned deploy label selects its operand's DaemonSet; the client label is
    # upstream's and no operand's.
    assert c.DEPLOY_LABELS[-1] == c.registry.EXTRA_DEPLOY_LABELS[-1][0]
    assert len(set(c.DEPLOY_LABELS)) == len(c.DEPLOY_LABELS)
    mig_only = {x.deploy_label for x in c.COMPONENTS if not x.eligible({})}
    assert mig_only == {c.DEPLOY_MIG_MANAGER_LABEL}


def _operator_rules(dra: bool = False) -> tuple[list[Rule], list[Rule]]:
    """The operator's ClusterRole and Role rules as the chart's defaults grant them;
    with `dra`, also what the chart grants once a GPUCluster is enabled."""
    docs = [d for d in yaml.safe_load_all(MANIFESTS.read_text()) if d]
    names = {OPERATOR}
    if dra:
        docs += [d for d in yaml.safe_load_all(DRA_RBAC_MANIFESTS.read_text()) if d]
        names.add(f"{OPERATOR}-dra")

    def rules(kind: str) -> list[Rule]:
        return [
            r
            for d in docs
            if d["kind"] == kind and d["metadata"]["name"] in names
            for r in d["rules"]
        ]

    return rules("ClusterRole"), rules("Role")


def _cluster_names(components: tuple[c.Component, ...]) -> dict[str, set[str]]:
    names: dict[str, set[str]] = {}
    for comp in components:
        for obj in _rendered(comp):
            if "namespace" not in obj["metadata"]:
                names.setdefault(obj["kind"], set()).add(obj["metadata"]["name"])
    return names


def test_chart_holds_every_permission_the_registry_needs() -> None:
    cluster, role = _operator_rules()
    assert cluster
    assert role
    needs = rbac.operand_needs(c.COMPONENTS, _cluster_names(c.COMPONENTS))
    assert {n.why for n in needs} >= {"owns ServiceMonitor", "mig-manager grants it"}
    assert [str(n) for n in rbac.missing(cluster, role, needs)] == []


def test_the_check_fails_when_the_chart_lacks_a_permission() -> None:
    cluster, role = _operator_rules()
    needs = rbac.operand_needs(c.COMPONENTS, _cluster_names(c.COMPONENTS))
    monitors = [r for r in role if "servicemonitors" in r["resources"]]
    without = [r for r in role if r not in monitors]
    lost = rbac.missing(cluster, without, needs)
    assert {(n.resource, n.verb) for n in lost} == {
        (r, v) for r in ("servicemonitors", "prometheusrules") for v in rbac.NAMESPACED_VERBS
    }
    # A verb on a cluster-scoped object is needed by name: the RuntimeClass's.
    named = [r for r in cluster if r.get("resourceNames") and "runtimeclasses" in r["resources"]]
    assert rbac.missing([r for r in cluster if r not in named], role, needs)


# -------------------------------------------------------------- a new operand
_DUMMY = '''
"""A made-up operand: one PodDisruptionBudget, a permission, its own deploy label."""
from components.component import Component, ObjectKind, Permissions
from components.keys import DEPLOY_LABEL_PREFIX, TRUE

NAME = "dummy-operand"
DEPLOY_LABEL = DEPLOY_LABEL_PREFIX + NAME
KIND = ObjectKind("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets")
RULE = {"apiGroups": ["example.com"], "resources": ["widgets"], "verbs": ["get"]}


def render(spec, ctx):
    meta = {"name": "nvidia-dummy", "namespace": ctx.namespace}
    return [{"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": meta}]


COMPONENT = Component(
    name=NAME,
    deploy_label=DEPLOY_LABEL,
    is_enabled=lambda spec: True,
    render=render,
    kinds=(KIND,),
    permissions=Permissions(role=(RULE,)),
    eligible=lambda labels: labels.get("example.com/dummy") == TRUE,
)
'''

#: Runs in a fresh interpreter: the registry is loaded from its own source with the
#: dummy's import and tuple entry added, then everything else is imported unchanged.
_PROBE = r"""
import importlib.abc, importlib.util, json, sys
from pathlib import Path

root, dummy = Path(sys.argv[1]), sys.argv[2]
source = (root / "components" / "registry.py").read_text()
source = source.replace(
    "    vgpu_manager,\n)", "    vgpu_manager,\n)\nfrom components import dummy", 1
)
source = source.replace(
    "    device_plugin.COMPONENT,\n", "    device_plugin.COMPONENT,\n    dummy.COMPONENT,\n", 1
)
assert source.count("dummy") == 2, "the registry's layout changed: update this test"
texts = {"components.registry": source, "components.dummy": dummy}


class Patched(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name in texts:
            origin = str(root / "components" / (name.split(".")[1] + ".py"))
            return importlib.util.spec_from_loader(name, self, origin=origin)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        exec(compile(texts[module.__name__], module.__spec__.origin, "exec"), module.__dict__)


sys.meta_path.insert(0, Patched())
import components as c
import crd
from components import rbac
from gpuop.operator.controller.base import optional_watches as _owned
from gpuop.kube.kinds import kind_of
from gpuop.kube.rest import collection_path
from statemachine.rollout import ROLLOUT_ORDER, ComponentStatus, plan_rollout

out = {}
out["order"] = list(ROLLOUT_ORDER)
snapshot = {n: ComponentStatus(enabled=True, ready=n != "dummy-operand") for n in ROLLOUT_ORDER}
out["blocking"] = plan_rollout(snapshot).current
out["deploy_labels"] = list(c.DEPLOY_LABELS)
gpu = {"feature.node.kubernetes.io/pci-10de.present": "true"}
policy = crd.default_policy().spec
out["labels_eligible"] = c.node_label_changes({**gpu, "example.com/dummy": "true"}, policy)
out["labels_other"] = c.node_label_changes(gpu, policy)
out["owned"] = sorted(k.kind for k in _owned.OWNED_NAMESPACED)
out["watched"] = sorted(k.kind for k in _owned.ALWAYS_WATCHED)
out["pruned"] = _owned.OWNED_BY_NAME["PodDisruptionBudget"].plural
ctx = c.RenderContext(namespace="ns", operator_image="x")
(obj,) = c.component_by_name("dummy-operand").objects(policy, ctx)
out["rest_path"] = collection_path(kind_of(obj), "ns")
out["needs"] = [[n.group, n.resource, n.verb, n.why] for n in rbac.operand_needs(c.COMPONENTS)]
print(json.dumps(out))
"""


def test_a_new_operand_is_one_module_and_one_registry_line() -> None:
    """Everything the operator derives picks the new operand up: rollout position, deploy
    label (on the nodes it is eligible for), watched and pruned kind, the API path, and
    the permissions the chart must then grant."""
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, str(ROOT), _DUMMY],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        check=False,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout)
    order = out["order"]
    assert order.index("dummy-operand") == order.index("device-plugin") + 1
    assert order == [*c.ROLLOUT_ORDER[:6], "dummy-operand", *c.ROLLOUT_ORDER[6:]]
    assert out["blocking"] == "dummy-operand"
    label = c.DEPLOY_LABEL_PREFIX + "dummy-operand"
    assert label in out["deploy_labels"]
    assert out["labels_eligible"][label] == "true"
    assert label not in out["labels_other"]
    assert "PodDisruptionBudget" in out["owned"]
    assert "PodDisruptionBudget" in out["watched"]
    assert out["pruned"] == "poddisruptionbudgets"
    assert out["rest_path"] == "/apis/policy/v1/namespaces/ns/poddisruptionbudgets"
    # The chart check now asks for what the dummy needs, and only that is missing.
    cluster, role = _operator_rules()
    needs = [rbac.Need(False, g, r, v, why=w) for g, r, v, w in out["needs"]]
    lost = {(n.group, n.resource, n.verb) for n in rbac.missing(cluster, role, needs)}
    assert lost == {("example.com", "widgets", "get")} | {
        ("policy", "poddisruptionbudgets", v) for v in rbac.NAMESPACED_VERBS
    }
