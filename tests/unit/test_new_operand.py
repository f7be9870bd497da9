"""Issue 45, item 4: a new operand is its module, its spec class and one registry line.

The product packages are copied aside and a made-up node operand is added to the copy
the way a developer would add one; the test counts the product files that had to be
edited by hand, then renders a policy enabling the operand in a fresh interpreter and
checks that everything derived from the declaration picks it up: its DaemonSet,
account and RBAC, deploy label and placement, containers, the CRD schema and its image
default, the honoured `hostNetwork`, and the chart's operand role list.
"""

from __future__ import annotations

import filecmp
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from components import rbac

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("components", "crd")
"""What the operand touches: the pure core (the shell reads everything from it)."""
MAX_HAND_EDITED = 4

_MODULE = '''
"""dummy-operand: a made-up node operand on VM hosts (the test's)."""

from components._host_paths import host_path, mount
from components._k8s import container, env
from components.component import VM_HOSTS, rule
from components.keys import DEPLOY_LABEL_PREFIX
from components.operand import Operand, Pod
from crd import component_image

SECTION = "dummyOperand"


def pod(spec, ctx):
    main = container(
        "nvidia-dummy-ctr",
        component_image(spec, SECTION),
        spec.dummy_operand,
        env_vars=[env("DUMMY", "1")],
        mounts=[mount("host-sys", "/sys")],
    )
    return Pod(containers=[main], volumes=[host_path("host-sys", "/sys")])


OPERAND = Operand(
    name="dummy-operand",
    section=SECTION,
    daemonset="nvidia-dummy-daemonset",
    account="nvidia-dummy",
    deploy_label=DEPLOY_LABEL_PREFIX + "dummy",
    pod=pod,
    placement=VM_HOSTS,
    cluster=(rule("", "nodes", "get"),),
)
COMPONENT = OPERAND.component()
'''

_SPEC_CLASS = '''

class DummyOperandSpec(ComponentSpec):
    """A made-up operand (the test's)."""

    default_image = DefaultImage(CLOUD_NATIVE, "dummy", "v1.2.3")

    enabled: bool = False
    """Deploy the dummy operand."""
'''


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{path.name} changed its layout: update this test"
    path.write_text(text.replace(old, new))


def _add_operand(tree: Path) -> None:
    """What a developer adds: the module, the spec class (its section on the policy)
    and the registry line (its import and its place in the rollout)."""
    (tree / "components" / "dummy_operand.py").write_text(_MODULE)
    components = tree / "crd" / "_components.py"
    components.write_text(components.read_text() + _SPEC_CLASS)
    policy = tree / "crd" / "_policy.py"
    _edit(policy, "    DevicePluginSpec,\n", "    DevicePluginSpec,\n    DummyOperandSpec,\n")
    _edit(
        policy,
        "    health_remediation: HealthRemediationSpec | None = None\n",
        "    dummy_operand: DummyOperandSpec = Field(default_factory=DummyOperandSpec)\n"
        '    """The dummy operand."""\n'
        "    health_remediation: HealthRemediationSpec | None = None\n",
    )
    registry = tree / "components" / "registry.py"
    _edit(registry, "    driver,\n", "    driver,\n    dummy_operand,\n")
    last = "    cc_manager.COMPONENT,\n"
    _edit(registry, f"{last})", f"{last}    dummy_operand.COMPONENT,\n)")


def _hand_edited(tree: Path) -> list[str]:
    """The product files of the copy that differ from the repository's, or are new."""
    edited = []
    for package in PACKAGES:
        for path in sorted((tree / package).rglob("*")):
            if path.is_dir() or "__pycache__" in path.parts:
                continue
            original = ROOT / path.relative_to(tree)
            if not original.exists() or not filecmp.cmp(path, original, shallow=False):
                edited.append(str(path.relative_to(tree)))
    return edited


