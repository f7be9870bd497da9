"""Differential conformance: what our components render for a scenario's policy on the
simulated nodes, against what NVIDIA's operator v26.7 created for it (`rendered.yaml`).

Pure: the nodes are built from `gpuop.devcluster._nodes` (the same 6 nodes `gpuop cluster up
--nodes 6 --gpu-nodes 4` makes), the policy (and a scenario's NVIDIADrivers) is parsed
with our models, and rendering and labelling run as the controller runs them, without a
cluster: NVIDIADriver owner labels from the same assignment, the nodes' upgrade label
from our upgrade machine, their driver hand-off annotation from
`statemachine.driver_handoff`, ServiceMonitors and PrometheusRules for the kinds the
recording cluster served. Each GPU node's `nvidia.com/*` labels and annotations are
compared key by key (`Node/<name>`, path the label key or `annotations.<key>`). Every
field of every object is compared (see
`normalize` and `_walk`): server-written fields are dropped and the API server's defaults
filled in on both sides, list items are matched by their natural key (name, mountPath,
owner) or as sets (tolerations, RBAC grants, subjects), scripts line by line. What is
ours on purpose is in `allowlist.yaml`, by path, with its reason.
"""

from __future__ import annotations

import copy
import difflib
import os
import re
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import pydantic
import yaml

import components as c
import crd
from components.dra import gpucluster_label_changes
from components.dra import render as render_gpucluster
from components.keys import CONTAINER_WORKLOAD, DEPLOY_DRIVER_LABEL, TRUE
from components.nvidiadriver import render as render_nvidiadriver
from crd import OWNER_LABEL
from gpuop.devcluster._nodes import node_manifests
from gpuop.operator.controller.passes.node import target_owner
from gpuop.operator.controller.passes.nvidiadriver import driver_resources
from gpuop.operator.controller.views.driver_owners import upgrade_policy
from gpuop.operator.controller.views.gpucluster_objects import gpucluster_owner
from gpuop.operator.controller.views.objects import is_driver_object
from gpuop.operator.controller.views.upgrade_inputs import policy_view
from gpuop.operator.controller.writers.apply import owned_by, owner_reference
from statemachine import Action, UpgradePolicyView
from statemachine.driver_handoff import handoff_patch, handoff_wanted
from statemachine.driver_owner import NEXT_OWNER_LABEL, assign_owners
from statemachine.upgrade import next_step
from statemachine.upgrade_keys import STATE_LABEL, UpgradeState
from statemachine.upgrade_views import DriverPodView, NodeUpgradeView

REPO = Path(__file__).resolve().parents[2]
ALLOWLIST = Path(__file__).resolve().parent / "allowlist.yaml"
NAMESPACE = "gpu-operator"
OPERATOR_IMAGE = "ghcr.io/gpuop/gpuop:latest"
POLICY = "cluster-policy"
NODES, GPU_NODES = 6, 4
"""The cluster the upstream data was recorded on (see the data's README)."""

ABSENT = "<absent>"


def conformance_dir() -> Path:
    """`$GPUOP_CONFORMANCE_DIR`, else the recorded data kept in the repository
    (`tests/conformance/upstream/`, copied from NVIDIA's operator v26.7 runs)."""
    override = os.environ.get("GPUOP_CONFORMANCE_DIR")
    return Path(override) if override else Path(__file__).resolve().parent / "upstream"


def scenarios(root: Path | None = None) -> list[Path]:
    """Every scenario folder (one with a `policy.yaml`), sorted by name."""
    base = root or conformance_dir()
    return sorted(p.parent for p in base.glob("*/policy.yaml"))


@dataclass(frozen=True, order=True)
class Difference:
    scenario: str
    object: str
    """`Kind/name`, or `Node/<name>` for node labels."""
    path: str
    """Where in the object, e.g. `containers[nvidia-driver-ctr].env.DRIVER_CONFIG_DIGEST`."""
    ours: str
    upstream: str

    def __str__(self) -> str:
        return (
            f"{self.scenario}: {self.object} {self.path or '(object)'}: "
            f"ours={self.ours} upstream={self.upstream}"
        )


# ---------------------------------------------------------------- our side


class Side(NamedTuple):
    """One side of a comparison: the objects, and every GPU node's `nvidia.com/*` labels
    and `nvidia.com/*` annotations (with `(spec.unschedulable)`: "true" where the node is
    cordoned), by node."""

    objects: list[dict[str, Any]]
    labels: dict[str, dict[str, str]]
    annotations: dict[str, dict[str, str]]


UNSCHEDULABLE = "(spec.unschedulable)"
"""How the recordings list a cordoned node among its annotations."""


def simulated_nodes(
    node_labels: Mapping[str, Mapping[str, str]] | None = None,
) -> list[dict[str, Any]]:
    """The recording cluster's nodes, with a scenario's `node-labels.yaml` applied (what
    was labelled before upstream's operator started, e.g. the GPU workload)."""
    nodes = node_manifests(NODES, GPU_NODES)
    extra = dict(node_labels or {})
    for node in nodes:
        meta = node["metadata"]
        meta["labels"] = {**meta["labels"], **extra.pop(meta["name"], {})}
    if extra:
        raise ValueError(f"node-labels.yaml names nodes the cluster does not have: {sorted(extra)}")
    return nodes


