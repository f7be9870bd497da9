"""Differential conformance: what our components render for a scenario's policy on the
simulated nodes, against what NVIDIA's operator v26.7 created for it (`rendered.yaml`).

Pure: the nodes are built from `gpuop.cluster._nodes` (the same 6 nodes `gpuop cluster up
--nodes 6 --gpu-nodes 4` makes), the policy is parsed with our models, and rendering and
labelling run as the controller runs them, without a cluster. Only fields that decide
what happens on a node are compared (see `normalize`); server defaults and our own
bookkeeping labels/annotations are not.
"""

from __future__ import annotations

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
from gpuop.cluster._nodes import node_manifests
from statemachine.upgrade_keys import STATE_LABEL, UpgradeState

REPO = Path(__file__).resolve().parents[2]
ALLOWLIST = Path(__file__).resolve().parent / "allowlist.yaml"
NAMESPACE = "gpu-operator"
OPERATOR_IMAGE = "ghcr.io/gpuop/gpuop:latest"
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


def simulated_nodes() -> list[dict[str, Any]]:
    return node_manifests(NODES, GPU_NODES)


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


def labelled_nodes(spec: crd.ClusterPolicySpec) -> list[dict[str, Any]]:
    """The simulated nodes after our labeller reached its fixed point, with the upgrade
    state our upgrade machine gives a node whose driver pod is current."""
    result = []
    for node in simulated_nodes():
        labels = dict(node["metadata"]["labels"])
        for _ in range(5):
            changes = c.node_label_changes(labels, spec)
            if not changes:
                break
            labels = c.apply_label_changes(labels, changes)
        else:  # pragma: no cover - the labeller is a fixed point by its own tests
            raise AssertionError(f"labels of {node['metadata']['name']} never settle")
        if (
            c.is_gpu_node(labels)
            and spec.driver.enabled
            and spec.driver.upgrade_policy.auto_upgrade
        ):
            labels[STATE_LABEL] = UpgradeState.UPGRADE_DONE.value
        result.append({**node, "metadata": {**node["metadata"], "labels": labels}})
    return result


def ours(spec: crd.ClusterPolicySpec) -> tuple[list[dict[str, Any]], dict[str, dict[str, str]]]:
    """Our objects and our GPU nodes' `nvidia.com/*` labels for this policy."""
    nodes = labelled_nodes(spec)
    gpu = [n for n in nodes if c.is_gpu_node(n["metadata"]["labels"])]
    ctx = c.RenderContext(
        namespace=NAMESPACE,
        operator_image=OPERATOR_IMAGE,
        mig_capable=c.any_mig_capable(n["metadata"]["labels"] for n in gpu),
        service_monitor_crd=False,
        prometheus_rule_crd=False,
        gpu_nodes=tuple(c.node_facts(n) for n in gpu),
    )
    objects = [o for objs in c.desired_objects(spec, ctx).values() for o in objs]
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


