"""Per-node rollout progress over the watch caches: where each GPU node stands.

The cluster pass applies every enabled component at once (as upstream); the order per
node is enforced on the node by the operands' init containers. This module only
*observes* where each GPU node stands (:mod:`statemachine.node_rollout`), from the pods
indexed by (node, app), and says which nodes are stuck and at what. It writes nothing
and sends nothing: :mod:`gpuop.operator.controller.writers.rollout_reports` does that with its
answer,
and the counts go into ``status.components``.

When a node started waiting comes from the cluster where it can (the pod's, the node's
or the DaemonSet revision's creation time), so a restarted operator reports the same
stuck nodes; this process only adds when it last saw the node done, so a short blip of
a long-running pod is not reported as stuck at once.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import Any

from gpuop.kube.compact import shared
from gpuop.kube.informer import Informer, Obj
from gpuop.log import get_logger
from gpuop.operator.controller.views.pod_records import (
    PodRecord,
    daemonset_app,
    is_driver_pod,
    pods_on,
)
from statemachine.node_rollout import (
    NODE_DONE,
    NODE_ORDER,
    ComponentCounts,
    ComponentTally,
    NodeStep,
    PodState,
    StuckNode,
    node_step,
    stuck_after,
    stuck_message,
)
from statemachine.stale_pods import StalePod
from statemachine.upgrade_keys import DRIVER_REVISION_LABEL

log = get_logger(__name__)

DEFAULT_NODE_STUCK_SECONDS = 600.0
"""A node waiting this long for a pod that is missing or not Ready is stuck. Upstream's
validator gives a driver 600 s too; a driver container that compiles its modules takes
minutes, so a shorter default would name healthy nodes during a normal rollout."""
_HASH_LABEL = DRIVER_REVISION_LABEL
_WORST = {
    PodState.ABSENT: 0,
    PodState.READY: 1,
    PodState.OUTDATED: 2,
    PodState.NOT_READY: 3,
    PodState.MISSING: 4,
}


@lru_cache(maxsize=8192)
def _epoch(stamp: str | None) -> float:
    if not stamp:
        return float("-inf")
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


@dataclass(frozen=True)
class _Daemon:
    """One desired DaemonSet as the per-node view needs it."""

    component: str
    app: str
    selector: tuple[tuple[str, str], ...]
    revision: str | None
    """Hash of the newest ControllerRevision; None: no revision check (OnDelete, whose
    pods move only when the upgrade machine restarts them)."""
    revision_time: float


@dataclass(frozen=True, slots=True)
class _Seen:
    """One node's observation and the labels it was made with (compared by identity:
    the node cache replaces the mapping whenever the node changes)."""

    labels: Mapping[str, str]
    pods: Mapping[str, PodState]
    since: Mapping[str, float]


@dataclass
class RolloutView:
    """What one pass saw: per-component counts and the nodes stuck, by name."""

    counts: dict[str, ComponentCounts]
    not_done: list[str]
    stuck: list[StuckNode]
    next_due: float | None
    """Seconds until another node would count as stuck (the caller re-runs then)."""
    message: str | None = None
    states: dict[str, str] = field(default_factory=dict)

    def component(self, name: str, ready: bool, message: str) -> tuple[bool, str]:
        """A component is ready only once it is ready on every node it should run on
        (its DaemonSet may not count a node whose kubelet is gone)."""
        counts = self.counts.get(name)
        if counts is None or counts.not_ready == 0:
            return ready, message
        total = counts.ready + counts.not_ready
        return False, f"{counts.ready}/{total} nodes ready; {message}"


class NodeRollouts:
    """Reads the node, pod and revision caches; remembers only when nodes were done."""

    def __init__(
        self,
        pods: Informer[PodRecord],
        revisions: Informer,
        daemonsets: Informer,
        namespace: str,
        stuck_seconds: float = DEFAULT_NODE_STUCK_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._pods = pods
        self._revisions = revisions
        self._daemonsets = daemonsets
        self._namespace = namespace
        self.stuck_seconds = stuck_seconds
        self._clock = clock
        self._last_done: dict[str, float] = {}
        self._states: dict[str, str] = {}
        #: Each node's last observation, dropped when its pods change (a pure
        #: function of its labels, its pods and the desired DaemonSets).
        self._seen: dict[str, _Seen] = {}
        self._daemons_seen: tuple[_Daemon, ...] = ()
        #: Each node's step from its last observation and the state it left the node
        #: in: a node nothing changed on takes the same step again (most of them, on
        #: each pass of a rollout), so the machine is not asked.
        self._steps: dict[str, tuple[_Seen, str, NodeStep]] = {}
        self._tally = ComponentTally()
        #: When the last view ran: every node done then was done at that time.
        self._viewed_at: float | None = None

    def view(self, desired: Mapping[str, Iterable[Obj]], gpu_nodes: Iterable[Obj]) -> RolloutView:
        """Where every GPU node stands. Only nodes whose pods or labels changed since
        the last view are observed again (the pod cache says which index keys
        changed); a change of the desired DaemonSets or their revisions redoes all."""
        daemons = tuple(self._daemons(desired))
        if daemons != self._daemons_seen:
            self._seen.clear()
            self._daemons_seen = daemons
            self._pods.index_changes()  # everything is observed again anyway
        else:
            for node_name in self._pods.index_changes():
                self._seen.pop(node_name, None)
        now = self._clock()
        stuck: list[StuckNode] = []
        not_done: list[str] = []
        due: float | None = None
        names: set[str] = set()
        for node in gpu_nodes:
            name = str(node["metadata"]["name"])
            names.add(name)
            step = self._step_node(node, daemons, now)
            if step is None:
                continue
            not_done.append(name)
            at, waiting = step
            if at is None or waiting is None:
                continue
            if at <= now:
                stuck.append(waiting)
            elif due is None or at - now < due:
                due = at - now
        self._forget_all_but(names)
        self._viewed_at = now
        return RolloutView(
            counts=self._tally.counts(),
            not_done=sorted(not_done),
            stuck=stuck,
            next_due=due,
            message=stuck_message(stuck) if stuck else None,
            states=dict(self._states),
        )

    def _step_node(
        self, node: Obj, daemons: tuple[_Daemon, ...], now: float
    ) -> tuple[float, StuckNode] | tuple[None, None] | None:
        """One node's rollout step, observed again only if its pods or labels changed.
        None: the node is done; else when it counts as stuck and how (None, None: no
        clock runs)."""
        meta = node["metadata"]
        name = str(meta["name"])
        node_labels = meta["labels"]
        seen = self._seen.get(name)
        previous = self._states.get(name)
        if seen is not None and seen.labels is node_labels and previous == NODE_DONE:
            memo = self._steps.get(name)
            if memo is not None and memo[0] is seen and memo[1] == NODE_DONE and memo[2].done:
                # Done, and nothing it was observed from changed: the same step, the
                # same counts. When it was last seen done is brought up to date only
                # when it stops being done (below), not on every pass.
                return None
        if seen is None or seen.labels is not node_labels:
            pods, since = self._observe(name, node_labels, daemons)
            seen = _Seen(node_labels, pods, since)
            self._seen[name] = seen
        memo = self._steps.get(name)
        if memo is not None and memo[0] is seen and memo[1] == previous:
            step = memo[2]
        else:
            step = node_step(seen.pods, previous)
            self._steps[name] = (seen, step.state, node_step(seen.pods, step.state))
        self._tally.observe(name, seen.pods, step)
        if step.moved_back:
            log.debug("node rollout moved back", node=name, state=step.state)
        self._states[name] = step.state
        if step.done:
            self._last_done[name] = now
            return None
        if previous == NODE_DONE and self._viewed_at is not None:
            # Done when the last view looked (which skipped it, unchanged).
            self._last_done[name] = self._viewed_at
        start = max(
            seen.since.get(step.state, float("-inf")),
            _epoch(meta.get("creationTimestamp")),
            self._last_done.get(name, float("-inf")),
        )
        at = stuck_after(step, start, self.stuck_seconds)
        if at is None:
            return None, None
        assert step.waiting is not None
        return at, StuckNode(name, step.state, step.waiting)

    def _forget_all_but(self, names: set[str]) -> None:
        """Drop what is kept of nodes that left the GPU fleet."""
        for gone in set(self._states) - names:
            self._states.pop(gone, None)
            self._last_done.pop(gone, None)
        for gone in set(self._seen) - names:
            del self._seen[gone]
        for gone in set(self._steps) - names:
            del self._steps[gone]
        self._tally.keep_only(names)

    def _observe(
        self, node: str, labels: Mapping[str, str], daemons: Iterable[_Daemon]
    ) -> tuple[Mapping[str, PodState], Mapping[str, float]]:
        """Each component's pod state on the node, and since when it waits (cluster time)."""
        states: dict[str, PodState] = {}
        since: dict[str, float] = {}
        live: dict[str, list[PodRecord]] = {}  # the node's pods by app, read once
        for pod in self._pods.indexed(node):
            if not pod.deleting:
                live.setdefault(pod.app, []).append(pod)
        for daemon in daemons:
            if any(labels.get(k) != v for k, v in daemon.selector):
                continue
            pods = live.get(daemon.app, [])
            state, created = _pod_state(pods, daemon.revision)
            known = states.get(daemon.component)
            if known is None or _WORST[state] > _WORST[known]:
                states[daemon.component] = state  # one DaemonSet per node, normally
            since[daemon.component] = max(
                since.get(daemon.component, float("-inf")), created, daemon.revision_time
            )
        return _shared_states(states), _Since(since)

    def _daemons(self, desired: Mapping[str, Iterable[Obj]]) -> list[_Daemon]:
        newest: dict[str, tuple[int, str, float]] = {}
        for rev in self._revisions.values():
            meta = rev["metadata"]
            number = int(rev.get("revision", 0))
            for owner in meta.get("ownerReferences") or []:
                uid = owner.get("uid")
                if uid and (uid not in newest or number > newest[uid][0]):
                    newest[uid] = (
                        number,
                        (meta.get("labels") or {}).get(_HASH_LABEL, ""),
                        _epoch(meta.get("creationTimestamp")),
                    )
        daemons: list[_Daemon] = []
        for component, objs in desired.items():
            if component not in NODE_ORDER:
                continue
            for obj in objs:
                if obj.get("kind") != "DaemonSet":
                    continue
                name = obj["metadata"]["name"]
                spec = obj["spec"]
                template = spec["template"]["spec"]
                observed = self._daemonsets.get(f"{self._namespace}/{name}")
                uid = (observed or {}).get("metadata", {}).get("uid")
                number, hash_, created = newest.get(uid or "", (0, "", float("-inf")))
                on_delete = (spec.get("updateStrategy") or {}).get("type") == "OnDelete"
                daemons.append(
                    _Daemon(
                        component=component,
                        app=daemonset_app(obj),
                        selector=tuple(sorted((template.get("nodeSelector") or {}).items())),
                        revision=None if on_delete or not hash_ else hash_,
                        revision_time=created,
                    )
                )
        return daemons

    def stale_pods(self, nodes: Iterable[Obj], apps: Iterable[str]) -> list[StalePod]:
        """What :func:`statemachine.stale_pods.plan_release` reads of our pods of
        ``apps`` on ``nodes`` (GPU nodes out of service): every one, whatever its
        state, so the choice is the pure function's alone."""
        found: list[StalePod] = []
        names = tuple(apps)
        for node in nodes:
            name = str(node["metadata"]["name"])
            for app in names:
                for pod in pods_on(self._pods, name, app):
                    found.append(
                        StalePod(
                            name=pod.name,
                            namespace=pod.namespace or self._namespace,
                            uid=pod.uid,
                            node=name,
                            terminating=pod.deleting,
                            driver=is_driver_pod(pod),
                        )
                    )
        return found