def load_node_labels(folder: Path) -> dict[str, dict[str, str]]:
    """The scenario's `node-labels.yaml` (`{node: {key: value}}`); empty where it has none."""
    path = folder / "node-labels.yaml"
    if not path.is_file():
        return {}
    raw = yaml.safe_load(path.read_text()) or {}
    return {str(n): {str(k): str(v) for k, v in labels.items()} for n, labels in raw.items()}


def load_nvidiadrivers(folder: Path) -> list[crd.NVIDIADriver]:
    """The scenario's `nvidiadrivers.yaml` (applied right after the policy) as our
    models read them; none where it has no such file."""
    path = folder / "nvidiadrivers.yaml"
    if not path.is_file():
        return []
    return [crd.parse_nvidiadriver(d) for d in yaml.safe_load_all(path.read_text()) if d]


def served_monitoring_kinds(folder: Path) -> frozenset[str]:
    """The Prometheus Operator kinds (`ServiceMonitor`, `PrometheusRule`) the recording
    cluster served: the CRDs in the scenario's `prometheus-crds.yaml`; none without it."""
    path = folder / "prometheus-crds.yaml"
    if not path.is_file():
        return frozenset()
    return frozenset(
        str(doc["spec"]["names"]["kind"])
        for doc in yaml.safe_load_all(path.read_text())
        if doc
        and doc.get("kind") == "CustomResourceDefinition"
        and doc["spec"].get("group") == MONITORING_GROUP
        and any(v.get("served") for v in doc["spec"].get("versions") or ())
    )


MONITORING_GROUP = "monitoring.coreos.com"


def load_policy(folder: Path) -> tuple[crd.ClusterPolicySpec, list[Difference]]:
    """The scenario's policy as our models read it, and a difference for every field they
    reject as unknown (dropped so the rest can still be compared)."""
    raw = yaml.safe_load((folder / "policy.yaml").read_text())
    unknown: list[Difference] = []
    for _ in range(50):
        try:
            return crd.ClusterPolicy.model_validate(raw).spec, unknown
        except pydantic.ValidationError as error:
            extra = [e for e in error.errors() if e["type"] == "extra_forbidden"]
            if not extra:
                raise
            for e in extra:
                *parents, leaf = e["loc"]
                holder = raw
                for key in parents:
                    holder = holder[key]
                value = holder.pop(leaf)
                field = ".".join(str(k) for k in e["loc"])
                unknown.append(
                    Difference(folder.name, "ClusterPolicy", field, "<unknown field>", _text(value))
                )
    raise AssertionError("policy never parses")  # pragma: no cover


def _nvd_uid(name: str) -> str:
    """The uid our NVIDIADriver `name` stands in with (the recordings strip uids; the
    DaemonSet names that hash it are compared without the hash: `uid_hash_named`)."""
    return f"uid-of-{name}"


def _uses_nvidiadrivers(spec: crd.ClusterPolicySpec) -> bool:
    """Whether the policy hands its driver to NVIDIADrivers
    (`gpuop.operator.controller.views.driver_owners.DriverOwners.enabled`)."""
    return spec.driver.enabled and spec.driver.use_nvidia_driver_crd


def _labelled(spec: crd.ClusterPolicySpec, labels: dict[str, str], name: str) -> dict[str, str]:
    """`labels` once our labeller reached its fixed point."""
    for _ in range(5):
        changes = c.node_label_changes(labels, spec)
        if not changes:
            return labels
        labels = c.apply_label_changes(labels, changes)
    raise AssertionError(f"labels of {name} never settle")  # pragma: no cover


def _owner_labels(
    nodes: list[dict[str, Any]], spec: crd.ClusterPolicySpec, drivers: Sequence[crd.NVIDIADriver]
) -> tuple[list[dict[str, Any]], set[str]]:
    """`nodes` with the owner labels our NVIDIADriver pass writes
    (`gpuop.operator.controller.passes.nvidiadriver`), passed until it changes nothing, and the
    resources
    it reports a problem for (they render nothing). At rest on a fresh cluster nothing is
    held (the policy renders no driver DaemonSet of its own with `useNvidiaDriverCRD`, and
    no driver pod ran before) and no node is busy upgrading."""
    if not _uses_nvidiadrivers(spec):
        return nodes, set()  # our pass gives every node back: none carries an owner label
    models = {m.name: m for m in drivers}
    managed = {name for name, m in models.items() if upgrade_policy(m, spec).auto_upgrade}
    for _ in range(5):
        gpu = {
            n["metadata"]["name"]: n["metadata"]["labels"]
            for n in nodes
            if c.is_gpu_node(n["metadata"]["labels"])
        }
        assignment = assign_owners(gpu, driver_resources(models), (), managed, ())
        if not assignment.changes and not assignment.moves:
            return nodes, set(assignment.problems)
        patches: dict[str, dict[str, str | None]] = {}
        for name, owner in assignment.changes.items():
            patches.setdefault(name, {})[OWNER_LABEL] = owner
        for name, next_owner in assignment.moves.items():
            patches.setdefault(name, {})[NEXT_OWNER_LABEL] = next_owner
        nodes = [
            _with_labels(n, _apply(n["metadata"]["labels"], patches.get(n["metadata"]["name"], {})))
            for n in nodes
        ]
    raise AssertionError("owner labels never settle")  # pragma: no cover


