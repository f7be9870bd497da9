"""Every leaf field of upstream v26.7's three CRDs acts, is reported, or is listed here.

For each leaf of upstream's ClusterPolicy, NVIDIADriver and GPUCluster schemas
(tests/data/upstream, copies of NVIDIA/gpu-operator v26.7.0's
deployments/gpu-operator/crds/), the sweep sets the field to non-default values on a few
base policies and watches three things:

- the render: every object our passes apply, with the GPU nodes' labels and annotations
  at rest (`tests.conformance._diff.ours`, the same code path the conformance test
  compares with upstream's recordings), or a GPUCluster's / NVIDIADriver's objects;
- the controller's decision inputs that are not objects: the upgrade machine's view of
  the upgrade policy (`policy_view`, `upgrade_policy`), the Pod Security switch
  (`gpuop.operator.controller.passes.cluster` hands `psa.enabled` to `_psa`);
- the UnsupportedFields condition (`crd.unsupported_fields` and its siblings).

A field that changes the condition is *reported*; one that changes the render or a
decision *acts*. A field that changes none must be listed: in `IGNORED_AS_UPSTREAM`
(upstream's operator does not read it either: each entry names upstream's file) or in
`REPLACED` (upstream's image for it is replaced by ours). Anything else is *silent*, and
fails the sweep, as does a new upstream field nobody classified; a listed field that
acts has its entry go stale, which fails too.

A Kubernetes-typed field (`resources`, `podSecurityContext`, `nodeAffinity`), an array
and a map are one leaf each: they are passed through whole.
"""

from __future__ import annotations

import copy
import json
import re
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml

import components as c
import crd
from components.dra import gpucluster_label_changes
from components.dra import render as render_gpucluster
from gpuop.operator.controller.views.driver_owners import upgrade_policy
from gpuop.operator.controller.views.upgrade_inputs import policy_view
from tests.conformance._diff import NAMESPACE, OPERATOR_IMAGE, ours, simulated_nodes

DATA = Path(__file__).resolve().parent.parent / "data" / "upstream"
SCENARIOS = Path(__file__).resolve().parent.parent / "conformance" / "upstream"

ONE_LEAF = frozenset({"resources", "podSecurityContext", "nodeAffinity"})
"""Kubernetes-typed objects, passed through whole: one leaf each."""


def leaves(node: Mapping[str, Any], path: str = "spec") -> Iterator[tuple[str, dict[str, Any]]]:
    """The leaf fields under `node` (upstream's schema of `spec`), with their schema."""
    props = node.get("properties")
    if node.get("type") == "object" and props and path.rsplit(".", 1)[-1] not in ONE_LEAF:
        for name, child in props.items():
            yield from leaves(child, f"{path}.{name}")
        return
    yield path, dict(node)


def upstream_leaves(crd_file: str) -> dict[str, dict[str, Any]]:
    document = yaml.safe_load((DATA / crd_file).read_text())
    schema = document["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return dict(leaves(schema["properties"]["spec"]))


# --- values ------------------------------------------------------------------------

ENV = [{"name": "SWEEP_VARIABLE", "value": "sweep"}]
BY_NAME: dict[str, list[Any]] = {
    "env": [ENV],
    "args": [["--sweep"]],
    "imagePullSecrets": [["sweep-secret"]],
    "imagePullPolicy": ["Always", "Never", "IfNotPresent"],
    "repository": ["registry.example.com/sweep"],
    "image": ["sweep-image"],
    "version": ["999.99.99"],
    "tolerations": [[{"key": "sweep", "operator": "Exists", "effect": "NoSchedule"}]],
    "relabelings": [
        [{"action": "replace", "sourceLabels": ["__meta_sweep"], "targetLabel": "sweep"}]
    ],
    "resources": [{"limits": {"cpu": "3"}, "requests": {"memory": "37Mi"}}],
    "podSecurityContext": [{"runAsUser": 1234}],
    "nodeAffinity": [
        {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "sweep", "operator": "Exists"}]}
                ]
            }
        }
    ],
    "interval": ["37s"],
    "scrapeTimeout": ["7s"],
    "maxUnavailable": [3, "37%"],
    "podSelector": ["sweep=yes"],
    "kubeletRootDir": ["/sweep/kubelet"],
    "driverInstallDir": ["/sweep/driver"],
    "rootFS": ["/sweep/root"],
    "installDir": ["/sweep/toolkit"],
    "root": ["/sweep/mps"],
    "artifactsDir": ["/sweep/artifacts"],
    "runtimeClasses": [[{"name": "kata-sweep", "artifacts": {"url": "example.com/kata:1"}}]],
    "port": [3037],
    "hostPort": [3037],
    "internalTrafficPolicy": ["Local", "Cluster"],
}
"""Values by field name, for the fields whose type alone does not give a valid one."""

