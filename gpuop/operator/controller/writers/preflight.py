"""The upgrade pre-flight's imperative side: before the fleet pass starts a wave on a
driver pool, ask the registry for every image the pool's DaemonSet will pull.

``statemachine.preflight`` decides; this unit finds each pool's waiting nodes, reads its
pull Secrets, asks the registry (``writers.registry``), and records a hold on the pool's
DaemonSet (annotation, Warning Event once per change) for ``gpuop upgrade status`` and
``plan``. Only a pool with nodes waiting for a slot is checked, and a pool that passed
is not checked again until its template changes, so an idle operator asks nothing; a
held pool is asked again with backoff. Present images are remembered per image and
pull-Secret version.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from components.component import ObjectKind
from components.image_ref import credential_for, docker_auths, parse_image
from gpuop.kube.backoff import Backoff
from gpuop.kube.informer import Informer, Obj
from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Rest
from gpuop.log import get_logger
from gpuop.operator.controller.views.node_views import labels
from gpuop.operator.controller.writers.registry import RegistryClient
from gpuop.operator.events import EventRecorder
from statemachine.preflight import (
    RECORD_ANNOTATION,
    Found,
    ImageCheck,
    Mode,
    PoolVerdict,
    held_nodes,
    pool_images,
    pool_verdict,
    pull_secret_names,
    record,
    recorded_hold,
)
from statemachine.upgrade_keys import STATE_LABEL, UpgradeState, parse_state

log = get_logger(__name__)

SECRET = ObjectKind("v1", "Secret", "secrets")
DAEMONSET = by_kind("apps/v1", "DaemonSet")
RETRY = Backoff(base=30.0, cap=600.0)
"""A held pool is asked again after 30 s, doubling to 10 minutes."""
_MAX_REMEMBERED = 512

Fingerprint = tuple[tuple[str, str], ...]
"""The pull Secrets an answer was given with: (name, resourceVersion) each."""


@dataclass(frozen=True)
class PreflightHolds:
    held: dict[str, str] = field(default_factory=dict)
    """Waiting nodes of held pools, with the reason (merged into the budget's ``held``)."""
    requeue_after: float | None = None
    """When a held pool is asked again (the fleet pass's requeue)."""


@dataclass
class _PoolState:
    generation: int
    verdict: PoolVerdict
    attempts: int = 0
    retry_at: float = 0.0


class Preflight:
    """Runs inside the serial fleet pass (so each pool's record has one writer)."""

    def __init__(
        self,
        rest: Rest,
        namespace: str,
        daemonsets: Informer,
        driver_app: Callable[[str], str],
        events: EventRecorder,
        mode: Mode,
        client: RegistryClient | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rest = rest
        self.namespace = namespace
        self._daemonsets = daemonsets
        self._driver_app = driver_app
        self.events = events
        self.mode = mode
        self.client = client or RegistryClient()
        self._clock = clock
        self.retry = RETRY
        """The backoff of a held pool's next check (tests shorten it)."""
        self._pools: dict[str, _PoolState] = {}
        self._present: dict[tuple[str, Fingerprint], None] = {}
        self.requests = 0
        """Registry checks made (one per image asked), for tests and benchmarks."""

    async def hold(self, nodes: list[Obj]) -> PreflightHolds:
        """The nodes that wait for a slot in a pool whose images are not all there."""
        if self.mode is Mode.OFF:
            return PreflightHolds()
        candidates: dict[str, list[str]] = {}
        for node in nodes:
            if parse_state(labels(node).get(STATE_LABEL)) is not UpgradeState.UPGRADE_REQUIRED:
                continue
            name = node["metadata"]["name"]
            pool = self._driver_app(name)
            if pool:
                candidates.setdefault(pool, []).append(name)
        pools = {}
        for pool in candidates:
            ds = self._daemonsets.get(f"{self.namespace}/{pool}")
            if ds is not None and not ds["metadata"].get("deletionTimestamp"):
                pools[pool] = ds
        # Pools in parallel: one registry that does not answer delays the others not at all.
        states = await asyncio.gather(*(self._verdict(p, ds) for p, ds in pools.items()))
        verdicts: dict[str, PoolVerdict] = {}
        requeue: float | None = None
        for pool, state in zip(pools, states, strict=True):
            verdicts[pool] = state.verdict
            if state.verdict.retry:
                wait = max(0.0, state.retry_at - self._clock())
                requeue = wait if requeue is None else min(requeue, wait)
        return PreflightHolds(held_nodes(candidates, verdicts), requeue)

    async def _verdict(self, pool: str, ds: Obj) -> _PoolState:
        generation = int(ds["metadata"].get("generation") or 0)
        state = self._pools.get(pool)
        same = state is not None and state.generation == generation
        if (
            state is not None
            and same
            and (not state.verdict.retry or self._clock() < state.retry_at)
        ):
            return state  # passed for this template, or held until its retry
        attempts = state.attempts if state is not None and same else 0
        verdict = await self._check(pool, ds)
        state = _PoolState(generation, verdict)
        if verdict.retry:
            state.attempts = attempts + 1
            state.retry_at = self._clock() + self.retry.delay(state.attempts)
        self._pools[pool] = state
        await self._record(pool, ds, verdict, generation)
        return state

    async def _check(self, pool: str, ds: Obj) -> PoolVerdict:
        pod_spec = ds["spec"]["template"]["spec"]
        configs, fingerprint = await self._pull_secrets(pull_secret_names(pod_spec))
        images = pool_images(pod_spec)
        ask = {}
        for image in images:
            if (image, fingerprint) in self._present:
                continue
            try:
                registry = parse_image(image).registry
            except ValueError:
                registry = ""
            ask[image] = credential_for(registry, configs) if registry else None
        answers = await self.client.check_all(ask) if ask else {}
        self.requests += len(ask)
        for image, check in answers.items():
            if check.found is Found.PRESENT:
                if len(self._present) >= _MAX_REMEMBERED:
                    self._present.clear()
                self._present[(image, fingerprint)] = None
        checks = [answers.get(i) or ImageCheck(i, Found.PRESENT) for i in images]
        verdict = pool_verdict(pool, checks, self.mode)
        for unchecked in verdict.unchecked:
            log.warning(
                "upgrade pre-flight: registry unreachable, proceeding (fail-open)",
                pool=pool,
                image=unchecked.image,
                why=unchecked.detail,
            )
        return verdict

    async def _pull_secrets(
        self, names: tuple[str, ...]
    ) -> tuple[list[dict[str, Any]], Fingerprint]:
        """The pool's pull Secrets' registry entries and versions; one that is missing
        or unreadable counts as none (the kubelet would pull without it too)."""
        configs: list[dict[str, Any]] = []
        versions = []
        for name in names:
            try:
                secret = await self.rest.get(SECRET, name, self.namespace)
            except ApiException as err:
                log.warning(
                    "upgrade pre-flight: pull secret unreadable", secret=name, status=err.status
                )
                secret = None
            if secret is None:
                versions.append((name, ""))
                continue
            versions.append((name, str(secret["metadata"].get("resourceVersion") or "")))
            configs.append(docker_auths(str(secret.get("type") or ""), secret.get("data") or {}))
        return configs, tuple(versions)

    async def _record(self, pool: str, ds: Obj, verdict: PoolVerdict, generation: int) -> None:
        """The annotation on the pool's DaemonSet, and an Event when the hold changes."""
        annotations = ds["metadata"].get("annotations") or {}
        wanted = record(verdict, generation)
        if annotations.get(RECORD_ANNOTATION) == wanted:
            return
        before = recorded_hold(annotations, generation)
        await self.rest.merge_patch(
            DAEMONSET,
            pool,
            {"metadata": {"annotations": {RECORD_ANNOTATION: wanted}}},
            self.namespace,
        )
        ref = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": ds["metadata"]}
        if verdict.held and verdict.hold != before:
            log.warning("upgrade pre-flight holds a driver pool", pool=pool, why=verdict.hold)
            await self.events.record(ref, "DriverUpgradePreflightHeld", verdict.hold, warning=True)
        elif not verdict.held and RECORD_ANNOTATION in annotations:
            found = "unchecked (registry unreachable)" if verdict.unchecked else "in its registry"
            message = f"pre-flight: every image of pool {pool} is {found}; the upgrade proceeds"
            log.info("upgrade pre-flight passed", pool=pool, why=message)
            await self.events.record(ref, "DriverUpgradePreflightPassed", message)
