"""NVIDIADriver: the generated CRD, owner assignment (pure) and per-pool rendering."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

import crd
from components import RenderContext
from components.nvidiadriver import (
    NVIDIADriverRenderError,
    app_name,
    node_pools,
    render,
)
from gpuop.cli import main
from statemachine.driver_owner import (
    NEXT_OWNER_LABEL,
    OWNER_LABEL,
    REASON_CONFLICT,
    REASON_FAILED,
    DriverResource,
    assign_owners,
)

ROOT = Path(__file__).resolve().parents[2]
OS_ID = "feature.node.kubernetes.io/system-os_release.ID"
OS_VERSION = "feature.node.kubernetes.io/system-os_release.VERSION_ID"
KERNEL = "feature.node.kubernetes.io/kernel-version.full"
PRODUCT = "nvidia.com/gpu.product"


# ------------------------------------------------------------------ the CRD
def _gpuop_crd_output() -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["crd", "nvidiadrivers"]) == 0
    return out.getvalue()


@pytest.mark.parametrize("path", [crd.NVD_CRD_FILE, *crd.NVD_CHART_CRD_FILES])
def test_checked_in_crd_is_gpuop_crd_output(path: str) -> None:
    assert (ROOT / path).read_text() == _gpuop_crd_output(), (
        f"{path} out of date: regenerate with `gpuop crd nvidiadrivers > {path}`"
    )


def test_crd_identity_as_upstream() -> None:
    manifest = crd.nvd_crd_manifest()
    spec = manifest["spec"]
    assert manifest["metadata"]["name"] == "nvidiadrivers.nvidia.com"
    assert spec["scope"] == "Cluster"
    assert spec["names"]["kind"] == "NVIDIADriver"
    assert spec["names"]["shortNames"] == ["nvd", "nvdriver", "nvdrivers"]
    (version,) = spec["versions"]
    assert version["name"] == "v1alpha1"
    assert [c["jsonPath"] for c in version["additionalPrinterColumns"]] == [
        ".status.state",
        ".spec.default",
        ".metadata.creationTimestamp",
    ]
    props = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    for field in (
        "default",
        "driverType",
        "usePrecompiled",
        "kernelModuleType",
        "startupProbe",
        "rdma",
        "gds",
        "gdrcopy",
        "repository",
        "image",
        "version",
        "imagePullPolicy",
        "imagePullSecrets",
        "manager",
        "repoConfig",
        "certConfig",
        "licensingConfig",
        "virtualTopologyConfig",
        "kernelModuleConfig",
        "secretEnv",
        "upgradePolicy",
        "nodeSelector",
        "nodeAffinity",
        "labels",
        "annotations",
        "tolerations",
        "priorityClassName",
        "podSecurityContext",
        "hostNetwork",
    ):
        assert field in props, field
    assert props["driverType"]["enum"] == ["gpu", "vgpu", "vgpu-host-manager"]
    for immutable in ("driverType", "usePrecompiled"):
        rules = props[immutable]["x-kubernetes-validations"]
        assert rules[0]["rule"] == "self == oldSelf"


def test_model_rejects_unknown_fields_and_bad_driver_type() -> None:
    with pytest.raises(ValidationError):
        crd.NVIDIADriverSpec.model_validate({"driverTyp": "gpu"})
    with pytest.raises(ValidationError):
        crd.NVIDIADriverSpec.model_validate({"driverType": "cpu"})


# --------------------------------------------------------------- assignment
def _nodes(**products: str) -> dict[str, dict[str, str]]:
    return {name: {PRODUCT: product} for name, product in products.items()}


def test_specific_resource_wins_and_default_takes_the_rest() -> None:
    nodes = _nodes(a="H100", b="A100", c="T4")
    result = assign_owners(
        nodes,
        [
            DriverResource("default", default=True),
            DriverResource("h100", node_selector={PRODUCT: "H100"}),
        ],
    )
    assert result.changes == {"a": "h100", "b": "default", "c": "default"}
    assert result.problems == {}


def test_conflicting_resources_change_no_label_and_are_reported() -> None:
    nodes = {
        "a": {PRODUCT: "H100", OWNER_LABEL: "h100"},
        "b": {PRODUCT: "A100", OWNER_LABEL: "default"},
    }
    result = assign_owners(
        nodes,
        [
            DriverResource("default", default=True),
            DriverResource("h100", node_selector={PRODUCT: "H100"}),
            DriverResource("all", node_selector={}),
        ],
    )
    assert result.changes == {}
    assert {n: p.reason for n, p in result.problems.items()} == {
        "h100": REASON_CONFLICT,
        "all": REASON_CONFLICT,
    }


def test_two_defaults_fail_and_keep_labels() -> None:
    nodes = {"a": {OWNER_LABEL: "one"}, "b": {}}
    result = assign_owners(
        nodes, [DriverResource("one", default=True), DriverResource("two", default=True)]
    )
    assert result.changes == {}
    assert {p.reason for p in result.problems.values()} == {REASON_FAILED}


def test_deleted_resource_takes_part_in_nothing() -> None:
    nodes = {"a": {PRODUCT: "H100", OWNER_LABEL: "h100"}}
    result = assign_owners(
        nodes,
        [
            DriverResource("default", default=True),
            DriverResource("h100", node_selector={PRODUCT: "H100"}, deleting=True),
        ],
    )
    # Never from one owner straight to another: the old driver lets go first.
    assert result.changes == {"a": None}
    # Nothing of the old resource's is left to hand over through an upgrade.
    deleting = [DriverResource("default", default=True)]
    assert assign_owners(nodes, deleting, managed={"default"}).changes == {"a": None}
    nodes = {"a": {PRODUCT: "H100"}}
    assert assign_owners(nodes, [DriverResource("default", default=True)]).changes == {
        "a": "default"
    }


def test_a_move_to_an_upgrading_resource_waits_for_the_upgrade_machine() -> None:
    resources = [
        DriverResource("default", default=True),
        DriverResource("h100", node_selector={PRODUCT: "H100"}),
    ]
    owned = {"a": {PRODUCT: "H100", OWNER_LABEL: "default"}}
    moving = assign_owners(owned, resources, managed={"h100"})
    assert moving.changes == {}
    assert moving.moves == {"a": "h100"}
    assert moving.owners == {"a": "default"}
    assert moving.targets == {"a": "h100"}  # h100 is not ready while it waits for "a"
    # A node in the middle of its current owner's upgrade finishes that first.
    assert assign_owners(owned, resources, managed={"h100"}, busy={"a"}).moves == {}
    # The upgrade machine removed the owner label; the old pod is still there.
    handing = {"a": {PRODUCT: "H100", NEXT_OWNER_LABEL: "h100"}}
    held = assign_owners(handing, resources, held={"a"}, managed={"h100"})
    assert (held.changes, held.moves) == ({}, {})
    # Gone: the new owner takes the node, the record of the move goes with it.
    done = assign_owners(handing, resources, managed={"h100"})
    assert (done.changes, done.moves) == ({"a": "h100"}, {"a": None})
    # The resource goes away before the hand-over: the move is called off.
    recorded = {"a": {PRODUCT: "H100", OWNER_LABEL: "default", NEXT_OWNER_LABEL: "h100"}}
    back = assign_owners(recorded, resources[:1], managed={"h100"})
    assert (back.changes, back.moves) == ({}, {"a": None})


def test_held_node_gets_no_owner_until_released() -> None:
    nodes = _nodes(a="H100", b="T4")
    resources = [DriverResource("default", default=True)]
    assert assign_owners(nodes, resources, held={"a"}).changes == {"b": "default"}
    assert assign_owners(nodes, resources).changes == {"a": "default", "b": "default"}


_MOVING = [
    DriverResource("default", default=True),
    DriverResource("h100", node_selector={PRODUCT: "H100"}),  # upgradePolicy: 25%
]


def _owned(owner: str | None, *names: str) -> dict[str, dict[str, str]]:
    return {n: {PRODUCT: "H100", **({OWNER_LABEL: owner} if owner else {})} for n in names}


def test_moves_to_a_resource_without_auto_upgrade_stay_within_its_max_unavailable() -> None:
    """Eight nodes move to a resource that does not upgrade automatically: 25% of its
    eight nodes, two, are handed over at a time; the next two only once those run the
    new owner's driver."""
    nodes = _owned("default", *"abcdefgh")
    first = assign_owners(nodes, _MOVING)
    assert first.changes == {"a": None, "b": None}, first.changes
    assert first.owners == {n: "default" for n in "cdefgh"}
    assert first.targets == {n: "h100" for n in "abcdefgh"}
    # The old driver pods still run: nothing more moves.
    nodes.update(_owned(None, "a", "b"))
    assert assign_owners(nodes, _MOVING, held={"a", "b"}).changes == {}
    # They left: the new owner takes both; the two being given their new driver count.
    taking = assign_owners(nodes, _MOVING)
    assert taking.changes == {"a": "h100", "b": "h100"}, taking.changes
    # Running the new owner's driver: the next two.
    nodes.update(_owned("h100", "a", "b"))
    assert assign_owners(nodes, _MOVING).changes == {"c": None, "d": None}
    # Restart-safe: a pass reads it all from the labels and the pods on the nodes.
    nodes.update(_owned(None, "c", "d"))
    again = assign_owners(nodes, _MOVING, held={"c"})
    assert again.changes == {"d": "h100"}, again.changes