def _with_labels(node: Mapping[str, Any], labels: Mapping[str, str]) -> dict[str, Any]:
    return {**node, "metadata": {**node["metadata"], "labels": dict(labels)}}


def _nvd_policies(
    spec: crd.ClusterPolicySpec, drivers: Sequence[crd.NVIDIADriver]
) -> dict[str, UpgradePolicyView] | None:
    """Each NVIDIADriver's upgradePolicy as the node pass reads it
    (`DriverOwners.upgrade_policies`): None when the policy does not use them."""
    if not _uses_nvidiadrivers(spec):
        return None
    return {m.name: upgrade_policy(m, spec) for m in drivers if not m.deleting}


def _runs_driver(labels: Mapping[str, str], objects: Iterable[dict[str, Any]]) -> bool:
    """Whether a driver DaemonSet we render (the policy's, or an NVIDIADriver's pool)
    selects a node with these labels: its driver pod runs there at rest."""
    for obj in objects:
        if obj["kind"] != "DaemonSet" or not is_driver_object(obj):
            continue
        selector = obj["spec"]["template"]["spec"].get("nodeSelector") or {}
        if all(labels.get(k) == v for k, v in selector.items()):
            return True
    return False


def _upgrade_labels(
    name: str,
    labels: dict[str, str],
    spec: crd.ClusterPolicySpec,
    nvd_policies: Mapping[str, UpgradePolicyView],
    runs_driver: bool,
) -> dict[str, str]:
    """`labels` with the upgrade machine's label writes applied, under the node pass's
    own conditions (`gpuop.operator.controller.passes.node`): the policy's or the owning
    NVIDIADriver's
    upgradePolicy; the enrolment step (a GPU node getting the policy's driver, in the
    deploy labels' write); then the step for the node with its driver pod current (or,
    where no driver DaemonSet selects the node, with none)."""
    owner = target_owner(labels)
    policy = policy_view(spec)
    if owner:
        policy = nvd_policies.get(owner) or UpgradePolicyView(auto_upgrade=False)
    workload = c.node_workload(labels, spec).name
    if not (policy.auto_upgrade and c.is_gpu_node(labels) and workload == CONTAINER_WORKLOAD):
        return labels
    enrols = (
        not _uses_nvidiadrivers(spec)
        and spec.driver.enabled
        and labels.get(DEPLOY_DRIVER_LABEL) == TRUE
        and not owner
        and STATE_LABEL not in labels
    )
    if enrols:
        enrolment = next_step(
            NodeUpgradeView(name=name, now=0.0, labels=labels, enrolling=True), policy
        )
        if enrolment.target is UpgradeState.UPGRADE_DONE and enrolment.action is Action.NONE:
            labels = _apply(labels, enrolment.labels)
    pod = DriverPodView(uid="driver-pod", revision_hash="newest", running=True, ready=True)
    current = NodeUpgradeView(
        name=name,
        now=0.0,
        labels=labels,
        driver_pod=pod if runs_driver else None,
        newest_revision="newest" if runs_driver else None,
    )
    return _apply(labels, next_step(current, policy).labels)


def _handoff_annotations(
    node: Mapping[str, Any],
    spec: crd.ClusterPolicySpec,
    nvd_policies: Mapping[str, UpgradePolicyView] | None,
) -> dict[str, str]:
    """The node's annotations with the driver manager's hand-off annotation our node
    pass writes (`statemachine.driver_handoff`, on the node's settled labels)."""
    current = dict(node["metadata"].get("annotations") or {})
    auto = (
        {k: v.auto_upgrade for k, v in nvd_policies.items()} if nvd_policies is not None else None
    )
    wanted = handoff_wanted(node["metadata"]["labels"], spec, auto)
    return _apply(current, handoff_patch(current, wanted))


def _apply(labels: Mapping[str, str], patch: Mapping[str, str | None]) -> dict[str, str]:
    result = dict(labels)
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = value
    return result