BY_PATH: dict[str, list[Any]] = {
    "spec.dcgmExporter.service.type": ["NodePort", "LoadBalancer", "ClusterIP"],
}
"""Values by path, where the name is too common to go by."""


def candidates(path: str, node: Mapping[str, Any]) -> list[Any]:
    """Values to set `path` to; the field acts if any of them changes what is watched."""
    name = path.rsplit(".", 1)[-1]
    if path in BY_PATH:
        return BY_PATH[path]
    if name in BY_NAME:
        return BY_NAME[name]
    if "enum" in node:
        return list(node["enum"])
    kind = node.get("type")
    if node.get("x-kubernetes-int-or-string"):
        return [3, "37%"]
    if kind == "boolean":
        return [True, False]
    if kind == "integer":
        return [3, 37]
    if kind == "string":
        return ["sweep-value"]
    if kind == "array" and node["items"].get("type") == "string":
        return [["sweep-value"]]
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        if node["additionalProperties"].get("type") == "boolean":
            return [{"SweepGate": True}]
        return [{"sweep.example.com/key": "sweep"}]
    raise AssertionError(f"no sweep value for {path} ({node.get('type')}): add one to BY_NAME")


def with_value(document: Mapping[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of `document` (a `spec`) with `path` (`spec.a.b`) set to `value`."""
    result = copy.deepcopy(dict(document))
    holder = result
    keys = path.split(".")[1:]
    for key in keys[:-1]:
        child = holder.get(key)
        if not isinstance(child, dict):
            child = holder[key] = {}
        holder = child
    holder[keys[-1]] = value
    return result


# --- what is watched ---------------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    reported: tuple[str, ...]
    """The UnsupportedFields condition's entries."""
    effect: str
    """The render and decision inputs, canonical JSON."""


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=repr)


def _policy_doc(scenario: str) -> dict[str, Any]:
    return copy.deepcopy(_recorded_policy(scenario))


@cache
def _recorded_policy(scenario: str) -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load((SCENARIOS / scenario / "policy.yaml").read_text())[
        "spec"
    ]
    return spec


def _node_labels(scenario: str) -> dict[str, dict[str, str]]:
    path = SCENARIOS / scenario / "node-labels.yaml"
    return yaml.safe_load(path.read_text()) if path.is_file() else {}


MONITORING = ("ServiceMonitor", "PrometheusRule")
"""The Prometheus Operator's kinds are served: ServiceMonitors are rendered."""
CONFIG_MAPS = {name: ("sweep.conf",) for name in ("sweep-value", "site-config")}
"""ConfigMaps the cluster holds (the names the sweep and the bases give)."""


def _cluster_policy_seen(
    document: Mapping[str, Any], node_labels: Mapping[str, Mapping[str, str]]
) -> Seen:
    spec = crd.ClusterPolicySpec.model_validate(document)
    side = ours(spec, node_labels, (), MONITORING, CONFIG_MAPS)
    effect = {
        "objects": sorted(map(_canonical, side.objects)),
        "labels": side.labels,
        "annotations": side.annotations,
        "upgrade": policy_view(spec),
        "psa": spec.psa.enabled,
    }
    reported = tuple(f.path for f in crd.unsupported_fields(spec))
    return Seen(reported, _canonical(effect))


_TRAINING = "training"


@cache
def _nvd_policy() -> crd.ClusterPolicySpec:
    return crd.ClusterPolicySpec.model_validate(_policy_doc("nvidiadriver-pools"))


def _nvidiadriver_doc() -> dict[str, Any]:
    path = SCENARIOS / "nvidiadriver-pools" / "nvidiadrivers.yaml"
    drivers = [d for d in yaml.safe_load_all(path.read_text()) if d]
    spec: dict[str, Any] = next(d for d in drivers if d["metadata"]["name"] == _TRAINING)["spec"]
    return spec


def _nvidiadriver_seen(document: Mapping[str, Any], _: Mapping[str, Mapping[str, str]]) -> Seen:
    policy = _nvd_policy()
    model = crd.parse_nvidiadriver(
        {
            "apiVersion": crd.NVD_API_VERSION,
            "kind": crd.NVD_KIND,
            "metadata": {"name": _TRAINING},
            "spec": dict(document),
        }
    )
    side = ours(policy, None, (model,), MONITORING, CONFIG_MAPS)
    effect = {
        "objects": sorted(map(_canonical, side.objects)),
        "labels": side.labels,
        "annotations": side.annotations,
        "upgrade": upgrade_policy(model, policy),
    }
    reported = tuple(f.path for f in crd.nvidiadriver_unsupported_fields(model.spec))
    return Seen(reported, _canonical(effect))


def _gpucluster_seen(document: Mapping[str, Any], _: Mapping[str, Mapping[str, str]]) -> Seen:
    spec = crd.GPUClusterSpec.model_validate(document)
    ctx = c.RenderContext(namespace=NAMESPACE, operator_image=OPERATOR_IMAGE)
    objects = [o for objs in render_gpucluster(spec, ctx).values() for o in objs]
    labels = {}
    for node in simulated_nodes():
        own = dict(node["metadata"]["labels"])
        labels[node["metadata"]["name"]] = c.apply_label_changes(own, gpucluster_label_changes(own))
    effect = {"objects": sorted(map(_canonical, objects)), "labels": labels}
    reported = tuple(f.path for f in crd.gpucluster_unsupported_fields(spec))
    return Seen(reported, _canonical(effect))


# --- bases -------------------------------------------------------------------------


def _enable(document: dict[str, Any], *paths: str) -> dict[str, Any]:
    for path in paths:
        document = with_value(document, f"spec.{path}", True)
    return document


@cache
def _cluster_policy_bases() -> dict[str, tuple[dict[str, Any], dict[str, dict[str, str]]]]:
    """Upstream's chart default with the optional operands on, and the two sandbox modes
    with every sandbox operand on (nodes running containers, passthrough VMs and vGPU
    VMs): together they switch on every operand a field can tune."""
    everything = _enable(
        _policy_doc("default"),
        "dcgm.enabled",
        "gds.enabled",
        "gdrcopy.enabled",
        "driver.rdma.enabled",
        "nodeStatusExporter.enabled",
        "dcgmExporter.serviceMonitor.enabled",
        "operator.metrics.serviceMonitor.enabled",
        "dcgmExporter.hpcJobMapping.enabled",
    )
    # Settings that only act beside another: a device plugin configuration's default,
    # the licensing token beside its gridd.conf.
    everything = with_value(everything, "spec.devicePlugin.config.name", "site-config")
    everything = with_value(everything, "spec.driver.licensingConfig.secretName", "site-config")
    sandbox = ("vfioManager.enabled", "vgpuDeviceManager.enabled", "ccManager.enabled")
    kubevirt = _enable(_policy_doc("sandbox-vm-vgpu"), *sandbox, "sandboxDevicePlugin.enabled")
    kata = _enable(_policy_doc("sandbox-mixed-kata"), *sandbox, "kataSandboxDevicePlugin.enabled")
    mixed = _node_labels("sandbox-mixed-kata")
    return {
        "everything": (everything, {}),
        "kubevirt": (
            with_value(kubevirt, "spec.sandboxWorkloads.defaultWorkload", "container"),
            mixed,
        ),
        "kata": (kata, mixed),
    }


@cache
def _nvidiadriver_bases() -> dict[str, tuple[dict[str, Any], dict[str, dict[str, str]]]]:
    """Upstream's recorded `training` NVIDIADriver (the ampere node), as it is and with
    its sidecars (GDS, GDRCopy, RDMA) and licensing on."""
    plain = _nvidiadriver_doc()
    sidecars = _enable(copy.deepcopy(plain), "gds.enabled", "gdrcopy.enabled", "rdma.enabled")
    # The licensing token only acts beside its gridd.conf.
    sidecars = with_value(sidecars, "spec.licensingConfig.secretName", "site-config")
    return {"recorded": (plain, {}), "sidecars": (sidecars, {})}


@cache
def _gpucluster_bases() -> dict[str, tuple[dict[str, Any], dict[str, dict[str, str]]]]:
    """Upstream's sample GPUCluster (the recorded one), and with DCGM, the exporter's
    ServiceMonitor and its HPC job mapping on."""
    document = yaml.safe_load((SCENARIOS / "gpucluster-default" / "policy.yaml").read_text())
    spec: dict[str, Any] = document["spec"]
    on = _enable(
        copy.deepcopy(spec),
        "dcgm.enabled",
        "dcgmExporter.enabled",
        "dcgmExporter.serviceMonitor.enabled",
        "dcgmExporter.hpcJobMapping.enabled",
    )
    return {"recorded": (spec, {}), "monitoring": (on, {})}


# --- the sweep ---------------------------------------------------------------------

ACTS, REPORTED, IGNORED, REPLACED_, SILENT = "acts", "reported", "ignored", "replaced", "silent"

Bases = dict[str, tuple[dict[str, Any], dict[str, dict[str, str]]]]
Watch = Callable[[Mapping[str, Any], Mapping[str, Mapping[str, str]]], Seen]


@dataclass(frozen=True)
class Kind:
    name: str
    crd_file: str
    bases: Callable[[], Bases]
    watch: Watch


KINDS = {
    k.name: k
    for k in (
        Kind(
            "ClusterPolicy",
            "nvidia.com_clusterpolicies.yaml",
            _cluster_policy_bases,
            _cluster_policy_seen,
        ),
        Kind(
            "NVIDIADriver", "nvidia.com_nvidiadrivers.yaml", _nvidiadriver_bases, _nvidiadriver_seen
        ),
        Kind("GPUCluster", "nvidia.com_gpuclusters.yaml", _gpucluster_bases, _gpucluster_seen),
    )
}


def effect_of(kind: Kind, path: str, node: Mapping[str, Any]) -> str:
    """`acts`, `reported` or `silent`: what setting `path` does on any base."""
    refused = []
    for base_name, (document, node_labels) in kind.bases().items():
        before = _before(kind.name, base_name)
        for value in candidates(path, node):
            try:
                after = kind.watch(with_value(document, path, value), node_labels)
            except pydantic.ValidationError as e:
                refused.append(f"{base_name}: {value!r}: {e.errors()[0]['msg']}")
                continue
            if after.reported != before.reported:
                return REPORTED
            if after.effect != before.effect:
                return ACTS
    if refused and len(refused) == sum(len(candidates(path, node)) for _ in kind.bases()):
        raise AssertionError(f"{kind.name} {path}: every sweep value refused: {refused}")
    return SILENT


@cache
def _before(kind_name: str, base_name: str) -> Seen:
    kind = KINDS[kind_name]
    document, node_labels = kind.bases()[base_name]
    return kind.watch(document, node_labels)


@cache
def sweep(kind_name: str) -> dict[str, str]:
    kind = KINDS[kind_name]
    return {
        path: effect_of(kind, path, node) for path, node in upstream_leaves(kind.crd_file).items()
    }


# --- what is silent on purpose -----------------------------------------------------

_TYPES = "api/nvidia/v1/clusterpolicy_types.go"
_KATA = (
    "deprecated: upstream's ClusterPolicySpec says the kata manager is no longer honoured"
    " and no state reads it (its `enabled` and `hostNetwork` are reported)"
)
_INIT = (
    "deprecated: upstream's InitContainerSpec is read by no state (each init container"
    " runs its operand's or the validator's image)"
)
IGNORED_AS_UPSTREAM: dict[str, dict[str, tuple[str, str]]] = {
    "ClusterPolicy": {
        "spec.dcgm.hostPort": (
            "deprecated upstream; the engine is reached through its Service, no host port",
            _TYPES,
        ),
        **{
            f"spec.kataManager.{field}": (_KATA, _TYPES)
            for field in (
                "args",
                "config.artifactsDir",
                "config.runtimeClasses",
                "env",
                "image",
                "imagePullPolicy",
                "imagePullSecrets",
                "repository",
                "resources",
                "version",
            )
        },
        **{
            f"spec.operator.initContainer.{field}": (_INIT, _TYPES)
            for field in ("image", "imagePullPolicy", "imagePullSecrets", "repository", "version")
        },
        "spec.operator.labels": (
            "no controller reads OperatorSpec.Labels (the chart labels the operator)",
            _TYPES,
        ),
        "spec.operator.annotations": (
            "no controller reads OperatorSpec.Annotations (the chart annotates the operator)",
            _TYPES,
        ),
        "spec.operator.metrics.serviceMonitor.enabled": (
            "the operator's ServiceMonitor is always created where the CRD is served:"
            " upstream logs that disabling it is not supported",
            "controllers/object_controls.go",
        ),
    },
    "NVIDIADriver": {},
    "GPUCluster": {
        "spec.dcgm.hostPort": (
            "deprecated (the v1 DCGMSpec GPUCluster reuses); the DRA DCGM manifest binds"
            " no host port",
            "manifests/state-dcgm/0500_daemonset.yaml",
        ),
    },
}
"""Fields upstream v26.7's operator reads nowhere either (so a migrated policy behaves
the same): kind -> path -> (why, upstream's file that shows it)."""

_OUR_IMAGE = (
    "the operator image replaces upstream's validator image here (README: the operator"
    " image on nodes); its imagePullPolicy and imagePullSecrets are honoured"
)
REPLACED: dict[str, dict[str, str]] = {
    "ClusterPolicy": {
        f"spec.{section}.{field}": _OUR_IMAGE
        for section in ("validator", "nodeStatusExporter")
        for field in ("repository", "image", "version")
    },
    "NVIDIADriver": {},
    "GPUCluster": {},
}
"""Image fields whose container runs our own image instead (documented)."""


def classified(kind_name: str) -> dict[str, str]:
    """Every leaf of upstream's schema: acts, reported, ignored, replaced or silent."""
    result = {}
    for path, effect in sweep(kind_name).items():
        if effect == SILENT and path in IGNORED_AS_UPSTREAM[kind_name]:
            effect = IGNORED
        elif effect == SILENT and path in REPLACED[kind_name]:
            effect = REPLACED_
        result[path] = effect
    return result


@pytest.mark.parametrize("kind_name", list(KINDS))
def test_every_upstream_field_acts_is_reported_or_is_listed(kind_name: str) -> None:
    silent = [path for path, effect in classified(kind_name).items() if effect == SILENT]
    assert not silent, (
        f"{kind_name} fields that change neither the render, a controller decision nor"
        f" the UnsupportedFields condition (make them act as upstream does, report them"
        f" in crd/_unsupported.py, or list them with upstream's reason): {silent}"
    )


@pytest.mark.parametrize("kind_name", list(KINDS))
def test_listed_fields_are_upstream_fields_that_still_do_nothing(kind_name: str) -> None:
    effects = sweep(kind_name)
    listed = {**IGNORED_AS_UPSTREAM[kind_name], **REPLACED[kind_name]}
    unknown = sorted(set(listed) - set(effects))
    assert not unknown, f"listed but not a leaf of upstream's {kind_name} schema: {unknown}"
    acting = sorted(p for p in listed if effects[p] != SILENT)
    assert not acting, f"listed as inert but now {[(p, effects[p]) for p in acting]}"
    assert not set(IGNORED_AS_UPSTREAM[kind_name]) & set(REPLACED[kind_name])


def test_every_ignored_field_cites_upstream() -> None:
    for entries in IGNORED_AS_UPSTREAM.values():
        for path, (reason, upstream_file) in entries.items():
            assert len(reason.split()) >= 5, path
            assert re.fullmatch(r"(api|controllers|internal|manifests)/[\w./-]+", upstream_file)


def counts(kind_name: str) -> dict[str, int]:
    found = Counter(classified(kind_name).values())
    return {k: found[k] for k in (ACTS, REPORTED, IGNORED, REPLACED_, SILENT)}


def test_the_counts_are_as_documented() -> None:
    """What README says of the sweep; a change here is a change to say there."""
    assert {k: counts(k) for k in KINDS} == {
        "ClusterPolicy": {ACTS: 276, REPORTED: 6, IGNORED: 19, REPLACED_: 6, SILENT: 0},
        "NVIDIADriver": {ACTS: 81, REPORTED: 0, IGNORED: 0, REPLACED_: 0, SILENT: 0},
        "GPUCluster": {ACTS: 59, REPORTED: 3, IGNORED: 1, REPLACED_: 0, SILENT: 0},
    }
