"""Containers that run the operator image pull it as the administrator configured it
(issue 48): the operator's own pull policy and secrets (`RenderContext`, from the
chart's `operator.imagePullPolicy` / `operator.imagePullSecrets`), and the keys of the
upstream section whose image ours replaces: `validator.*` for the validator, the sandbox
validator and every operand's `*-validation` init container, `nodeStatusExporter.*` for
the node status exporter, `draDriver.*` for a GPUCluster's validation containers.

Every conformance scenario is rendered as `tests.conformance._diff` renders it, with
the operator's pull settings added to each RenderContext it builds, and the policy's
sections given pull secrets in a second pass; `everything()` adds the components no
scenario turns on."""

from __future__ import annotations

import functools
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import components as c
import crd
from components.context import RenderContext
from tests.conformance import _diff
from tests.unit.test_components_render import ctx, everything

OPERATOR_SECRET = "my-registry"
VALIDATOR_SECRET = "validator-registry"
EXPORTER_SECRET = "exporter-registry"
DRA_SECRET = "dra-registry"
OPERATOR_PULLS: dict[str, Any] = {
    "operator_image_pull_policy": "Always",
    "operator_image_pull_secrets": (OPERATOR_SECRET,),
}
EXPORTER_DAEMONSET = "nvidia-node-status-exporter"

SCENARIOS = _diff.scenarios()
Spec = dict[str, Any]


def _pods(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for obj in objects:
        pod = ((obj.get("spec") or {}).get("template") or {}).get("spec")
        if pod is not None:
            yield f"{obj['kind']}/{obj['metadata']['name']}", pod


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod.get("initContainers", ()), *pod["containers"]]


def _ours(pod: dict[str, Any], image: str) -> list[dict[str, Any]]:
    return [ctr for ctr in _containers(pod) if ctr["image"] == image]


def _secrets(pod: dict[str, Any]) -> list[str]:
    return [s["name"] for s in pod.get("imagePullSecrets", ())]