_PROBE = r"""
import json, sys

import components as c
import crd
import yaml
from components import rbac
from components.keys import VM_PASSTHROUGH_WORKLOAD, VM_VGPU_WORKLOAD, CONTAINER_WORKLOAD

spec = crd.ClusterPolicySpec.model_validate(
    {"dummyOperand": {"enabled": True, "hostNetwork": True, "imagePullSecrets": ["pull"]}}
)
ctx = c.RenderContext(namespace="ns", operator_image="op")
comp = c.component_by_name("dummy-operand")
out = {
    "order": list(c.ROLLOUT_ORDER),
    "objects": comp.objects(spec, ctx),
    "off": comp.objects(crd.ClusterPolicySpec(), ctx),
    "kinds": sorted(k.kind for k in comp.kinds),
    "deploy_labels": list(c.DEPLOY_LABELS),
    "placed": {
        w: sorted(c.registry.eligible_deploy_labels({}, w))
        for w in (CONTAINER_WORKLOAD, VM_PASSTHROUGH_WORKLOAD, VM_VGPU_WORKLOAD)
    },
    "default_image": crd.DEFAULT_IMAGES["dummyOperand"].ref,
    "unsupported": [str(f) for f in crd.unsupported_fields(spec)],
    "schema": yaml.safe_load(crd.render_crd_yaml())["spec"]["versions"][0]["schema"]
        ["openAPIV3Schema"]["properties"]["spec"]["properties"]["dummyOperand"],
    "chart_missing": rbac.chart_roles_missing(open(sys.argv[1]).read(), c.COMPONENTS),
    "chart_regenerated": rbac.chart_roles_yaml(c.COMPONENTS),
}
out["chart_missing_after"] = rbac.chart_roles_missing(out["chart_regenerated"], c.COMPONENTS)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def added(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], dict[str, Any]]:
    tree = tmp_path_factory.mktemp("product")
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tree / package, ignore=shutil.ignore_patterns("*.pyc"))
    _add_operand(tree)
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, str(ROOT / rbac.CHART_ROLES_FILE)],
        capture_output=True,
        text=True,
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        check=False,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return _hand_edited(tree), json.loads(proc.stdout)


def test_adding_an_operand_touches_at_most_four_product_files(
    added: tuple[list[str], dict[str, Any]],
) -> None:
    edited, _ = added
    assert edited == [
        "components/dummy_operand.py",
        "components/registry.py",
        "crd/_components.py",
        "crd/_policy.py",
    ]
    assert len(edited) <= MAX_HAND_EDITED


def test_the_new_operand_renders_from_its_declaration(
    added: tuple[list[str], dict[str, Any]],
) -> None:
    _, out = added
    assert out["order"][-1] == "dummy-operand"
    assert out["off"] == []  # its section's switch, off by default
    objects = {(o["kind"], o["metadata"]["name"]): o for o in out["objects"]}
    assert set(objects) == {
        ("ServiceAccount", "nvidia-dummy"),
        ("Role", "nvidia-dummy"),
        ("RoleBinding", "nvidia-dummy"),
        ("ClusterRole", "nvidia-dummy"),
        ("ClusterRoleBinding", "nvidia-dummy"),
        ("DaemonSet", "nvidia-dummy-daemonset"),
    }
    assert {kind for kind, _ in objects} == set(out["kinds"])
    assert objects["ClusterRole", "nvidia-dummy"]["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}
    ]
    ds = objects["DaemonSet", "nvidia-dummy-daemonset"]
    assert ds["metadata"]["labels"]["app.kubernetes.io/component"] == "dummy-operand"
    pod = ds["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "nvidia-dummy"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.deploy.dummy": "true"}
    assert pod["hostNetwork"] is True
    assert pod["imagePullSecrets"] == [{"name": "pull"}]
    (main,) = pod["containers"]
    assert main["name"] == "nvidia-dummy-ctr"
    assert main["image"] == out["default_image"] == "nvcr.io/nvidia/cloud-native/dummy:v1.2.3"
    assert main["env"] == [{"name": "DUMMY", "value": "1"}]
    assert pod["volumes"] == [{"name": "host-sys", "hostPath": {"path": "/sys"}}]


def test_the_new_operand_is_placed_by_its_declaration(
    added: tuple[list[str], dict[str, Any]],
) -> None:
    _, out = added
    label = "nvidia.com/gpu.deploy.dummy"
    assert label in out["deploy_labels"]
    placed = {workload: label in labels for workload, labels in out["placed"].items()}
    assert placed == {"container": False, "vm-passthrough": True, "vm-vgpu": True}


def test_the_crd_side_derives_from_the_spec_class(
    added: tuple[list[str], dict[str, Any]],
) -> None:
    _, out = added
    schema = out["schema"]
    assert schema["default"] == {}
    assert schema["properties"]["enabled"]["default"] is False
    assert {"image", "repository", "version", "hostNetwork"} <= set(schema["properties"])
    assert out["unsupported"] == []  # its hostNetwork is honoured: the class says so


def test_the_chart_role_check_names_the_new_operand_until_regenerated(
    added: tuple[list[str], dict[str, Any]],
) -> None:
    _, out = added
    assert out["chart_missing"] == ["nvidia-dummy"]
    regenerated = out["chart_regenerated"]
    assert "- nvidia-dummy\n" in regenerated
    assert out["chart_missing_after"] == []