def test_a_move_waits_while_the_new_owners_driver_is_not_ready() -> None:
    nodes = {**_owned("h100", "a", "b"), **_owned("default", *"cdefgh")}
    # "a" carries the new owner's label, its driver pod is not Ready yet: one slot left.
    assert assign_owners(nodes, _MOVING, unready={"a"}).changes == {"c": None}
    assert assign_owners(nodes, _MOVING, unready={"a", "b"}).changes == {}
    # A node of another owner without a Ready driver takes none of the new owner's slots.
    assert assign_owners(nodes, _MOVING, unready={"c"}).changes == {"c": None, "d": None}


def test_the_hand_over_budget_is_the_new_owners_max_unavailable_at_least_one() -> None:
    nodes = _owned("default", *"abcdefgh")
    for budget, moved in ((3, "abc"), ("50%", "abcd"), (0, "a"), ("0%", "a"), ("100%", nodes)):
        h100 = DriverResource("h100", node_selector={PRODUCT: "H100"}, max_unavailable=budget)
        changes = assign_owners(nodes, [_MOVING[0], h100]).changes
        assert changes == dict.fromkeys(moved), (budget, changes)
    # The budget is of the nodes the resource is to own, its own ones counted too.
    more = {**nodes, **_owned("h100", *"ijklmnop")}
    assert assign_owners(more, _MOVING).changes == dict.fromkeys("abcd")


