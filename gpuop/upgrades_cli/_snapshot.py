"""Reading the cluster for the upgrade reports: one snapshot from lists or watch caches."""

from __future__ import annotations

import copy
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml
from kubernetes_asyncio.client.exceptions import ApiException

from components.driver import DAEMONSET_NAME as DRIVER_DS
from components.driver import DriverPool, digest_in, pool_for, rollout_key
from components.labels import is_gpu_node
from components.nvidiadriver import policy_for
from crd import (
    NVD_API_VERSION,
    NVD_KIND,
    OWNER_LABEL,
    ClusterPolicySpec,
    NVIDIADriver,
    parse_nvidiadriver,
    parse_policy,
)
from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Rest
from gpuop.operator.controller import (
    drain_rules,
    gate_policy,
    gpu_pod_rules,
    is_policy_driver,
    newest_revision,
    nvd_owner,
    policy_view,
)
from gpuop.upgrades_cli._preflight import pool_holds, preflight_held
from gpuop.upgrades_cli._windows import owner_windows
from statemachine.driver_owner import NEXT_OWNER_LABEL
from statemachine.fleet_report import NodeFacts, Rules
from statemachine.rollout_gate import (
    RECORD_ANNOTATION,
    GateNode,
    GatePhase,
    GatePolicy,
    GateRecord,
    gate_resource,
    phase_of,
    plan_gate,
)
from statemachine.upgrade_keys import DRIVER_REVISION_LABEL, FAILED_REVISION_ANNOTATION
from statemachine.upgrade_views import UpgradePolicyView

Obj = dict[str, Any]
NODE = by_kind("v1", "Node")
POD = by_kind("v1", "Pod")
PDB = by_kind("policy/v1", "PodDisruptionBudget")
DAEMONSET = by_kind("apps/v1", "DaemonSet")
REVISION = by_kind("apps/v1", "ControllerRevision")
POLICY = by_kind("nvidia.com/v1", "ClusterPolicy")
NVD = by_kind(NVD_API_VERSION, NVD_KIND)


class PlanError(ValueError):
    """The cluster or the proposal cannot be planned (no policy, a bad --set)."""


@dataclass
class Objects:
    """Raw objects, as listed or as a watch cache holds them."""

    nodes: list[Obj] = field(default_factory=list)
    pods: list[Obj] = field(default_factory=list)
    pdbs: list[Obj] = field(default_factory=list)
    daemonsets: list[Obj] = field(default_factory=list)
    revisions: list[Obj] = field(default_factory=list)
    policies: list[Obj] = field(default_factory=list)
    drivers: list[Obj] = field(default_factory=list)
    """NVIDIADrivers: each gates its own nodes' rollout (canary, halt)."""


async def list_objects(rest: Rest, namespace: str) -> Objects:
    try:
        drivers = await rest.list(NVD)
    except ApiException as err:
        if err.status != 404:  # no NVIDIADriver CRD: no NVIDIADrivers
            raise
        drivers = []
    return Objects(
        nodes=await rest.list(NODE),
        pods=await rest.list(POD),
        pdbs=await rest.list(PDB),
        daemonsets=await rest.list(DAEMONSET, namespace),
        revisions=await rest.list(REVISION, namespace),
        policies=await rest.list(POLICY),
        drivers=drivers,
    )


def apply_sets(raw: Obj, sets: Sequence[str]) -> Obj:
    """The policy with ``path.to.field=value`` changes under ``spec`` (values as YAML)."""
    changed = copy.deepcopy(raw)
    for item in sets:
        path, sep, value = item.partition("=")
        if not sep or not path:
            raise PlanError(f"--set wants path=value, got {item!r}")
        target = changed.setdefault("spec", {})
        keys = path.split(".")
        for key in keys[:-1]:
            target = target.setdefault(key, {})
            if not isinstance(target, dict):
                raise PlanError(f"--set {path}: {key} is not an object")
        try:
            target[keys[-1]] = yaml.safe_load(value) if value else ""
        except yaml.YAMLError as err:
            problem = getattr(err, "problem", None) or "not valid YAML"
            raise PlanError(f"--set {path}: {value!r} is not a YAML value ({problem})") from None
    return changed


