"""The GPUCluster CRD: generated from the models, checked in current, and accepting what
upstream v26.7's accepts.

Upstream's schema is a copy of NVIDIA/gpu-operator's
deployments/gpu-operator/crds/nvidia.com_gpuclusters.yaml at v26.7 (tests/data/upstream).
Every one of its property paths must exist in ours with the same type, no narrower enum
and its default; each default ours adds is listed with why it changes nothing upstream
would do, and an entry that matches nothing fails, so the list stays honest.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import pytest
import yaml

import crd
from crd._gpucluster import gc_openapi_schema
from gpuop.cli import main
from tests.unit.test_crd_schema import walk

ROOT = Path(__file__).resolve().parents[2]
UPSTREAM_CRD = yaml.safe_load(
    (ROOT / "tests" / "data" / "upstream" / "nvidia.com_gpuclusters.yaml").read_text()
)
UPSTREAM = dict(walk(UPSTREAM_CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]))
OURS = dict(walk(gc_openapi_schema()))
SAMPLE = ROOT / "tests" / "conformance" / "upstream" / "gpucluster-default" / "policy.yaml"

ADDED_DEFAULTS: dict[str, str] = {
    ".spec.dcgm.enabled": "false: upstream's controller treats an unset switch as disabled",
    ".spec.dcgmExporter.enabled": "true: upstream's controller treats unset as enabled",
    ".spec.dcgm.imagePullPolicy": "IfNotPresent, the API server's default for a tagged image",
    ".spec.dcgmExporter.imagePullPolicy": "IfNotPresent, as for the DCGM image",
    ".spec.dcgm.hostPort": "5555, deprecated and unread (the engine binds no host port)",
    ".spec.dcgmExporter.serviceMonitor.enabled": "unset creates no ServiceMonitor upstream",
    ".spec.dcgmExporter.serviceMonitor.honorLabels": "unset is false in the ServiceMonitor",
}

OTHER_DEFAULTS: dict[str, str] = {
    ".spec.dcgmExporter.serviceMonitor.relabelings[].action": (
        "no schema default: relabel rules stay as written, and the Prometheus Operator"
        " treats an omitted action as replace"
    ),
}
"""Upstream defaults ours does not fill, with why that changes nothing."""


def _crd_output() -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["crd", "gpuclusters"]) == 0
    return out.getvalue()


@pytest.mark.parametrize("path", [crd.GC_CRD_FILE, *crd.GC_CHART_CRD_FILES])
def test_checked_in_crd_is_gpuop_crd_output(path: str) -> None:
    assert (ROOT / path).read_text() == _crd_output(), (
        f"{path} out of date: regenerate with `gpuop crd gpuclusters > {path}`"
    )


def test_identity_and_singleton_rule_as_upstream() -> None:
    ours, theirs = crd.gc_crd_manifest()["spec"], UPSTREAM_CRD["spec"]
    for key in ("group", "names", "scope"):
        assert ours[key] == theirs[key], key
    (version,) = ours["versions"]
    (upstream_version,) = theirs["versions"]
    assert version["name"] == upstream_version["name"] == "v1alpha1"
    assert version["additionalPrinterColumns"] == upstream_version["additionalPrinterColumns"]
    assert version["subresources"] == upstream_version["subresources"]
    rules = lambda node: [v["rule"] for v in node.get("x-kubernetes-validations", [])]  # noqa: E731
    assert rules(OURS[""]) == rules(UPSTREAM[""]) == ["self.metadata.name == 'gpu-cluster'"]


def _kind(node: dict[str, Any]) -> str | None:
    return "int-or-string" if node.get("x-kubernetes-int-or-string") else node.get("type")


def _differences() -> tuple[list[str], set[str]]:
    problems: list[str] = []
    used: set[str] = set()
    for path, theirs in UPSTREAM.items():
        ours = OURS.get(path)
        if ours is None:
            problems.append(f"{path}: missing")
            continue
        if _kind(ours) != _kind(theirs) and not (
            _kind(theirs) == "string" and _kind(ours) == "int-or-string"
        ):
            problems.append(f"{path}: type {_kind(ours)} != {_kind(theirs)}")
        if "enum" in ours and not set(theirs.get("enum", ours["enum"])) <= set(ours["enum"]):
            problems.append(f"{path}: enum {ours['enum']} refuses part of {theirs['enum']}")
        for key in ("pattern", "minimum", "maximum"):
            if key in ours and ours[key] != theirs.get(key) and path.startswith(".spec.draDriver"):
                problems.append(f"{path}: {key} {ours[key]!r} != {theirs.get(key)!r}")
        if "default" in theirs and ours.get("default") != theirs["default"]:
            if path in OTHER_DEFAULTS:
                used.add(path)
                continue
            problems.append(f"{path}: default {ours.get('default')!r} != {theirs['default']!r}")
        elif "default" not in theirs and ours.get("default", {}) != {}:
            if path in ADDED_DEFAULTS:
                used.add(path)
            else:
                problems.append(f"{path}: default {ours['default']!r} where upstream has none")
    return problems, used


def test_every_upstream_field_is_accepted_alike() -> None:
    problems, _ = _differences()
    assert problems == []


def test_every_listed_default_is_still_added() -> None:
    _, used = _differences()
    assert set(ADDED_DEFAULTS) - used == set()
    assert set(OTHER_DEFAULTS) - used == set()


def test_ours_has_no_field_upstream_lacks_but_env_value_from() -> None:
    """The only widening: env[].valueFrom (core/v1 EnvVarSource), as in ClusterPolicy."""
    extra = sorted(p for p in OURS if p not in UPSTREAM)
    assert extra
    assert all(p.endswith("env[].valueFrom") for p in extra), extra


def test_upstream_sample_parses_as_written() -> None:
    document = yaml.safe_load(SAMPLE.read_text())
    cluster = crd.parse_gpucluster(document)
    dumped = cluster.model_dump(mode="json", by_alias=True, exclude_unset=True)
    assert dumped["spec"] == document["spec"]
    assert cluster.spec.exporter_enabled
    assert not cluster.spec.dcgm_enabled


def test_dra_driver_is_required_and_names_the_field() -> None:
    with pytest.raises(Exception, match="draDriver"):
        crd.parse_gpucluster({"metadata": {"name": "gpu-cluster"}, "spec": {}})