def test_what_is_not_a_hand_over_is_not_held_back() -> None:
    # Nodes with no owner have no driver to hand over: all get one at once...
    fresh = _owned(None, *"abcdefgh")
    assert assign_owners(fresh, _MOVING).changes == dict.fromkeys("abcdefgh", "h100")
    # ...even when the budget is spent, while they count (they run no driver yet).
    busy = {**fresh, **_owned("default", "x", "y")}
    result = assign_owners(busy, _MOVING)
    assert result.changes == dict.fromkeys("abcdefgh", "h100"), result.changes
    # A deleted resource's nodes have no driver to keep: they all let go at once.
    going = [*_MOVING, DriverResource("old", node_selector={"x": "y"}, deleting=True)]
    assert assign_owners(_owned("old", *"abcdefgh"), going).changes == dict.fromkeys("abcdefgh")
    # A move to an auto-upgrading resource goes by the upgrade machine's budget.
    managed = assign_owners(_owned("default", *"abcdefgh"), _MOVING, managed={"h100"})
    assert managed.moves == dict.fromkeys("abcdefgh", "h100")
    # Other resources' budgets are their own.
    two = [
        *_MOVING,
        DriverResource("t4", node_selector={PRODUCT: "T4"}),
    ]
    mixed = {**_owned("default", "a", "b", "c"), "t": {PRODUCT: "T4", OWNER_LABEL: "default"}}
    assert assign_owners(mixed, two).changes == {"a": None, "t": None}