#: One mapping per distinct observation: thousands of nodes share a handful ("every
#: component ready"), and each node holding its own dict was a fifth of this view's
#: memory. Readers never mutate it; anything comparing by identity (the tally) then
#: only skips a recount that would give the same counts.
_STATES: dict[tuple[tuple[str, PodState], ...], Mapping[str, PodState]] = {}
_STATES_MAX = 4096


class _Since(Mapping[str, float]):
    """Since when each component waits on one node (kept for every GPU node): the
    component names as one list shared by nodes alike (:func:`gpuop.kube.compact.shared`)
    and the times as an array, about 200 bytes instead of the 450 of a dict of floats."""

    __slots__ = ("_names", "_times")

    def __init__(self, since: Mapping[str, float]) -> None:
        self._names: Sequence[str] = shared(list(since))
        self._times = array("d", since.values())

    def __getitem__(self, key: str) -> float:
        try:
            return self._times[self._names.index(key)]
        except ValueError:
            raise KeyError(key) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def _shared_states(states: dict[str, PodState]) -> Mapping[str, PodState]:
    key = tuple(states.items())
    found = _STATES.get(key)
    if found is None:
        if len(_STATES) >= _STATES_MAX:
            _STATES.clear()  # still-held mappings stay valid, only unshared
        _STATES[key] = found = states
    return found


def _pod_state(pods: list[PodRecord], revision: str | None) -> tuple[PodState, float]:
    if not pods:
        return PodState.MISSING, float("-inf")
    pod = pods[0]
    created = _epoch(pod.created)
    if not pod.ready:
        return PodState.NOT_READY, created
    if revision is not None and pod.labels.get(_HASH_LABEL) != revision:
        return PodState.OUTDATED, created
    return PodState.READY, created


def pod_facts(pod: PodRecord | None) -> Any:
    """What the per-node view reads of a pod: a change of anything else wakes nothing.
    A pod bound to no node yet is in no node's view (``pod_index``): its creation, and
    its deletion before the scheduler placed it, are nothing to count."""
    if pod is None or not pod.node:
        return None
    return (pod.node, pod.deleting, pod.labels.get(_HASH_LABEL), pod.ready)