def _render(folder: Path, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The scenario's objects, every RenderContext carrying the operator's pull keys."""
    with monkeypatch.context() as patch:
        patch.setattr(c, "RenderContext", functools.partial(RenderContext, **OPERATOR_PULLS))
        return _diff.ours_for(folder)[0]


def _edited(folder: Path, tmp_path: Path, edit: Callable[[Spec], None]) -> Path:
    """A copy of the scenario whose policy `edit` changed."""
    copy = tmp_path / folder.name
    shutil.copytree(folder, copy)
    document = yaml.safe_load((copy / "policy.yaml").read_text())
    edit(document["spec"])
    (copy / "policy.yaml").write_text(yaml.safe_dump(document))
    return copy


def _section_secrets(spec: Spec) -> None:
    """Pull secrets in each section whose image ours replaces (the operator's secret
    among them once, which must not be listed twice)."""
    if "draDriver" in spec or "validator" not in spec:  # a GPUCluster
        spec.setdefault("draDriver", {})["imagePullSecrets"] = [DRA_SECRET, OPERATOR_SECRET]
        return
    spec["validator"]["imagePullSecrets"] = [VALIDATOR_SECRET, OPERATOR_SECRET]
    exporter = spec.setdefault("nodeStatusExporter", {})
    exporter.update(enabled=True, imagePullSecrets=[EXPORTER_SECRET])


def _expected_section_secret(name: str, gpucluster: bool) -> str:
    if gpucluster:
        return DRA_SECRET
    return EXPORTER_SECRET if name == f"DaemonSet/{EXPORTER_DAEMONSET}" else VALIDATOR_SECRET


@pytest.mark.parametrize("folder", SCENARIOS, ids=[f.name for f in SCENARIOS])
def test_operator_image_containers_get_the_operators_pull_keys(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = dict(_pods(_diff.ours_for(folder)[0]))
    pulled = dict(_pods(_render(folder, monkeypatch)))
    assert plain.keys() == pulled.keys()
    runs_ours = [name for name, pod in pulled.items() if _ours(pod, _diff.OPERATOR_IMAGE)]
    assert runs_ours, "the scenario runs no container of the operator image"
    for name, pod in pulled.items():
        before = plain[name]
        for ctr, old in zip(_containers(pod), _containers(before), strict=True):
            if ctr["image"] == _diff.OPERATOR_IMAGE:
                assert ctr.get("imagePullPolicy") == "Always", (name, ctr["name"])
            else:  # the operands' own images keep their sections' keys
                assert ctr.get("imagePullPolicy") == old.get("imagePullPolicy"), (name, ctr["name"])
        if name in runs_ours:
            # the policy's secrets first, in their order, then the operator's
            assert _secrets(pod) == [*_secrets(before), OPERATOR_SECRET], name
        else:
            assert _secrets(pod) == _secrets(before), name


@pytest.mark.parametrize("folder", SCENARIOS, ids=[f.name for f in SCENARIOS])
def test_replaced_sections_pull_secrets_join_the_operators(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    edited = _edited(folder, tmp_path, _section_secrets)
    gpucluster = _diff.is_gpucluster(edited)
    seen = 0
    for name, pod in _pods(_render(edited, monkeypatch)):
        ours = _ours(pod, _diff.OPERATOR_IMAGE)
        if not ours:
            continue
        seen += 1
        assert {ctr.get("imagePullPolicy") for ctr in ours} == {"Always"}, name
        names = _secrets(pod)
        assert len(names) == len(set(names)), (name, names)
        assert _expected_section_secret(name, gpucluster) in names, (name, names)
        assert OPERATOR_SECRET in names, (name, names)
    assert seen


@pytest.mark.parametrize("mode", ["kubevirt", "kata"])
def test_every_component_running_the_operator_image_gets_its_keys(mode: str) -> None:
    """The components no scenario turns on (all of them, in both sandbox modes)."""
    spec = everything(mode).model_copy(deep=True)
    spec.validator.image_pull_secrets = [VALIDATOR_SECRET]
    spec.node_status_exporter.enabled = True
    spec.node_status_exporter.image_pull_secrets = [EXPORTER_SECRET]
    context = ctx(**OPERATOR_PULLS)
    objects = [o for objs in c.desired_objects(spec, context).values() for o in objs]
    seen = set()
    for name, pod in _pods(objects):
        ours = _ours(pod, context.operator_image)
        if not ours:
            continue
        seen.add(name)
        assert {ctr.get("imagePullPolicy") for ctr in ours} == {"Always"}, name
        names = _secrets(pod)
        assert len(names) == len(set(names)), (name, names)
        assert _expected_section_secret(name, gpucluster=False) in names, (name, names)
        assert names[-1] == OPERATOR_SECRET, (name, names)
    assert f"DaemonSet/{EXPORTER_DAEMONSET}" in seen
    assert "DaemonSet/nvidia-operator-validator" in seen
    assert "DaemonSet/nvidia-sandbox-validator" in seen


def _policy(**sections: Any) -> crd.ClusterPolicySpec:
    return crd.ClusterPolicySpec.model_validate(sections)


def _operator_image_policies(
    spec: crd.ClusterPolicySpec, context: RenderContext
) -> dict[str, set[str]]:
    objects = [o for objs in c.desired_objects(spec, context).values() for o in objs]
    return {
        name: {ctr["imagePullPolicy"] for ctr in _ours(pod, context.operator_image)}
        for name, pod in _pods(objects)
        if _ours(pod, context.operator_image)
    }


def test_without_the_operators_policy_the_replaced_sections_policy_applies() -> None:
    """As upstream's: the validator's containers (its own and the operands' validation
    init containers) follow `validator.imagePullPolicy`, the exporter its own."""
    spec = _policy(
        validator={"imagePullPolicy": "Never"},
        nodeStatusExporter={"enabled": True, "imagePullPolicy": "Always"},
    )
    policies = _operator_image_policies(spec, ctx())
    assert policies.pop(f"DaemonSet/{EXPORTER_DAEMONSET}") == {"Always"}
    assert "DaemonSet/nvidia-device-plugin-daemonset" in policies
    assert all(found == {"Never"} for found in policies.values()), policies


@pytest.mark.parametrize(
    ("operator", "validator", "expected"),
    [
        ("Always", "Never", "Always"),
        ("IfNotPresent", "Always", "Always"),
        ("Never", "IfNotPresent", "IfNotPresent"),
        ("Never", "Never", "Never"),
    ],
)
def test_the_more_eager_of_two_policies_wins(operator: str, validator: str, expected: str) -> None:
    """Neither administrator's `Always` is lost (a moving tag stays current)."""
    spec = _policy(validator={"imagePullPolicy": validator})
    policies = _operator_image_policies(spec, ctx(operator_image_pull_policy=operator))
    assert policies
    assert all(found == {expected} for found in policies.values()), policies