def test_a_node_over_the_budget_keeps_its_move_record() -> None:
    """A move recorded while the new owner upgraded automatically, then autoUpgrade
    off: the nodes over the budget keep their labels as they are until their turn."""
    nodes = {
        n: {PRODUCT: "H100", OWNER_LABEL: "default", NEXT_OWNER_LABEL: "h100"} for n in "abcdefgh"
    }
    result = assign_owners(nodes, _MOVING)
    assert result.changes == {"a": None, "b": None}
    assert result.moves == {"a": None, "b": None}


def test_no_resource_removes_labels() -> None:
    assert assign_owners({"a": {OWNER_LABEL: "gone"}}, []).changes == {"a": None}


_products = st.sampled_from(["H100", "A100", "T4"])
_selectors = st.one_of(st.just({}), _products.map(lambda p: {PRODUCT: p}))


@given(
    nodes=st.dictionaries(
        st.sampled_from("abcdef"),
        st.fixed_dictionaries(
            {PRODUCT: _products},
            optional={OWNER_LABEL: st.sampled_from(["default", "r0", "r1", "r2"])},
        ),
    ),
    selectors=st.lists(_selectors, max_size=3),
    has_default=st.booleans(),
    managed=st.sets(st.sampled_from(["default", "r0", "r1", "r2"])),
    held=st.sets(st.sampled_from("abcdef")),
    unready=st.sets(st.sampled_from("abcdef")),
)
def test_assignment_properties(
    nodes: dict[str, dict[str, str]],
    selectors: list[dict[str, str]],
    has_default: bool,
    managed: set[str],
    held: set[str],
    unready: set[str],
) -> None:
    resources = [DriverResource(f"r{i}", node_selector=s) for i, s in enumerate(selectors)]
    if has_default:
        resources.append(DriverResource("default", default=True))
    result = assign_owners(nodes, resources, held, managed, unready=unready)
    live = {r.name for r in resources}
    conflicting = {n for n, p in result.problems.items() if p.reason == REASON_CONFLICT}
    for node, labels in nodes.items():
        current = labels.get(OWNER_LABEL)
        matching = [r.name for r in resources if not r.default and r.selects(labels)]
        if set(matching) & conflicting:
            # a node any conflicting resource selects never changes its owner
            assert node not in result.changes
            continue
        intended = matching[0] if matching else ("default" if has_default else None)
        assert len(matching) <= 1
        # changes say exactly how labels get from now to the owners
        after = result.changes.get(node, current)
        assert after == result.owners.get(node)
        # never from one owner straight to another, never onto a node still held
        assert after in (current, None) or current is None
        assert after in (current, None) or node not in held
        if after is None and intended is not None and not (current is None and node in held):
            assert current not in (None, intended)
            assert intended not in managed or current not in live  # nothing to hand over
        gradual = current in live and intended in managed
        if current is not None and intended not in (None, current) and gradual:
            assert after == current
            assert result.moves.get(node, labels.get(NEXT_OWNER_LABEL)) == intended
        elif after == intended and current is None and node not in held:
            assert result.moves.get(node, labels.get(NEXT_OWNER_LABEL)) is None
    # Hand-overs to a resource that does not upgrade automatically: within its budget
    # (25% of the nodes it is to own, at least one), and never none while it has room.
    for target in set(result.targets.values()) - managed:
        fleet = [n for n, t in result.targets.items() if t == target]
        owner = {n: nodes[n].get(OWNER_LABEL) for n in fleet}
        candidates = [n for n in fleet if owner[n] in live and owner[n] != target]
        started = [n for n in candidates if result.changes.get(n, owner[n]) is None]
        down = sum(o is None or (o == target and n in unready) for n, o in owner.items())
        limit = max(1, -(-len(fleet) // 4))
        assert not started or down + len(started) <= limit
        assert started or not candidates or down >= limit
    assert not result.deferred & (set(result.changes) | set(result.moves))  # kept as they are


# ---------------------------------------------------------------- rendering
def _node(
    name: str, owner: str, os_id: str = "ubuntu", version: str = "22.04", **extra: str
) -> Any:
    labels = {
        "nvidia.com/gpu.present": "true",
        OWNER_LABEL: owner,
        OS_ID: os_id,
        OS_VERSION: version,
        KERNEL: "5.15.0-124-generic",
        **extra,
    }
    return {"metadata": {"name": name, "labels": labels}, "spec": {}, "status": {}}


CTX = RenderContext(namespace="gpu-operator", operator_image="gpuop:1")


def test_one_daemonset_per_os_selecting_owner_and_os() -> None:
    spec = crd.NVIDIADriverSpec.model_validate({"version": "580.95.05"})
    nodes = [
        _node("a", "default"),
        _node("b", "default", version="24.04"),
        _node("c", "default"),
        _node("d", "other"),
    ]
    objs = render("default", "uid-1", spec, nodes, crd.ClusterPolicySpec(), CTX)
    assert [o["metadata"]["name"] for o in objs] == [
        app_name("gpu", "ubuntu22.04", "uid-1"),
        app_name("gpu", "ubuntu24.04", "uid-1"),
    ]
    first = objs[0]
    pod = first["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {
        "nvidia.com/gpu.deploy.driver": "true",
        "nvidia.com/gpu.present": "true",
        OWNER_LABEL: "default",
        OS_ID: "ubuntu",
        OS_VERSION: "22.04",
    }
    assert first["spec"]["updateStrategy"] == {"type": "OnDelete"}
    assert pod["containers"][0]["image"] == "nvcr.io/nvidia/driver:580.95.05-ubuntu22.04"
    assert first["spec"]["template"]["metadata"]["labels"]["nvidia.com/node.os-version"] == (
        "ubuntu22.04"
    )
    assert first["metadata"]["labels"]["app.kubernetes.io/component"] == "nvidia-driver"


def test_app_name_is_upstreams_shape() -> None:
    name = app_name("gpu", "ubuntu22.04", "0b5c1f6e-1111-2222-3333-444455556666")
    assert name.startswith("nvidia-gpu-driver-ubuntu22.04-")
    assert set(name.rsplit("-", 1)[1]) <= set("bcdfghjklmnpqrstvwxz2456789")
    assert len(app_name("vgpu-host-manager", "x" * 80, "u")) == 63


def test_precompiled_pools_per_kernel_with_kernel_tag() -> None:
    spec = crd.NVIDIADriverSpec.model_validate({"usePrecompiled": True, "version": "580"})
    nodes = [_node("a", "p"), _node("b", "p", **{KERNEL: "6.8.0-1015-aws"})]
    objs = render("p", "u", spec, nodes, crd.ClusterPolicySpec(), CTX)
    images = sorted(o["spec"]["template"]["spec"]["containers"][0]["image"] for o in objs)
    assert images == [
        "nvcr.io/nvidia/driver:580-5.15.0-124-generic-ubuntu22.04",
        "nvcr.io/nvidia/driver:580-6.8.0-1015-aws-ubuntu22.04",
    ]
    selectors = [o["spec"]["template"]["spec"]["nodeSelector"][KERNEL] for o in objs]
    assert sorted(selectors) == ["5.15.0-124-generic", "6.8.0-1015-aws"]


def test_precompiled_refuses_digests() -> None:
    spec = crd.NVIDIADriverSpec.model_validate(
        {"usePrecompiled": True, "image": "nvcr.io/nvidia/driver", "version": "sha256:" + "0" * 64}
    )
    with pytest.raises(NVIDIADriverRenderError):
        render("p", "u", spec, [_node("a", "p")], crd.ClusterPolicySpec(), CTX)


def test_nodes_without_os_labels_form_no_pool() -> None:
    node = _node("a", "x")
    del node["metadata"]["labels"][OS_ID]
    assert node_pools("x", crd.NVIDIADriverSpec(), [node]) == []


def test_resource_settings_reach_the_pod() -> None:
    spec = crd.NVIDIADriverSpec.model_validate(
        {
            "labels": {"team": "ml"},
            "tolerations": [{"key": "dedicated", "operator": "Exists"}],
            "priorityClassName": "high",
            "hostNetwork": True,
            "nodeSelector": {PRODUCT: "H100"},
        }
    )
    (ds,) = render(
        "h100", "u", spec, [_node("a", "h100", **{PRODUCT: "H100"})], crd.ClusterPolicySpec(), CTX
    )
    pod = ds["spec"]["template"]
    assert pod["metadata"]["labels"]["team"] == "ml"
    assert pod["spec"]["priorityClassName"] == "high"
    assert pod["spec"]["hostNetwork"] is True
    assert {"key": "dedicated", "operator": "Exists"} in pod["spec"]["tolerations"]
    # The owner label, not the resource's nodeSelector: a node whose labels stop
    # matching keeps its driver until it is handed over.
    assert pod["spec"]["nodeSelector"][OWNER_LABEL] == "h100"
    assert PRODUCT not in pod["spec"]["nodeSelector"]


def test_sample_manifest_parses() -> None:
    raw = yaml.safe_load(
        """
apiVersion: nvidia.com/v1alpha1
kind: NVIDIADriver
metadata: {name: demo}
spec:
  driverType: gpu
  image: driver
  repository: nvcr.io/nvidia
  version: "580.95.05"
  nodeSelector: {nvidia.com/gpu.product: H100}
  upgradePolicy: {autoUpgrade: true, maxParallelUpgrades: 1}
"""
    )
    model = crd.parse_nvidiadriver(raw)
    assert model.name == "demo"
    assert model.spec.upgrade_policy_with_defaults().max_parallel_upgrades == 1


# ------------------------------------------------------------ controller helpers
def test_policy_driver_names_and_resource_ownership() -> None:
    from gpuop.operator.controller.views.objects import is_policy_driver, nvd_owner

    assert is_policy_driver("nvidia-driver-daemonset")
    assert is_policy_driver("nvidia-driver-daemonset-5.15.0-124-generic-ubuntu22.04")
    assert not is_policy_driver("nvidia-gpu-driver-ubuntu22.04-5799489887")
    owned = {"metadata": {"ownerReferences": [{"kind": "NVIDIADriver", "name": "h100"}]}}
    assert nvd_owner(owned) is None  # a reference that is not the controller
    owned["metadata"]["ownerReferences"][0]["controller"] = True
    assert nvd_owner(owned) == "h100"
    assert nvd_owner({"metadata": {}}) is None


def test_owner_label_changes_wake_the_cluster_and_budget_passes() -> None:
    from gpuop.operator.controller.views.routes import budget_facts as _budget_facts
    from gpuop.operator.controller.views.routes import gpu_facts as _gpu_facts

    def node(**extra: str) -> dict[str, Any]:
        labels = {"nvidia.com/gpu.present": "true", **extra}
        return {"metadata": {"labels": labels}, "spec": {}, "status": {}}

    plain, owned = node(), node(**{OWNER_LABEL: "h100"})
    assert _gpu_facts(plain) != _gpu_facts(owned)
    assert _budget_facts(plain) != _budget_facts(owned)
    upgrading = node(
        **{OWNER_LABEL: "h100", "nvidia.com/gpu-driver-upgrade-state": "drain-required"}
    )
    assert _gpu_facts(owned) != _gpu_facts(upgrading)
