"""Differential conformance: what our components render for a scenario's policy on the
simulated nodes, against what NVIDIA's operator v26.7 created for it (`rendered.yaml`).

Pure: the nodes are built from `gpuop.cluster._nodes` (the same 6 nodes `gpuop cluster up
--nodes 6 --gpu-nodes 4` makes), the policy is parsed with our models, and rendering and
labelling run as the controller runs them, without a cluster, and the nodes' upgrade
label is what our upgrade machine writes. Every field of every object is compared (see
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
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pydantic
import yaml

import components as c
import crd
from components.keys import DEPLOY_DRIVER_LABEL, TRUE
from crd import OWNER_LABEL
from gpuop.cluster._nodes import node_manifests
from gpuop.controller._apply import owned_by, owner_reference
from gpuop.controller._upgrade_inputs import policy_view
from statemachine.upgrade import next_step
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


def labelled_nodes(
    spec: crd.ClusterPolicySpec, node_labels: Mapping[str, Mapping[str, str]] | None = None
) -> list[dict[str, Any]]:
    """The simulated nodes (with the scenario's own labels) after our labeller reached its
    fixed point, then through our
    upgrade machine as the controller drives it (`gpuop.controller._node`): enrolment
    in the deploy labels' write, then the node pass once the driver pod runs the
    DaemonSet's newest revision."""
    result = []
    for node in simulated_nodes(node_labels):
        labels = dict(node["metadata"]["labels"])
        for _ in range(5):
            changes = c.node_label_changes(labels, spec)
            if not changes:
                break
            labels = c.apply_label_changes(labels, changes)
        else:  # pragma: no cover - the labeller is a fixed point by its own tests
            raise AssertionError(f"labels of {node['metadata']['name']} never settle")
        labels = _upgrade_labels(node["metadata"]["name"], labels, spec)
        result.append({**node, "metadata": {**node["metadata"], "labels": labels}})
    return result


def _upgrade_labels(
    name: str, labels: dict[str, str], spec: crd.ClusterPolicySpec
) -> dict[str, str]:
    """`labels` with the upgrade machine's label writes applied: its enrolment step (a
    GPU node getting the ClusterPolicy's driver, no driver pod yet), then its step for
    the node whose driver pod is current, each under the controller's own conditions."""
    policy = policy_view(spec)
    if not (policy.auto_upgrade and c.is_gpu_node(labels)):
        return labels
    if labels.get(DEPLOY_DRIVER_LABEL) != TRUE:
        return labels  # a VM host (sandbox workloads): no driver pod, nothing to upgrade
    enrols = labels.get(DEPLOY_DRIVER_LABEL) == TRUE and OWNER_LABEL not in labels
    if enrols and not spec.driver.use_nvidia_driver_crd:
        enrolling = NodeUpgradeView(name=name, now=0.0, labels=labels, enrolling=True)
        labels = _apply(labels, next_step(enrolling, policy).labels)
    pod = DriverPodView(uid="driver-pod", revision_hash="newest", running=True, ready=True)
    current = NodeUpgradeView(
        name=name, now=0.0, labels=labels, driver_pod=pod, newest_revision="newest"
    )
    return _apply(labels, next_step(current, policy).labels)


def _apply(labels: Mapping[str, str], patch: Mapping[str, str | None]) -> dict[str, str]:
    result = dict(labels)
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = value
    return result


def ours(
    spec: crd.ClusterPolicySpec, node_labels: Mapping[str, Mapping[str, str]] | None = None
) -> tuple[list[dict[str, Any]], dict[str, dict[str, str]]]:
    """Our objects and our GPU nodes' `nvidia.com/*` labels for this policy, on nodes
    labelled with `node_labels` first."""
    nodes = labelled_nodes(spec, node_labels)
    gpu = [n for n in nodes if c.is_gpu_node(n["metadata"]["labels"])]
    ctx = c.RenderContext(
        namespace=NAMESPACE,
        operator_image=OPERATOR_IMAGE,
        mig_capable=c.any_mig_capable(n["metadata"]["labels"] for n in gpu),
        # As on the recording cluster, which had no Prometheus Operator CRDs: upstream
        # created no ServiceMonitor/PrometheusRule there (see upstream/README.md).
        service_monitor_crd=False,
        prometheus_rule_crd=False,
        gpu_nodes=tuple(c.node_facts(n) for n in gpu),
    )
    # As the controller applies them (`gpuop.controller._cluster`): owned by the policy,
    # with our content hash.
    owner = owner_reference("nvidia.com/v1", "ClusterPolicy", {"name": POLICY, "uid": "-"})
    objects = [
        c.with_hash(owned_by(o, owner))
        for objs in c.desired_objects(spec, ctx).values()
        for o in objs
    ]
    return objects, _gpu_node_labels(nodes)


def _gpu_node_labels(nodes: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """`nvidia.com/*` labels of every node that has any (upstream's data lists the GPU
    nodes; a CPU node we labelled shows up as a node upstream does not have)."""
    result = {}
    for n in nodes:
        ours = {k: v for k, v in n["metadata"]["labels"].items() if k.startswith("nvidia.com/")}
        if ours or c.is_gpu_node(n["metadata"]["labels"]):
            result[n["metadata"]["name"]] = ours
    return result


def upstream(folder: Path) -> tuple[list[dict[str, Any]], dict[str, dict[str, str]]]:
    docs = [d for d in yaml.safe_load_all((folder / "rendered.yaml").read_text()) if d]
    labels = next((d["nodes"] for d in docs if d.get("kind") == "NodeLabels"), {})
    return [d for d in docs if d.get("kind") != "NodeLabels"], labels


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

SERVER_ANNOTATIONS = ("deprecated.daemonset.template.generation",)
"""Annotations the DaemonSet controller writes on every object it stores."""

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
                empty = {} if isinstance(a.get(key, b.get(key)), dict) else []
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
    ours_only, theirs_only = [], []
    matcher = difflib.SequenceMatcher(a=a.splitlines(), b=b.splitlines(), autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            ours_only += matcher.a[i1:i2]
            theirs_only += matcher.b[j1:j2]
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


def compare(folder: Path) -> list[Difference]:
    """Every difference between our rendering and upstream's for one scenario."""
    name = folder.name
    spec, diffs = load_policy(folder)
    our_objects, our_labels = ours(spec, load_node_labels(folder))
    their_objects, their_labels = upstream(folder)
    mine = {_key(o): o for o in our_objects}
    theirs = {_key(o): o for o in their_objects}
    for key in dict.fromkeys([*theirs, *mine]):
        if key not in theirs:
            diffs.append(Difference(name, key, "", "present", ABSENT))
        elif key not in mine:
            diffs.append(Difference(name, key, "", ABSENT, "present"))
        else:
            a, b = normalize(mine[key]), normalize(theirs[key])
            diffs += [Difference(name, key, p, x, y) for p, x, y in _walk("", "", a, b)]
    for node in sorted({*our_labels, *their_labels}):
        for p, x, y in _walk("", "", our_labels.get(node, {}), their_labels.get(node, {})):
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
    allowed, unexplained = [], []
    for diff in diffs:
        (allowed if any(e.matches(diff) for e in entries) else unexplained).append(diff)
    return allowed, unexplained


def stale(diffs: Iterable[Difference], allowlist: Iterable[Allowed]) -> list[Allowed]:
    """Allowlist entries that explain no difference any more."""
    all_diffs = list(diffs)
    return [e for e in allowlist if not any(e.matches(d) for d in all_diffs)]