@dataclass(frozen=True)
class Snapshot:
    """Everything a report needs, parsed."""

    spec: ClusterPolicySpec
    policy: UpgradePolicyView
    rules: Rules
    nodes: tuple[NodeFacts, ...]
    pdbs: tuple[Obj, ...]
    target: str | None
    template_digest: str
    gate: str
    namespace: str
    held: Mapping[str, str] = field(default_factory=dict)
    nvd_gates: Mapping[str, str] = field(default_factory=dict)
    """Per NVIDIADriver with a canary or halt: its gate's phase and message."""
    owners: Mapping[str, str] = field(default_factory=dict)
    """GPU node -> the NVIDIADriver whose budget and gate it is under (absent: the
    ClusterPolicy's)."""
    nvd_specs: Mapping[str, ClusterPolicySpec] = field(default_factory=dict)
    """Per NVIDIADriver: the policy its own upgradePolicy makes."""
    windows: Mapping[str | None, Mapping[str, object]] = field(default_factory=dict)
    """Per owner (None: the ClusterPolicy) with maintenance windows: where they stand."""
    policy_name: str = ""
    preflight: Mapping[str, str] = field(default_factory=dict)
    """Driver DaemonSet -> why the operator's upgrade pre-flight holds its pool."""


def _active(policies: Iterable[Obj]) -> Obj | None:
    ordered = sorted(
        policies,
        key=lambda p: (p["metadata"].get("creationTimestamp", ""), p["metadata"]["name"]),
    )
    return ordered[0] if ordered else None


