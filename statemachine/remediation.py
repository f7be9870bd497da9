"""GPU health remediation: which nodes to quarantine and release, and the circuit breaker.

Pure: the controller builds a :class:`FleetHealthView` from its caches (the node agent's
`GPUHealthy` condition, our taint and annotations, the policy's `RemediationPaused`
condition) and carries out the :class:`RemediationPlan`. Every input is cluster state,
so a restarted operator computes the same plan.

Safety limits, after the systems that remediate GPU fleets today:

- Circuit breaker (NVSentinel, EKS node repair, NodeHealthCheck ``minHealthy``): if
  quarantining every unhealthy node would put more than ``maxUnhealthy`` of the GPU
  nodes in quarantine, only the oldest failures up to the limit are quarantined and
  remediation pauses. While paused nothing more is quarantined (a mass failure usually
  means a systemic cause: a bad driver, a broken exporter), until an administrator
  resumes; releases of recovered nodes go on.
- Settle time: a node is released only after `GPUHealthy` has been True for
  ``settleSeconds``, so a flapping GPU stays out. Counted by the operator's clock from
  when it first saw the condition True, not from the condition's lastTransitionTime:
  the node agent stamps that with the GPU node's clock, and a node a year ahead would
  stay quarantined for a year (one behind, released at once). Kubernetes' node
  lifecycle controller does the same with the kubelet's Ready condition (it keeps its
  own observed transition time). The sighting is recorded on the node
  (`HEALTHY_SEEN_ANNOTATION`, with the lastTransitionTime it saw, which tells a later
  failure and recovery from the same healthy spell), so a restarted operator resumes
  the wait; it only lengthens the wait when a recovery went unrecorded while the
  operator was down (it is seen then, as in the node lifecycle controller).
- Driver upgrades own their nodes: a node in an upgrade is neither quarantined nor
  released here.
- One owner per cordon (`statemachine.cordon`): we lift only a cordon recorded as ours;
  releasing a node whose upgrade failed (or is under way) hands our cordon to the
  upgrade instead, so a node whose new driver failed validation stays out of service.
- Dry run: the plan is the same; the caller only reports it.
- Drain (action ``drain``): kubectl drain's rules with ``driver.upgradePolicy.drain``'s
  flags (force, deleteEmptyDir, podSelector), the ones upgrades use; remediation adds
  no flag of its own, so nothing is removed that the administrator's drain settings
  keep. A pod those rules refuse (an emptyDir without deleteEmptyDir) refuses the whole
  drain, as kubectl does, and the Event names it. The drain is owed until the node
  records it done (`DRAINED_ANNOTATION`): a PodDisruptionBudget's refusal or an
  operator restart between quarantine and drain only delays it.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# The taint is spelled with the other node keys; re-exported for the remediation shell.
from components.keys import TAINT_EFFECT as TAINT_EFFECT
from components.keys import TAINT_KEY as TAINT_KEY
from components.keys import TAINT_VALUE as TAINT_VALUE
from crd import ClusterPolicySpec

#: Node condition the node agent reports (True healthy, False a fault, Unknown no NVML).
CONDITION_GPU_HEALTHY = "GPUHealthy"
#: ClusterPolicy condition: True while the circuit breaker holds remediation.
CONDITION_REMEDIATION_PAUSED = "RemediationPaused"
REASON_CIRCUIT_BREAKER = "CircuitBreakerOpen"
REASON_RESUMED = "Resumed"
#: ClusterPolicy condition: True while remediation is on but nothing reports GPUHealthy
#: (set by the cluster pass with the policy's other spec-derived conditions).
CONDITION_REMEDIATION_BLIND = "RemediationBlind"
REASON_NODE_AGENT_DISABLED = "NodeStatusExporterDisabled"
BLIND_MESSAGE = (
    "healthRemediation.enabled is true but nodeStatusExporter.enabled is false: no node"
    " agent reports the GPUHealthy node condition, so no node is ever quarantined;"
    " enable nodeStatusExporter (it runs the node agent on every GPU node)"
)


# Our bookkeeping on the node: present exactly while we hold it in quarantine.
QUARANTINED_ANNOTATION = "gpuop.io/gpu-health-quarantined"
"""Why (the condition's reason and message) and, with it, that we quarantined the node."""
QUARANTINED_AT_ANNOTATION = "gpuop.io/gpu-health-quarantined-at"
CORDONED_ANNOTATION = "gpuop.io/gpu-health-cordoned"
"""Our cordon, as recorded before the shared owner record (`statemachine.cordon`): still
read as ours, removed on release, no longer written."""
ACTION_ANNOTATION = "gpuop.io/gpu-health-action"
DRAINED_ANNOTATION = "gpuop.io/gpu-health-drained"
"""When a drain found nothing left to remove; until then a `drain` quarantine owes one."""
HEALTHY_SEEN_ANNOTATION = "gpuop.io/gpu-health-healthy-seen"
"""On a quarantined node: when the operator first saw GPUHealthy True (its own clock),
then the condition's lastTransitionTime it saw (`seen_record`): the settle time's start."""
MANAGED_ANNOTATIONS = (
    QUARANTINED_ANNOTATION,
    QUARANTINED_AT_ANNOTATION,
    CORDONED_ANNOTATION,
    ACTION_ANNOTATION,
    DRAINED_ANNOTATION,
    HEALTHY_SEEN_ANNOTATION,
)
#: On the ClusterPolicy: an administrator resumes a paused remediation by setting it to
#: "true"; the operator removes it once used.
RESUME_ANNOTATION = "gpuop.io/health-remediation-resume"


def seen_record(seen_at: str, transition: str) -> str:
    """`HEALTHY_SEEN_ANNOTATION`'s value: the operator's time, then the condition's
    lastTransitionTime as the agent wrote it (empty when it wrote none)."""
    return f"{seen_at} {transition}".rstrip()


def seen_at(record: str | None, transition: str) -> str | None:
    """The operator's time in ``record`` when it was taken for this same transition;
    None when there is none, or it was for an earlier healthy spell (the GPUs failed
    and recovered since, perhaps between two passes: the lastTransitionTime moved)."""
    if not record:
        return None
    stamp, _, recorded = record.partition(" ")
    return stamp if recorded == transition else None


def resume_requested(annotations: Mapping[str, str]) -> bool:
    """Only the value "true" resumes: `...-resume=false` must not re-arm the breaker."""
    return annotations.get(RESUME_ANNOTATION) == "true"


_PERCENT = re.compile(r"^\s*(\d+)\s*%\s*$")


class Health(enum.StrEnum):
    """The `GPUHealthy` condition's status; UNKNOWN also when the node has none."""

    HEALTHY = "True"
    UNHEALTHY = "False"
    UNKNOWN = "Unknown"

    @classmethod
    def parse(cls, status: str | None) -> Health:
        return cls(status) if status in ("True", "False") else cls.UNKNOWN


class RemediationAction(enum.StrEnum):
    TAINT = "taint"
    CORDON = "cordon"
    DRAIN = "drain"


@dataclass(frozen=True)
class RemediationPolicyView:
    """`spec.healthRemediation`, with the off state for a missing section."""

    enabled: bool = False
    dry_run: bool = False
    action: RemediationAction = RemediationAction.TAINT
    max_unhealthy: int | str = "10%"
    settle_seconds: int = 300


@dataclass(frozen=True)
class HealthNodeView:
    """One node as remediation sees it (only nodes with GPUs matter)."""

    name: str
    health: Health = Health.UNKNOWN
    since: float | None = None
    """lastTransitionTime of `GPUHealthy` (epoch seconds, the node's clock: only orders
    failures, never times a wait); None when unknown."""
    healthy_seen: float | None = None
    """Healthy: when the operator first saw it so (its own clock, epoch seconds, from
    `HEALTHY_SEEN_ANNOTATION`); None when not recorded yet. The settle time's start."""
    reason: str = ""
    message: str = ""
    gpu: bool = True
    quarantined: bool = False
    """Carries our quarantine annotation."""
    cordoned_by_us: bool = False
    """The cordon's owner record names health remediation."""
    unschedulable: bool = False
    in_upgrade: bool = False
    upgrade_holds_cordon: bool = False
    """The node's driver upgrade is under way or failed: it needs the node cordoned."""
    drain_pending: bool = False
    """Quarantined with action drain, and no drain has found the node empty yet."""


@dataclass(frozen=True)
class FleetHealthView:
    nodes: tuple[HealthNodeView, ...]
    now: float
    paused: bool = False
    """RemediationPaused is True on the policy."""
    resume_requested: bool = False
    """The policy carries the resume annotation."""


@dataclass(frozen=True)
class Quarantine:
    node: str
    why: str
    """`<reason>: <message>` of the node's `GPUHealthy` condition."""
    cordon: bool
    """Cordon it too (cordon or drain, and the node is not already unschedulable)."""
    drain: bool


@dataclass(frozen=True)
class Release:
    node: str
    uncordon: bool
    """We cordoned it; an administrator's cordon stays."""
    why: str
    hand_over: bool = False
    """Our cordon goes to the driver upgrade, which still needs it: the node stays cordoned."""


def _release(node: HealthNodeView, why: str) -> Release:
    hand_over = node.cordoned_by_us and node.unschedulable and node.upgrade_holds_cordon
    return Release(node.name, node.cordoned_by_us and not hand_over, why, hand_over=hand_over)


@dataclass(frozen=True)
class RemediationPlan:
    quarantine: tuple[Quarantine, ...] = ()
    release: tuple[Release, ...] = ()
    held: tuple[str, ...] = ()
    """Unhealthy nodes left in service by the circuit breaker."""
    paused: bool = False
    """Whether remediation is paused after this pass (the condition to hold)."""
    tripped: bool = False
    """The breaker opened in this pass."""
    resumed: bool = False
    """An administrator's resume was taken in this pass."""
    limit: int = 0
    unhealthy: int = 0
    quarantined: int = 0
    """Nodes in quarantine after this plan is carried out."""
    gpu_nodes: int = 0
    requeue_after: float | None = None
    """Seconds until the earliest settle time ends (the caller adds drain retries)."""
    dry_run: bool = False
    drain: tuple[str, ...] = ()
    """Nodes quarantined earlier that still owe a drain (new quarantines say so themselves)."""
    observe: tuple[str, ...] = ()
    """Quarantined nodes seen healthy for the first time: record the view's ``now`` as
    their settle time's start (`HEALTHY_SEEN_ANNOTATION`)."""

    def pause_message(self, max_unhealthy: int | str) -> str:
        held = ", ".join(self.held[:10]) + (" ..." if len(self.held) > 10 else "")
        return (
            f"{self.unhealthy} of {self.gpu_nodes} GPU nodes report GPUHealthy=False; "
            f"maxUnhealthy {max_unhealthy} allows {self.limit} in quarantine, "
            f"{self.quarantined} are. Not quarantined: {held or 'none'}. "
            f"Resume: annotate the ClusterPolicy with {RESUME_ANNOTATION}=true"
        )


def resolve_max_unhealthy(value: int | str, gpu_nodes: int) -> int:
    """`maxUnhealthy` as a node count. Percentages round down: a safety limit never
    allows more than the share written (10% of 4 nodes is 0: use a count there)."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"maxUnhealthy must be an int or a percent string, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"maxUnhealthy must not be negative, got {value}")
        return value
    match = _PERCENT.match(value)
    if match is None:
        raise ValueError(f"maxUnhealthy must be an int or a percent like '10%', got {value!r}")
    return math.floor(int(match.group(1)) * max(gpu_nodes, 0) / 100)


def _why(node: HealthNodeView) -> str:
    text = f"{node.reason or 'Unhealthy'}: {node.message}" if node.message else node.reason
    return text or "GPUHealthy is False"


def plan_remediation(view: FleetHealthView, policy: RemediationPolicyView) -> RemediationPlan:
    """What to do now. Deterministic: the oldest failures (then names) go first."""
    nodes = sorted(view.nodes, key=lambda n: n.name)
    gpu_nodes = [n for n in nodes if n.gpu]
    if not policy.enabled:
        # Off (or the policy is gone): lift everything we hold, pause nothing.
        off = tuple(
            _release(n, "health remediation is off")
            for n in nodes
            if n.quarantined and not n.in_upgrade
        )
        return RemediationPlan(release=off, gpu_nodes=len(gpu_nodes))

    limit = resolve_max_unhealthy(policy.max_unhealthy, len(gpu_nodes))
    releases: list[Release] = []
    deadlines: list[float] = []
    observe: list[str] = []
    held_in_quarantine = 0
    for node in nodes:
        if not node.quarantined:
            continue
        if node.in_upgrade:
            held_in_quarantine += 1
            continue
        if not node.gpu:
            releases.append(_release(node, "no longer a GPU node"))
            continue
        if node.health is not Health.HEALTHY:
            held_in_quarantine += 1
            continue
        # The operator's clock, never the node's (see the module docstring).
        start = view.now if node.healthy_seen is None else node.healthy_seen
        settled_at = start + policy.settle_seconds
        if view.now >= settled_at:
            why = f"GPUHealthy True for {policy.settle_seconds}s or more"
            releases.append(_release(node, why))
        else:
            held_in_quarantine += 1
            deadlines.append(settled_at - view.now)
            if node.healthy_seen is None:
                observe.append(node.name)

    candidates = sorted(
        (
            n
            for n in gpu_nodes
            if n.health is Health.UNHEALTHY and not n.quarantined and not n.in_upgrade
        ),
        key=lambda n: (n.since if n.since is not None else view.now, n.name),
    )
    resumed = view.paused and view.resume_requested
    paused = view.paused and not resumed
    if paused:
        chosen, held = [], candidates
    else:
        room = max(0, limit - held_in_quarantine)
        chosen, held = candidates[:room], candidates[room:]
    tripped = not paused and bool(held)
    cordon = policy.action in (RemediationAction.CORDON, RemediationAction.DRAIN)
    quarantine = tuple(
        Quarantine(
            n.name,
            _why(n),
            cordon=cordon and not n.unschedulable,
            drain=policy.action is RemediationAction.DRAIN,
        )
        for n in chosen
    )
    released = {r.node for r in releases}
    owed = tuple(
        n.name
        for n in nodes
        if policy.action is RemediationAction.DRAIN
        and n.quarantined
        and n.drain_pending
        and not n.in_upgrade
        and n.name not in released
    )
    return RemediationPlan(
        quarantine=quarantine,
        drain=owed,
        observe=tuple(observe),
        release=tuple(releases),
        held=tuple(n.name for n in held),
        paused=paused or tripped,
        tripped=tripped,
        resumed=resumed,
        limit=limit,
        unhealthy=sum(1 for n in gpu_nodes if n.health is Health.UNHEALTHY),
        quarantined=held_in_quarantine + len(quarantine),
        gpu_nodes=len(gpu_nodes),
        requeue_after=min(deadlines) if deadlines else None,
        dry_run=policy.dry_run,
    )


@dataclass(frozen=True)
class DrainOutcome:
    """What one drain pass over a quarantined node did, for its Event.

    ``refused``: pods the drain rules do not allow removing (``namespace/name (why)``);
    then nothing was evicted. ``blocked``: evictions the API refused (a disruption
    budget), with its words, retried. ``left``: pods the pass found still to go.
    """

    refused: tuple[str, ...] = ()
    blocked: tuple[str, ...] = ()
    left: tuple[str, ...] = ()

    @property
    def drained(self) -> bool:
        return not self.refused and not self.left

    def message(self) -> str:
        if self.drained:
            return "drained: no pod left that the drain rules (driver.upgradePolicy.drain) remove"
        if self.refused:
            return (
                "drain refused, nothing evicted: the drain rules (driver.upgradePolicy.drain) "
                f"do not allow removing {_listing(self.refused)}; retried while quarantined"
            )
        text = f"draining: {len(self.left)} pods left"
        if self.blocked:
            text += f"; eviction refused, retrying: {_listing(self.blocked)}"
        return text


def _listing(items: tuple[str, ...], limit: int = 5) -> str:
    shown = "; ".join(items[:limit])
    return shown + (f"; and {len(items) - limit} more" if len(items) > limit else "")


def quarantined_taints(taints: Iterable[dict[str, str]]) -> list[dict[str, str]]:
    """``taints`` with ours added (once)."""
    kept = [t for t in taints if t.get("key") != TAINT_KEY]
    return [*kept, {"key": TAINT_KEY, "value": TAINT_VALUE, "effect": TAINT_EFFECT}]


def released_taints(taints: Iterable[dict[str, str]]) -> list[dict[str, str]]:
    """``taints`` without ours."""
    return [t for t in taints if t.get("key") != TAINT_KEY]


def blind(spec: ClusterPolicySpec | None) -> bool:
    """Remediation is on but the node agent that reports GPUHealthy is not deployed:
    it would wait for a condition no one sets."""
    if spec is None or spec.health_remediation is None:
        return False
    return spec.health_remediation.enabled and not spec.node_status_exporter.enabled