def _env(container: Mapping[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for var in container.get("env") or ():
        source = var.get("valueFrom")
        if source and "fieldRef" in source:
            result[var["name"]] = f"fieldRef:{source['fieldRef']['fieldPath']}"
        elif source:
            result[var["name"]] = {k: v for k, v in source.items()}
        else:
            result[var["name"]] = str(var.get("value", ""))
    return result


def _volume_source(volume: Mapping[str, Any] | None) -> str:
    if volume is None:
        return "<no volume>"
    if "hostPath" in volume:
        return f"hostPath:{volume['hostPath']['path']}"
    if "configMap" in volume:
        items = volume["configMap"].get("items")
        suffix = f" items={_text(items)}" if items else ""
        return f"configMap:{volume['configMap']['name']}{suffix}"
    if "emptyDir" in volume:
        return "emptyDir"
    return _text({k: v for k, v in volume.items() if k != "name"})


def _mounts(container: Mapping[str, Any], volumes: Mapping[str, Any]) -> dict[str, str]:
    result = {}
    for m in container.get("volumeMounts") or ():
        parts = [_volume_source(volumes.get(m["name"]))]
        if m.get("subPath"):
            parts.append(f"subPath={m['subPath']}")
        if m.get("readOnly"):
            parts.append("ro")
        if m.get("mountPropagation") and m["mountPropagation"] != "None":
            parts.append(m["mountPropagation"])
        result[m["mountPath"].rstrip("/") or "/"] = " ".join(parts)
    return result


def _container(container: Mapping[str, Any], volumes: Mapping[str, Any]) -> dict[str, Any]:
    security = container.get("securityContext") or {}
    return {
        "image": container.get("image"),
        "command": _text(container.get("command")),
        "args": _text(container.get("args")),
        "env": _env(container),
        "volumeMounts": _mounts(container, volumes),
        "privileged": bool(security.get("privileged", False)),
        "runAsUser": security.get("runAsUser"),
    }


def _strategy(strategy: Mapping[str, Any] | None) -> str:
    strategy = strategy or {"type": "RollingUpdate"}
    if strategy.get("type", "RollingUpdate") != "RollingUpdate":
        return str(strategy["type"])
    rolling = strategy.get("rollingUpdate") or {}
    return f"RollingUpdate maxUnavailable={rolling.get('maxUnavailable', 1)}"


def _daemonset(obj: Mapping[str, Any]) -> dict[str, Any]:
    pod = obj["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod.get("volumes") or ()}
    fields: dict[str, Any] = {
        "nodeSelector": dict(pod.get("nodeSelector") or {}),
        "tolerations": sorted(_text(t) for t in pod.get("tolerations") or ()),
        "serviceAccountName": pod.get("serviceAccountName"),
        "hostPID": bool(pod.get("hostPID")),
        "hostIPC": bool(pod.get("hostIPC")),
        "hostNetwork": bool(pod.get("hostNetwork")),
        "priorityClassName": pod.get("priorityClassName"),
        "runtimeClassName": pod.get("runtimeClassName"),
        "updateStrategy": _strategy(obj["spec"].get("updateStrategy")),
    }
    for kind in ("initContainers", "containers"):
        fields[kind] = {ct["name"]: _container(ct, volumes) for ct in pod.get(kind) or ()}
    return fields


def _rules(obj: Mapping[str, Any]) -> list[str]:
    triples = set()
    for rule in obj.get("rules") or ():
        names = ",".join(rule.get("resourceNames") or ())
        for group in rule.get("apiGroups") or ("",):
            for resource in rule.get("resources") or ():
                for verb in rule.get("verbs") or ():
                    suffix = f"[{names}]" if names else ""
                    triples.add(f"{group or 'core'}/{resource}{suffix}:{verb}")
    return sorted(triples)


def _config_map(obj: Mapping[str, Any]) -> dict[str, Any]:
    data = {}
    for key, value in (obj.get("data") or {}).items():
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError:
            parsed = None
        # Structured data (MIG layouts, GPU clients) is compared; scripts are ours to
        # write, only their presence counts.
        data[key] = parsed if isinstance(parsed, dict) else "<script>"
    return {"data": data}


def _port(port: Mapping[str, Any]) -> str:
    target = port.get("targetPort", port["port"])
    return f"{port.get('name')}:{port['port']}->{target}/{port.get('protocol', 'TCP')}"


def normalize(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The fields compared for one object, by kind."""
    kind = obj["kind"]
    if kind == "DaemonSet":
        return _daemonset(obj)
    if kind in ("Role", "ClusterRole"):
        return {"rules": _rules(obj)}
    if kind in ("RoleBinding", "ClusterRoleBinding"):
        return {
            "roleRef": f"{obj['roleRef']['kind']}/{obj['roleRef']['name']}",
            "subjects": sorted(
                f"{s['kind']}/{s.get('namespace', '')}/{s['name']}"
                for s in obj.get("subjects") or ()
            ),
        }
    if kind == "ConfigMap":
        return _config_map(obj)
    if kind == "Service":
        spec = obj["spec"]
        return {
            "selector": dict(spec.get("selector") or {}),
            "ports": sorted(_port(p) for p in spec.get("ports") or ()),
        }
    if kind == "RuntimeClass":
        return {"handler": obj.get("handler")}
    return {}


# ---------------------------------------------------------------- diff


def _walk(path: str, a: Any, b: Any) -> Iterator[tuple[str, str, str]]:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in list(dict.fromkeys([*a, *b])):
            sub = f"{path}.{key}" if path else str(key)
            if key in a and key not in b:
                yield sub, _text(a[key]), ABSENT
            elif key in b and key not in a:
                yield sub, ABSENT, _text(b[key])
            else:
                yield from _walk(sub, a[key], b[key])
    elif isinstance(a, list) and isinstance(b, list) and all(isinstance(x, str) for x in a + b):
        missing, extra = sorted(set(b) - set(a)), sorted(set(a) - set(b))
        for item in extra:
            yield f"{path}[{item}]", "present", ABSENT
        for item in missing:
            yield f"{path}[{item}]", ABSENT, "present"
    elif a != b:
        yield path, _text(a), _text(b)


def _container_paths(fields: dict[str, Any]) -> dict[str, Any]:
    """`initContainers.<name>` becomes `initContainers[<name>]` for readable paths."""
    out = {k: v for k, v in fields.items() if k not in ("initContainers", "containers")}
    for kind in ("initContainers", "containers"):
        for name, ct in fields.get(kind, {}).items():
            out[f"{kind}[{name}]"] = ct
    return out


def compare(folder: Path) -> list[Difference]:
    """Every difference between our rendering and upstream's for one scenario."""
    name = folder.name
    spec, diffs = load_policy(folder)
    our_objects, our_labels = ours(spec)
    their_objects, their_labels = upstream(folder)
    mine = {_key(o): o for o in our_objects}
    theirs = {_key(o): o for o in their_objects if o["kind"] != "ServiceMonitor"}
    for key in dict.fromkeys([*theirs, *mine]):
        if key not in theirs:
            diffs.append(Difference(name, key, "", "present", ABSENT))
        elif key not in mine:
            diffs.append(Difference(name, key, "", ABSENT, "present"))
        else:
            a = _container_paths(normalize(mine[key]))
            b = _container_paths(normalize(theirs[key]))
            for kind in ("initContainers", "containers"):
                for ckey in [k for k in {**a, **b} if k.startswith(f"{kind}[")]:
                    if ckey not in b:
                        diffs.append(Difference(name, key, ckey, "present", ABSENT))
                        a.pop(ckey)
                    elif ckey not in a:
                        diffs.append(Difference(name, key, ckey, ABSENT, "present"))
                        b.pop(ckey)
            diffs += [Difference(name, key, p, x, y) for p, x, y in _walk("", a, b)]
    for node in sorted({*our_labels, *their_labels}):
        for p, x, y in _walk("", our_labels.get(node, {}), their_labels.get(node, {})):
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