def snapshot(
    objects: Objects, namespace: str, sets: Sequence[str] = (), now: float | None = None
) -> Snapshot:
    raw = _active(objects.policies)
    if raw is None:
        raise PlanError("no ClusterPolicy in the cluster")
    if sets:
        raw = apply_sets(raw, sets)
    model, problems = parse_policy(raw)
    if model is None or problems:
        raise PlanError(
            "invalid ClusterPolicy: " + "; ".join(f"{p.path}: {p.message}" for p in problems)
        )
    spec = model.spec
    view = policy_view(spec)
    by_node: dict[str, list[Obj]] = {}
    for pod in objects.pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if node:
            by_node.setdefault(node, []).append(pod)
    # The policy's driver DaemonSets: one, or one per kernel for a precompiled driver.
    daemonsets = {
        d["metadata"]["name"]: d
        for d in objects.daemonsets
        if is_policy_driver(d["metadata"]["name"])
        and nvd_owner(d) is None
        and not d["metadata"].get("deletionTimestamp")
    }
    pools = [
        DriverPool(
            name,
            _template(ds).get("nodeSelector") or {},
            ds["metadata"].get("creationTimestamp") or "",
        )
        for name, ds in daemonsets.items()
    ]
    # Each NVIDIADriver's driver DaemonSets (one per pool): its nodes run these.
    nvd_daemonsets = {
        d["metadata"]["name"]: d
        for d in objects.daemonsets
        if nvd_owner(d) is not None and not d["metadata"].get("deletionTimestamp")
    }
    targets = {
        name: newest_revision(ds, objects.revisions)
        for name, ds in {**daemonsets, **nvd_daemonsets}.items()
    }
    facts = []
    owners: dict[str, str] = {}
    apps: dict[str, str] = {}  # GPU node -> its driver DaemonSet
    for node in objects.nodes:
        node_labels = node["metadata"].get("labels") or {}
        if not is_gpu_node(node_labels):
            continue
        owner = node_labels.get(OWNER_LABEL)
        # The gate a node is under: the NVIDIADriver it moves to, else its owner's.
        gated_by = node_labels.get(NEXT_OWNER_LABEL) or owner
        if gated_by:
            owners[node["metadata"]["name"]] = gated_by
        if owner:
            app = _nvd_app(node_labels, owner, nvd_daemonsets)
        else:
            app = pool_for(node_labels, pools) or DRIVER_DS
        apps[node["metadata"]["name"]] = app
        pods = by_node.get(node["metadata"]["name"], [])
        drivers = [
            p
            for p in pods
            if p["metadata"].get("namespace") == namespace
            and (p["metadata"].get("labels") or {}).get("app") == app
            and not p["metadata"].get("deletionTimestamp")
        ]
        driver = max(
            drivers, key=lambda p: p["metadata"].get("creationTimestamp", ""), default=None
        )
        facts.append(
            NodeFacts(
                node=node,
                driver_pod=driver,
                driver_revision=(driver["metadata"].get("labels") or {}).get(DRIVER_REVISION_LABEL)
                if driver
                else None,
                driver_digest=digest_in(driver.get("spec") or {}) if driver else "",
                pods=tuple(pods),
                validator_ready=False,
                target=targets.get(app),
                template_digest=_digest(daemonsets.get(app) or nvd_daemonsets.get(app)),
            )
        )
    now = time.time() if now is None else now
    target = ",".join(sorted(t for n, t in targets.items() if t and n in daemonsets)) or None
    digest = rollout_key(
        (_template(d).get("nodeSelector") or {}, _template(d)) for d in daemonsets.values()
    )
    # What the operator's gates hold back now (computed the same way, nothing written):
    # the ClusterPolicy's over its nodes, each NVIDIADriver's over its own.
    gated: dict[str | None, tuple[Obj, GatePolicy, list[Obj]]] = {
        None: (raw, gate_policy(spec), list(daemonsets.values()))
    }
    nvds: dict[str, NVIDIADriver] = {}
    for driver in objects.drivers:
        nvd = _nvd_or_none(driver)
        if nvd is not None:
            nvds[nvd.name] = nvd
            mine = [d for d in nvd_daemonsets.values() if nvd_owner(d) == nvd.name]
            gated[nvd.name] = (driver, gate_policy(policy_for(nvd.spec, spec)), mine)
    held: dict[str, str] = {}
    gate_text = ""
    nvd_gates: dict[str, str] = {}
    for owner, (carrier, gate, owned_ds) in gated.items():
        annotations = carrier["metadata"].get("annotations") or {}
        record = GateRecord.loads(annotations.get(RECORD_ANNOTATION))
        phase = phase_of(record, gate, now)
        if owner is None:
            owner_target, owner_digest = target, digest
        else:
            names = {d["metadata"]["name"] for d in owned_ds}
            owner_target = ",".join(sorted(t for n, t in targets.items() if t and n in names))
            owner_digest = rollout_key(
                (_template(d).get("nodeSelector") or {}, _template(d)) for d in owned_ds
            )
        held.update(
            plan_gate(
                gate,
                [_gate_node(f) for f in facts if owners.get(f.name) == owner],
                owner_target or None,
                record,
                now=now,
                digest=owner_digest,
                resource=gate_resource(owner),
            ).held
        )
        text = "" if phase is GatePhase.OFF else phase.value
        for cond in (carrier.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "DriverUpgradeGate" and cond.get("message"):
                text = f"{phase.value}: {cond['message']}"
        if owner is None:
            gate_text = text
        elif text:
            nvd_gates[owner] = text
    # The maintenance windows each owner's resource declares, as the operator reads them.
    windows, window_held = owner_windows(
        {o: c for o, (c, _, _) in gated.items()}, facts, owners, now
    )
    held.update(window_held)
    preflight = pool_holds({**daemonsets, **nvd_daemonsets}.values())
    held.update(preflight_held(preflight, apps, facts))
    rules = Rules(
        gpu_pods=gpu_pod_rules(view) if view.pod_deletion is not None else None,
        drain=drain_rules(view) if view.drain.enable else None,
    )
    return Snapshot(
        spec=spec,
        policy=view,
        rules=rules,
        nodes=tuple(facts),
        pdbs=tuple(objects.pdbs),
        target=target,
        template_digest=digest,
        gate=gate_text,
        namespace=namespace,
        held=held,
        nvd_gates=nvd_gates,
        owners=owners,
        nvd_specs={o: policy_for(nvd.spec, spec) for o, nvd in nvds.items()},
        windows=windows,
        policy_name=raw["metadata"]["name"],
        preflight=preflight,
    )


def _gate_node(f: NodeFacts) -> GateNode:
    return GateNode(
        name=f.name,
        state=f.state,
        revision=f.driver_revision,
        target=f.target,
        failed_revision=f.annotations.get(FAILED_REVISION_ANNOTATION),
        unschedulable=f.unschedulable,
        ready=f.ready,
        skip=f.skip,
    )


def _nvd_or_none(raw: Obj) -> NVIDIADriver | None:
    if raw["metadata"].get("deletionTimestamp"):
        return None
    try:
        return parse_nvidiadriver(raw)
    except ValueError:
        return None


def _nvd_app(node_labels: Mapping[str, str], owner: str, daemonsets: Mapping[str, Obj]) -> str:
    """The NVIDIADriver ``owner``'s driver DaemonSet whose pool selects the node."""
    for name, ds in sorted(daemonsets.items()):
        if nvd_owner(ds) != owner:
            continue
        selector = _template(ds).get("nodeSelector") or {}
        if all(node_labels.get(k) == v for k, v in selector.items()):
            return name
    return ""


def _digest(ds: Obj | None) -> str:
    return digest_in(_template(ds)) if ds is not None else ""


def _template(ds: Obj) -> Obj:
    """A DaemonSet's pod template spec."""
    spec: Obj = ((ds.get("spec") or {}).get("template") or {}).get("spec") or {}
    return spec
