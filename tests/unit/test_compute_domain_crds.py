"""NVIDIA's compute-domain CRDs (ComputeDomain, ComputeDomainClique) ship as data files,
the same bytes in crd/ (what `gpuop crds apply` installs), deploy/crds/ and the chart's
crds/, each saying where it comes from, and are the kinds the compute-domain controller
(rendered for a GPUCluster) is allowed to watch."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import crd
from components import RenderContext
from components.dra import render

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("path", crd.COMPUTE_DOMAIN_CHART_CRD_FILES)
def test_every_copy_is_the_packaged_file(path: str) -> None:
    packaged = ROOT / "crd" / Path(path).name
    assert (ROOT / path).read_bytes() == packaged.read_bytes(), f"copy {packaged} to {path}"


@pytest.mark.parametrize("path", crd.COMPUTE_DOMAIN_CRD_FILES)
def test_each_file_names_its_source_and_holds_one_crd(path: str) -> None:
    text = (ROOT / path).read_text()
    assert "NVIDIA/gpu-operator v26.7.0" in text
    assert f"deployments/gpu-operator/crds/{Path(path).name}" in text
    assert "NVIDIA/k8s-dra-driver-gpu" in text
    (document,) = [d for d in yaml.safe_load_all(text) if d]
    assert document["kind"] == "CustomResourceDefinition"


def test_the_manifests_are_the_two_compute_domain_kinds() -> None:
    manifests = crd.compute_domain_crd_manifests()
    assert [m["metadata"]["name"] for m in manifests] == list(crd.COMPUTE_DOMAIN_CRD_NAMES)
    assert [m["spec"]["names"]["kind"] for m in manifests] == [
        "ComputeDomain",
        "ComputeDomainClique",
    ]
    for manifest in manifests:
        assert manifest["spec"]["group"] == crd.CD_GROUP
        assert manifest["spec"]["scope"] == "Namespaced"
        assert [v["name"] for v in manifest["spec"]["versions"] if v["served"]] == ["v1beta1"]


def test_the_compute_domain_controller_may_use_what_the_crds_define() -> None:
    """The controller's ClusterRole (rendered for a GPUCluster) names the resources these
    CRDs define: without the CRDs those rules grant nothing."""
    spec = crd.parse_gpucluster({"spec": {"draDriver": {}}}).spec
    ctx = RenderContext(namespace="gpu-operator", operator_image="gpuop:test")
    rules = [
        rule
        for objs in render(spec, ctx).values()
        for obj in objs
        if obj["kind"] in ("ClusterRole", "Role")
        for rule in obj.get("rules") or ()
        if crd.CD_GROUP in rule.get("apiGroups", ())
    ]
    granted = {r for rule in rules for r in rule["resources"]}
    defined = {m["spec"]["names"]["plural"] for m in crd.compute_domain_crd_manifests()}
    assert defined <= granted