def _our_cluster(
    spec: crd.ClusterPolicySpec,
    node_labels: Mapping[str, Mapping[str, str]] | None = None,
    nvidiadrivers: Sequence[crd.NVIDIADriver] = (),
    monitoring: Collection[str] = (),
    config_map_keys: Mapping[str, tuple[str, ...]] | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Our objects and the nodes as our passes leave them at rest: labelled to the
    labeller's fixed point, given their NVIDIADriver owners, then (objects rendered)
    through the upgrade machine, and annotated by the node pass. `config_map_keys`:
    the ConfigMaps the cluster holds (`RenderContext.config_map_keys`), none by default."""
    nodes = [
        _with_labels(n, _labelled(spec, dict(n["metadata"]["labels"]), n["metadata"]["name"]))
        for n in simulated_nodes(node_labels)
    ]
    nodes, problems = _owner_labels(nodes, spec, nvidiadrivers)
    gpu = [n for n in nodes if c.is_gpu_node(n["metadata"]["labels"])]
    ctx = c.RenderContext(
        namespace=NAMESPACE,
        operator_image=OPERATOR_IMAGE,
        mig_capable=c.any_mig_capable(n["metadata"]["labels"] for n in gpu),
        # What the recording cluster served (`prometheus-crds.yaml`): upstream creates its
        # ServiceMonitors and PrometheusRules only where the kinds are served.
        service_monitor_crd="ServiceMonitor" in monitoring,
        prometheus_rule_crd="PrometheusRule" in monitoring,
        gpu_nodes=tuple(c.node_facts(n) for n in gpu),
        config_map_keys=dict(config_map_keys or {}),
    )
    # As the controller applies them (`gpuop.operator.controller.passes.cluster`): owned by the
    # policy,
    # with our content hash.
    owner = owner_reference("nvidia.com/v1", "ClusterPolicy", {"name": POLICY, "uid": "-"})
    objects = [
        c.with_hash(owned_by(o, owner))
        for objs in c.desired_objects(spec, ctx).values()
        for o in objs
    ]
    if _uses_nvidiadrivers(spec):
        objects += _nvidiadriver_objects(spec, nodes, nvidiadrivers, problems, config_map_keys)
    policies = _nvd_policies(spec, nvidiadrivers)
    result = []
    for node in nodes:
        name, labels = node["metadata"]["name"], node["metadata"]["labels"]
        labels = _upgrade_labels(name, labels, spec, policies or {}, _runs_driver(labels, objects))
        node = _with_labels(node, labels)
        annotations = _handoff_annotations(node, spec, policies)
        result.append({**node, "metadata": {**node["metadata"], "annotations": annotations}})
    return objects, result


def _nvidiadriver_objects(
    spec: crd.ClusterPolicySpec,
    nodes: Sequence[Mapping[str, Any]],
    drivers: Sequence[crd.NVIDIADriver],
    problems: Collection[str],
    config_map_keys: Mapping[str, tuple[str, ...]] | None = None,
) -> list[dict[str, Any]]:
    """Each NVIDIADriver's driver DaemonSets (one per pool of the nodes it owns), as our
    NVIDIADriver pass applies them: owned by the resource, with our content hash."""
    objects = []
    for model in sorted(drivers, key=lambda m: m.name):
        if model.deleting or model.name in problems:
            continue  # its status says why; nothing is rendered for it
        uid = _nvd_uid(model.name)
        ctx = c.RenderContext(
            namespace=NAMESPACE,
            operator_image=OPERATOR_IMAGE,
            config_map_keys=dict(config_map_keys or {}),
        )
        owner = owner_reference(crd.NVD_API_VERSION, crd.NVD_KIND, {"name": model.name, "uid": uid})
        objects += [
            c.with_hash(owned_by(o, owner))
            for o in render_nvidiadriver(model.name, uid, model.spec, nodes, spec, ctx)
        ]
    return objects


def labelled_nodes(
    spec: crd.ClusterPolicySpec,
    node_labels: Mapping[str, Mapping[str, str]] | None = None,
    nvidiadrivers: Sequence[crd.NVIDIADriver] = (),
) -> list[dict[str, Any]]:
    """The simulated nodes (with the scenario's own labels) as our passes leave them:
    labeller, NVIDIADriver owners, upgrade machine and hand-off annotation (see
    `_our_cluster`)."""
    return _our_cluster(spec, node_labels, nvidiadrivers)[1]


def ours(
    spec: crd.ClusterPolicySpec,
    node_labels: Mapping[str, Mapping[str, str]] | None = None,
    nvidiadrivers: Sequence[crd.NVIDIADriver] = (),
    monitoring: Collection[str] = (),
    config_map_keys: Mapping[str, tuple[str, ...]] | None = None,
) -> Side:
    """Our objects and our GPU nodes' `nvidia.com/*` labels and annotations for this
    policy, on nodes labelled with `node_labels` first, with these NVIDIADrivers, on a
    cluster serving the `monitoring` kinds of the Prometheus Operator (and holding these
    ConfigMaps: `config_map_keys`)."""
    objects, nodes = _our_cluster(spec, node_labels, nvidiadrivers, monitoring, config_map_keys)
    return Side(objects, _gpu_node_labels(nodes), _gpu_node_annotations(nodes))


def _gpu_node_labels(nodes: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """`nvidia.com/*` labels of every node that has any (upstream's data lists the GPU
    nodes; a CPU node we labelled shows up as a node upstream does not have)."""
    result = {}
    for n in nodes:
        ours = {k: v for k, v in n["metadata"]["labels"].items() if k.startswith("nvidia.com/")}
        if ours or c.is_gpu_node(n["metadata"]["labels"]):
            result[n["metadata"]["name"]] = ours
    return result


def _gpu_node_annotations(nodes: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """`nvidia.com/*` annotations, and `(spec.unschedulable)` where cordoned, of every GPU
    node and every other node that has any, as the recordings list them."""
    result = {}
    for n in nodes:
        annotations = n["metadata"].get("annotations") or {}
        ours = {k: v for k, v in annotations.items() if k.startswith("nvidia.com/")}
        if (n.get("spec") or {}).get("unschedulable"):
            ours[UNSCHEDULABLE] = TRUE
        if ours or c.is_gpu_node(n["metadata"]["labels"]):
            result[n["metadata"]["name"]] = ours
    return result


def ours_gpucluster(folder: Path) -> Side:
    """Our objects and GPU node labels for a scenario whose policy is a GPUCluster, as
    `gpuop.operator.controller.passes.gpucluster` applies and labels them. With a GPUCluster and no
    ClusterPolicy our node pass writes no hand-off annotation: the nodes keep the none
    they started with."""
    cluster = crd.parse_gpucluster(yaml.safe_load((folder / "policy.yaml").read_text()))
    nodes = []
    for node in simulated_nodes():
        labels = dict(node["metadata"]["labels"])
        labels = c.apply_label_changes(labels, gpucluster_label_changes(labels))
        nodes.append(_with_labels(node, labels))
    ctx = c.RenderContext(namespace=NAMESPACE, operator_image=OPERATOR_IMAGE)
    owner = gpucluster_owner({"name": cluster.name, "uid": "-"})
    objects = [
        c.with_hash(owned_by(o, owner))
        for objs in render_gpucluster(cluster.spec, ctx).values()
        for o in objs
    ]
    return Side(objects, _gpu_node_labels(nodes), _gpu_node_annotations(nodes))


NODE_LABELS, NODE_ANNOTATIONS = "NodeLabels", "NodeAnnotations"


def recorded_annotations(folder: Path) -> dict[str, dict[str, str]] | None:
    """Upstream's GPU node annotations: the `NodeAnnotations` document of `rendered.yaml`,
    else (recordings from before they were kept) `node-annotations.yaml`; None where the
    scenario has neither."""
    docs = [d for d in yaml.safe_load_all((folder / "rendered.yaml").read_text()) if d]
    doc = next((d for d in docs if d.get("kind") == NODE_ANNOTATIONS), None)
    beside = folder / "node-annotations.yaml"
    if doc is None and beside.is_file():
        doc = yaml.safe_load(beside.read_text())
    if doc is None:
        return None
    return {
        str(n): {str(k): _text(v) for k, v in (values or {}).items()}
        for n, values in (doc.get("nodes") or {}).items()
    }


def upstream(folder: Path) -> Side:
    docs = [d for d in yaml.safe_load_all((folder / "rendered.yaml").read_text()) if d]
    nodes: dict[str, Any] = next((d["nodes"] for d in docs if d.get("kind") == NODE_LABELS), {})
    labels = {str(n): {str(k): _text(v) for k, v in (ls or {}).items()} for n, ls in nodes.items()}
    objects = [d for d in docs if d.get("kind") not in (NODE_LABELS, NODE_ANNOTATIONS)]
    return Side(objects, labels, recorded_annotations(folder) or {})


# ---------------------------------------------------------------- normalization


def _key(obj: Mapping[str, Any]) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


def _text(value: Any) -> str:
    if value is None:
        return ABSENT
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        return str(value)
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()


SERVER_METADATA = (
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "generation",
    "managedFields",
    "selfLink",
)
"""Metadata the API server writes (the recorded data has them stripped already)."""

SERVER_ANNOTATIONS = (
    "deprecated.daemonset.template.generation",
    "deployment.kubernetes.io/revision",
)
"""Annotations the DaemonSet and Deployment controllers write on every object they store."""

SERVER_SERVICE_FIELDS = ("clusterIP", "clusterIPs")
"""Allocated by the API server at create time; not part of anyone's render."""


def _image_pull_default(image: str) -> str:
    """The API server's `imagePullPolicy` default: `Always` for `:latest` or no tag."""
    tail = image.rsplit("/", 1)[-1]
    if "@" in tail:
        return "IfNotPresent"
    tag = tail.split(":", 1)[1] if ":" in tail else "latest"
    return "Always" if tag == "latest" else "IfNotPresent"


def _probe_defaults(probe: dict[str, Any]) -> None:
    for key, value in (
        ("timeoutSeconds", 1),
        ("periodSeconds", 10),
        ("successThreshold", 1),
        ("failureThreshold", 3),
    ):
        probe.setdefault(key, value)
    if "httpGet" in probe:
        probe["httpGet"].setdefault("scheme", "HTTP")


def _container_defaults(ct: dict[str, Any]) -> None:
    ct.setdefault("terminationMessagePath", "/dev/termination-log")
    ct.setdefault("terminationMessagePolicy", "File")
    ct.setdefault("imagePullPolicy", _image_pull_default(str(ct.get("image", ""))))
    ct.setdefault("resources", {})
    for port in ct.get("ports") or ():
        port.setdefault("protocol", "TCP")
    for var in ct.get("env") or ():
        if var.get("value") == "":
            del var["value"]  # stored without it (`omitempty`): the same unset value
        ref = (var.get("valueFrom") or {}).get("fieldRef")
        if ref is not None:
            ref.setdefault("apiVersion", "v1")
    for key in ("livenessProbe", "readinessProbe", "startupProbe"):
        if ct.get(key):
            _probe_defaults(ct[key])


def _pod_defaults(pod: dict[str, Any]) -> None:
    """What the API server fills in a pod template when it stores it."""
    pod.setdefault("dnsPolicy", "ClusterFirst")
    pod.setdefault("restartPolicy", "Always")
    pod.setdefault("schedulerName", "default-scheduler")
    pod.setdefault("securityContext", {})
    pod.setdefault("terminationGracePeriodSeconds", 30)
    if pod.get("serviceAccountName"):
        pod.setdefault("serviceAccount", pod["serviceAccountName"])
    for kind in ("initContainers", "containers"):
        for ct in pod.get(kind) or ():
            _container_defaults(ct)
    for volume in pod.get("volumes") or ():
        if "hostPath" in volume:
            volume["hostPath"].setdefault("type", "")
        if "configMap" in volume:
            volume["configMap"].setdefault("defaultMode", 420)
        if "secret" in volume:
            volume["secret"].setdefault("defaultMode", 420)


def _server_defaults(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` as the API server stores it: its defaults filled where a field is absent,
    server-written fields removed. Applied to both sides, so a value either side set
    explicitly still counts."""
    obj = copy.deepcopy(obj)
    obj.pop("status", None)
    meta = obj.setdefault("metadata", {})
    for key in SERVER_METADATA:
        meta.pop(key, None)
    for ref in meta.get("ownerReferences") or ():
        ref.pop("uid", None)
    annotations = meta.get("annotations") or {}
    for key in SERVER_ANNOTATIONS:
        annotations.pop(key, None)
    if "annotations" in meta and not annotations:
        meta.pop("annotations")
    kind = obj.get("kind")
    spec = obj.get("spec")
    if kind in ("DaemonSet", "Deployment") and isinstance(spec, dict):
        spec.setdefault("revisionHistoryLimit", 10)
        template = spec.setdefault("template", {})
        template.setdefault("metadata", {}).pop("creationTimestamp", None)
        _pod_defaults(template.setdefault("spec", {}))
    if kind == "DaemonSet" and isinstance(spec, dict):
        strategy = spec.setdefault("updateStrategy", {"type": "RollingUpdate"})
        if strategy.get("type", "RollingUpdate") == "RollingUpdate":
            strategy.setdefault("type", "RollingUpdate")
            rolling = strategy.setdefault("rollingUpdate", {})
            rolling.setdefault("maxUnavailable", 1)
            rolling.setdefault("maxSurge", 0)
    if kind == "Deployment" and isinstance(spec, dict):
        spec.setdefault("replicas", 1)
        spec.setdefault("progressDeadlineSeconds", 600)
        strategy = spec.setdefault("strategy", {"type": "RollingUpdate"})
        if strategy.get("type", "RollingUpdate") == "RollingUpdate":
            strategy.setdefault("type", "RollingUpdate")
            rolling = strategy.setdefault("rollingUpdate", {})
            rolling.setdefault("maxUnavailable", "25%")
            rolling.setdefault("maxSurge", "25%")
    if kind == "ResourceClaimTemplate" and isinstance(spec, dict):
        spec.setdefault("metadata", {})
    if kind == "ValidatingAdmissionPolicy" and isinstance(spec, dict):
        match = spec.setdefault("matchConstraints", {})
        match.setdefault("matchPolicy", "Equivalent")
        match.setdefault("namespaceSelector", {})
        match.setdefault("objectSelector", {})
        for resource_rule in match.get("resourceRules") or ():
            resource_rule.setdefault("scope", "*")
    if kind == "Service" and isinstance(spec, dict):
        for key in SERVER_SERVICE_FIELDS:
            spec.pop(key, None)
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        spec.setdefault("internalTrafficPolicy", "Cluster")
        spec.setdefault("ipFamilies", ["IPv4"])
        spec.setdefault("ipFamilyPolicy", "SingleStack")
        for port in spec.get("ports") or ():
            port.setdefault("protocol", "TCP")
            port.setdefault("targetPort", port.get("port"))
    return obj


# ---------------------------------------------------------------- diff

_KEYED_BY = {"volumeMounts": "mountPath", "volumeDevices": "devicePath"}
"""Lists whose items are keyed by a field other than `name`."""

_SET_LISTS = ("tolerations", "subjects", "matchExpressions", "imagePullSecrets")
"""Lists whose order means nothing: items are compared as a set of values."""


_EXPANDED = ("labels", "annotations", "initContainers", "containers", "volumes", "env")
"""Maps and keyed lists compared entry by entry where one side lacks them altogether."""


def _rules(rules: Iterable[Mapping[str, Any]]) -> list[str]:
    """RBAC rules as the (group, resource[names], verb) triples they grant: two rule
    lists that grant the same are equal however they are split or ordered."""
    triples = set()
    for rule in rules:
        names = ",".join(sorted(rule.get("resourceNames") or ()))
        for url in rule.get("nonResourceURLs") or ():
            for verb in rule.get("verbs") or ():
                triples.add(f"url:{url}:{verb}")
        for group in rule.get("apiGroups") or ():
            for resource in rule.get("resources") or ():
                for verb in rule.get("verbs") or ():
                    suffix = f"[{names}]" if names else ""
                    triples.add(f"{group or 'core'}/{resource}{suffix}:{verb}")
    return sorted(triples)


def _item_key(field: str, item: Any) -> str | None:
    """The natural key of one list item, or None when the list is not keyed."""
    if not isinstance(item, dict):
        return None
    if field == "ownerReferences":
        return f"{item.get('kind')}/{item.get('name')}"
    key = _KEYED_BY.get(field)
    if key is not None:
        value = item.get(key)
        return None if value is None else str(value).rstrip("/") or "/"
    if field == "ports" and "name" not in item:
        port = item.get("containerPort", item.get("port"))
        return None if port is None else str(port)
    name = item.get("name")
    return None if name is None else str(name)


def _keyed(field: str, items: list[Any]) -> dict[str, Any] | None:
    keys = [_item_key(field, item) for item in items]
    if not items or None in keys or len(set(keys)) != len(keys):
        return None
    return {k: item for k, item in zip(keys, items, strict=True) if k is not None}


def _config_value(value: Any) -> Any:
    """A ConfigMap value: structured YAML (MIG layouts, time-slicing, GPU clients) is
    compared field by field; a script as its lines."""
    if not isinstance(value, str):
        return value
    try:
        parsed = yaml.safe_load(value)
    except yaml.YAMLError:
        parsed = None
    if isinstance(parsed, dict):
        return parsed
    return value


def _walk(path: str, field: str, a: Any, b: Any) -> Iterator[tuple[str, str, str]]:
    """Every leaf where `a` (ours) and `b` (upstream) differ, with its path."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in dict.fromkeys([*a, *b]):
            sub = f"{path}.{key}" if path else str(key)
            if key in _EXPANDED and isinstance(a.get(key, b.get(key)), dict | list):
                # One label or one container at a time, even where a side has none.
                empty: dict[str, Any] | list[Any] = (
                    {} if isinstance(a.get(key, b.get(key)), dict) else []
                )
                yield from _walk(sub, str(key), a.get(key, empty), b.get(key, empty))
            elif key not in b:
                yield sub, _text(a[key]), ABSENT
            elif key not in a:
                yield sub, ABSENT, _text(b[key])
            else:
                yield from _walk(sub, str(key), a[key], b[key])
        return
    if isinstance(a, list) and isinstance(b, list):
        if field == "rules":
            a, b = _rules(a), _rules(b)
        if field in _SET_LISTS or field == "rules":
            texts_a, texts_b = {_text(x) for x in a}, {_text(x) for x in b}
            for item in sorted(texts_a - texts_b):
                yield f"{path}[{item}]", "present", ABSENT
            for item in sorted(texts_b - texts_a):
                yield f"{path}[{item}]", ABSENT, "present"
            return
        keyed_a, keyed_b = _keyed(field, a), _keyed(field, b)
        if (keyed_a is not None or not a) and (keyed_b is not None or not b):
            yield from _walk_keyed(path, keyed_a or {}, keyed_b or {})
            return
    if isinstance(a, str) and isinstance(b, str) and a != b and ("\n" in a or "\n" in b):
        yield path, *_line_diff(a, b)
        return
    if a != b:
        yield path, _text(a), _text(b)


def _walk_keyed(
    path: str, a: Mapping[str, Any], b: Mapping[str, Any]
) -> Iterator[tuple[str, str, str]]:
    for key in dict.fromkeys([*a, *b]):
        sub = f"{path}[{key}]"
        if key not in b:
            yield sub, "present", ABSENT
        elif key not in a:
            yield sub, ABSENT, "present"
        else:
            yield from _walk(sub, "", a[key], b[key])


def _line_diff(a: str, b: str) -> tuple[str, str]:
    """A multi-line text (a script) as the lines only ours has and only upstream's has,
    in order, so the difference reads without the shared lines."""
    ours_only: list[str] = []
    theirs_only: list[str] = []
    lines_a, lines_b = a.splitlines(), b.splitlines()
    matcher = difflib.SequenceMatcher(a=lines_a, b=lines_b, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            ours_only += lines_a[i1:i2]
            theirs_only += lines_b[j1:j2]
    return (
        " | ".join(line.strip() for line in ours_only) or "<no extra line>",
        " | ".join(line.strip() for line in theirs_only) or "<no extra line>",
    )


def normalize(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The whole object as compared: server defaults filled and server fields removed,
    ConfigMap values parsed where they are structured."""
    result = _server_defaults(dict(obj))
    if result.get("kind") == "ConfigMap":
        result["data"] = {k: _config_value(v) for k, v in (result.get("data") or {}).items()}
    return result


def is_gpucluster(folder: Path) -> bool:
    """Whether the scenario's policy is a GPUCluster rather than a ClusterPolicy."""
    return bool(yaml.safe_load((folder / "policy.yaml").read_text())["kind"] == crd.GC_KIND)


def ours_side(folder: Path) -> Side:
    """Our objects, node labels and node annotations for a scenario, whichever kind its
    policy is, with its node labels, NVIDIADrivers and served Prometheus kinds."""
    if is_gpucluster(folder):
        return ours_gpucluster(folder)
    return ours(
        load_policy(folder)[0],
        load_node_labels(folder),
        load_nvidiadrivers(folder),
        served_monitoring_kinds(folder),
    )


def ours_for(folder: Path) -> tuple[list[dict[str, Any]], dict[str, dict[str, str]]]:
    """Our objects and node labels for a scenario (`ours_side` without the annotations)."""
    side = ours_side(folder)
    return side.objects, side.labels


_UID_HASH = re.compile(r"(?P<prefix>.+)-[bcdfghjklmnpqrstvwxz2456789]{1,10}")
"""A name ending in `components.nvidiadriver._safe_hash` of a uid (upstream's
GetStringHash: FNV-1a 32-bit in decimal, safe-encoded)."""


def uid_hash_named(obj: dict[str, Any]) -> dict[str, Any]:
    """An NVIDIADriver's DaemonSet with the hash of its owner's uid in its name (and its
    `app` label and selector, the same string) written `<uid-hash:OWNER>`: the recordings
    strip uids, so both sides are compared without it (`app_name` builds the rest of the
    name, compared; its hash is tests/unit/test_nvidiadriver.py's)."""
    meta = obj.get("metadata") or {}
    owner = next(
        (r.get("name") for r in meta.get("ownerReferences") or () if r.get("kind") == crd.NVD_KIND),
        None,
    )
    match = _UID_HASH.fullmatch(str(meta.get("name", "")))
    if obj.get("kind") != "DaemonSet" or owner is None or match is None:
        return obj
    renamed: dict[str, Any] = _replace_string(
        obj, meta["name"], f"{match['prefix']}-<uid-hash:{owner}>"
    )
    return renamed


def _replace_string(value: Any, old: str, new: str) -> Any:
    if isinstance(value, dict):
        return {k: _replace_string(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace_string(v, old, new) for v in value]
    return new if value == old else value


def compare(folder: Path) -> list[Difference]:
    """Every difference between our rendering and upstream's for one scenario: objects,
    then each GPU node's labels (`Node/<name>`, path the label key) and annotations
    (`Node/<name>`, path `annotations.<key>`)."""
    name = folder.name
    diffs = [] if is_gpucluster(folder) else load_policy(folder)[1]
    our_side, their_side = ours_side(folder), upstream(folder)
    mine = {_key(o): o for o in map(uid_hash_named, our_side.objects)}
    theirs = {_key(o): o for o in map(uid_hash_named, their_side.objects)}
    for key in dict.fromkeys([*theirs, *mine]):
        if key not in theirs:
            diffs.append(Difference(name, key, "", "present", ABSENT))
        elif key not in mine:
            diffs.append(Difference(name, key, "", ABSENT, "present"))
        else:
            a, b = normalize(mine[key]), normalize(theirs[key])
            diffs += [Difference(name, key, p, x, y) for p, x, y in _walk("", "", a, b)]
    for root, ours_by_node, theirs_by_node in (
        ("", our_side.labels, their_side.labels),
        ("annotations", our_side.annotations, their_side.annotations),
    ):
        for node in sorted({*ours_by_node, *theirs_by_node}):
            mine_n, theirs_n = ours_by_node.get(node, {}), theirs_by_node.get(node, {})
            for p, x, y in _walk(root, "", mine_n, theirs_n):
                diffs.append(Difference(name, f"Node/{node}", p, x, y))
    return sorted(diffs)


# ---------------------------------------------------------------- allowlist


@dataclass(frozen=True)
class Allowed:
    scenario: str
    object: str
    path: str
    reason: str

    def matches(self, diff: Difference) -> bool:
        return (
            _glob(self.scenario, diff.scenario)
            and _glob(self.object, diff.object)
            and _glob(self.path, diff.path)
        )


def _glob(pattern: str, text: str) -> bool:
    """`*` matches anything; every other character only itself (paths hold `[`)."""
    regex = ".*".join(re.escape(part) for part in pattern.split("*"))
    return re.fullmatch(regex, text) is not None


def load_allowlist(path: Path = ALLOWLIST) -> list[Allowed]:
    entries = yaml.safe_load(path.read_text()) or []
    result = []
    for entry in entries:
        reason = str(entry.get("reason", "")).strip()
        if not reason:
            raise ValueError(f"allowlist entry without a reason: {entry}")
        result.append(
            Allowed(
                str(entry["scenario"]), str(entry["object"]), str(entry.get("path", "")), reason
            )
        )
    return result


def split(
    diffs: Iterable[Difference], allowlist: Iterable[Allowed]
) -> tuple[list[Difference], list[Difference]]:
    """(allowed, unexplained) differences."""
    entries = list(allowlist)
    allowed: list[Difference] = []
    unexplained: list[Difference] = []
    for diff in diffs:
        (allowed if any(e.matches(diff) for e in entries) else unexplained).append(diff)
    return allowed, unexplained


def stale(diffs: Iterable[Difference], allowlist: Iterable[Allowed]) -> list[Allowed]:
    """Allowlist entries that explain no difference any more."""
    all_diffs = list(diffs)
    return [e for e in allowlist if not any(e.matches(d) for d in all_diffs)]
