"""What `gpuop upgrade status` reports, and the node facts `gpuop upgrade plan` shares:
pure data over a snapshot.

The CLI reads nodes, pods, PodDisruptionBudgets, the driver DaemonSet and the policy,
and hands them here as plain objects. The same rules the operator acts by decide what
the reports say: the budget (`budget`), kubectl drain's pod verdicts (`eviction`), the
restart-only guard's digest comparison and the rollout gate's record, so a plan never
promises what the operator would not do. The plan is `statemachine.fleet_plan`; how the
CLI prints both lives in `gpuop.upgrades_cli._render`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from statemachine.budget import BudgetNode, select_nodes
from statemachine.eviction import RemovalRules, gpu_workload, plan_removal, pod_key
from statemachine.upgrade_keys import (
    REASON_ANNOTATION,
    STATE_LABEL,
    STATE_SINCE_ANNOTATION,
    UpgradeState,
    parse_state,
    skipped,
)
from statemachine.upgrade_views import UpgradePolicyView, parse_time

Obj = Mapping[str, Any]
S = UpgradeState


# --- label selectors and PodDisruptionBudgets -------------------------------------------


def selector_matches(selector: Obj | None, labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector against labels; an empty selector matches everything,
    a missing one nothing (as the disruption controller reads PDB selectors)."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        present = key in labels
        if op == "In" and (not present or labels[key] not in values):
            return False
        if op == "NotIn" and present and labels[key] in values:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
    return True


def _meta(obj: Obj) -> Obj:
    meta: Obj = obj.get("metadata") or {}
    return meta


def blocking_pdbs(pod: Obj, pdbs: Iterable[Obj]) -> list[str]:
    """`namespace/name` of each PDB covering `pod` that allows no disruption now."""
    meta = _meta(pod)
    labels = meta.get("labels") or {}
    found = []
    for pdb in pdbs:
        pmeta = _meta(pdb)
        if pmeta.get("namespace") != meta.get("namespace"):
            continue
        if not selector_matches((pdb.get("spec") or {}).get("selector"), labels):
            continue
        if int((pdb.get("status") or {}).get("disruptionsAllowed", 0)) <= 0:
            found.append(f"{pmeta.get('namespace')}/{pmeta.get('name')}")
    return sorted(found)


# --- one node -----------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeFacts:
    """One GPU node with what the reports need of its pods (the CLI gathers these)."""

    node: Obj
    driver_pod: Obj | None = None
    driver_revision: str | None = None
    driver_digest: str = ""
    pods: tuple[Obj, ...] = ()
    """Every pod on the node (for drain verdicts and PDBs)."""
    validator_ready: bool = False
    target: str | None = None
    """The newest revision of the node's own driver DaemonSet (precompiled drivers have
    one per kernel); None: the report's target."""
    template_digest: str = ""
    """That DaemonSet's install digest; "": the report's."""

    @property
    def name(self) -> str:
        return str(_meta(self.node).get("name", ""))

    @property
    def labels(self) -> Mapping[str, str]:
        labels: Mapping[str, str] = _meta(self.node).get("labels") or {}
        return labels

    @property
    def annotations(self) -> Mapping[str, str]:
        annotations: Mapping[str, str] = _meta(self.node).get("annotations") or {}
        return annotations

    @property
    def state(self) -> UpgradeState:
        return parse_state(self.labels.get(STATE_LABEL))

    @property
    def ready(self) -> bool:
        conditions = (self.node.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    @property
    def unschedulable(self) -> bool:
        return bool((self.node.get("spec") or {}).get("unschedulable"))

    @property
    def skip(self) -> bool:
        return skipped(self.labels)

    def budget_node(self) -> BudgetNode:
        return BudgetNode.from_node(self.node, lambda _: self.driver_pod is not None)


@dataclass(frozen=True)
class Rules:
    """The removal rules of the policy's pod-deletion and drain steps (built by the
    controller's own helpers, so the CLI and the operator judge pods alike)."""

    gpu_pods: RemovalRules | None
    drain: RemovalRules | None
    drain_selector: Mapping[str, str] = field(default_factory=dict)


def _pods_to_remove(facts: NodeFacts, rules: Rules, namespace: str) -> list[tuple[str, Obj]]:
    """(step, pod) for every pod emptying the node would touch, and the refusals."""
    pods = [p for p in facts.pods if _meta(p).get("namespace") != namespace]
    result: list[tuple[str, Obj]] = []
    if rules.gpu_pods is not None:
        result += [("pod deletion", p) for p in pods if gpu_workload(p)]
    if rules.drain is not None:
        result += [("drain", p) for p in pods]
    return result


def removal_blockers(
    facts: NodeFacts, rules: Rules, pdbs: Sequence[Obj], namespace: str
) -> list[str]:
    """Pods the drain rules refuse, and pods a PDB allowing 0 disruptions protects."""
    problems: list[str] = []
    seen: set[str] = set()
    steps: dict[str, list[Obj]] = {}
    for step, pod in _pods_to_remove(facts, rules, namespace):
        steps.setdefault(step, []).append(pod)
    for step, pods in steps.items():
        step_rules = rules.gpu_pods if step == "pod deletion" else rules.drain
        assert step_rules is not None
        plan = plan_removal(pods, step_rules)
        for key, why in plan.refused:
            if key not in seen:
                problems.append(f"{step} refuses {key}: {why}")
                seen.add(key)
        by_key = {pod_key(p): p for p in pods}
        for key in plan.evict:
            for pdb in blocking_pdbs(by_key[key], pdbs):
                text = f"PDB {pdb} allows 0 disruptions: {key} cannot be evicted"
                if text not in seen:
                    problems.append(text)
                    seen.add(text)
    return problems


# --- status -------------------------------------------------------------------------------


@dataclass(frozen=True)
class StatusRow:
    node: str
    state: str
    since_seconds: float | None
    current: str
    target: str
    waits_for: str


@dataclass(frozen=True)
class StatusReport:
    rows: tuple[StatusRow, ...]
    totals: Mapping[str, int]
    in_progress: int
    max_parallel: int
    unavailable: int
    max_unavailable: int
    gate: str = ""
    held: Mapping[str, str] = field(default_factory=dict)
    nvd_gates: Mapping[str, str] = field(default_factory=dict)
    """Each NVIDIADriver's own rollout gate (canary, halt), by name."""

    @property
    def failed(self) -> tuple[str, ...]:
        return tuple(r.node for r in self.rows if r.state == S.UPGRADE_FAILED.value)


def _waits_for(
    facts: NodeFacts,
    policy: UpgradePolicyView,
    rules: Rules,
    pdbs: Sequence[Obj],
    namespace: str,
    blocked: Mapping[str, str],
) -> str:
    state = facts.state
    if state is S.UPGRADE_REQUIRED:
        if facts.name in blocked:
            return blocked[facts.name]
        return "skip label set" if facts.skip else "an upgrade slot"
    if state is S.CORDON_REQUIRED:
        return "cordon"
    if state is S.WAIT_FOR_JOBS_REQUIRED:
        return f"job pods matching {policy.wait_for_completion.pod_selector!r} to finish"
    if state in (S.POD_DELETION_REQUIRED, S.DRAIN_REQUIRED):
        only = Rules(
            rules.gpu_pods if state is S.POD_DELETION_REQUIRED else None,
            rules.drain if state is S.DRAIN_REQUIRED else None,
        )
        problems = removal_blockers(facts, only, pdbs, namespace)
        left = [pod_key(p) for _, p in _pods_to_remove(facts, only, namespace)]
        if problems:
            return "; ".join(problems)
        return f"pods to leave: {', '.join(sorted(set(left)))}" if left else "pods to leave"
    if state is S.POD_RESTART_REQUIRED:
        pod = facts.driver_pod
        name = _meta(pod).get("name") if pod is not None else None
        return f"new driver pod Ready (now {name or 'none'})"
    if state is S.VALIDATION_REQUIRED:
        return "validator pod Ready"
    if state is S.UNCORDON_REQUIRED:
        return "uncordon"
    if state is S.UPGRADE_FAILED:
        return facts.annotations.get(REASON_ANNOTATION, "failed")
    return ""


def status_report(
    nodes: Sequence[NodeFacts],
    policy: UpgradePolicyView,
    rules: Rules,
    pdbs: Sequence[Obj],
    target: str | None,
    *,
    namespace: str,
    now: float,
    gate: str = "",
    held: Mapping[str, str] | None = None,
    nvd_gates: Mapping[str, str] | None = None,
) -> StatusReport:
    """Per node its state, for how long, driver revision current/target and what it
    waits for; totals per state and the budget, as the operator counts it."""
    fleet = sorted(nodes, key=lambda f: f.name)
    selection = select_nodes(
        [f.budget_node() for f in fleet],
        max_parallel_upgrades=policy.max_parallel_upgrades,
        max_unavailable=policy.max_unavailable,
        held=held,
    )
    rows = []
    for f in fleet:
        since = parse_time(f.annotations.get(STATE_SINCE_ANNOTATION))
        rows.append(
            StatusRow(
                node=f.name,
                state=f.state.value,
                since_seconds=None if since is None else max(0.0, now - since),
                current=f.driver_revision or "-",
                target=f.target or target or "-",
                waits_for=_waits_for(f, policy, rules, pdbs, namespace, selection.blocked),
            )
        )
    return StatusReport(
        rows=tuple(rows),
        totals=dict(sorted(Counter(r.state for r in rows).items())),
        in_progress=selection.in_progress,
        max_parallel=policy.max_parallel_upgrades,
        unavailable=selection.in_progress + selection.unavailable,
        max_unavailable=selection.max_unavailable,
        gate=gate,
        held=dict(held or {}),
        nvd_gates=dict(sorted((nvd_gates or {}).items())),
    )
