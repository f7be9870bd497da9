"""Leader election on a coordination.k8s.io Lease, so two replicas never both act.

Only the holder runs the controller. It renews every ``retry_period`` (jittered).
Every renewal is bounded by what is left of ``renew_deadline``, counted from the
moment the last successful renewal was *sent*; when that runs out the holder stops
leading at once and raises ``LostLeadership`` (the process exits and Kubernetes
restarts it as a follower), because acting on without the lease could double-drain
a node. A renewal hung on a dead connection used to keep the old leader acting
after another replica had taken over.

Expiry is judged as client-go does, by local observation: a follower takes over only
when the record (holder, renewTime, ...) has not changed for ``leaseDurationSeconds``
of *its own* monotonic clock since it last saw it change. The holder's renewTime is
written for people, never compared with the local wall clock (a skewed clock made
a follower take over early). The follower saw the last renewal no earlier than it
was sent, so with ``renew_deadline < lease_seconds`` the old leader has stopped
before the new one can start.

Renewals are the only periodic writes an idle operator makes, and only when leader
election is on (multi-replica installs).

`Leases` holds several Leases as one: gpuop takes part in NVIDIA's operator's election
(its Lease `53822513.nvidia.com`), so while NVIDIA's operator runs in the namespace
gpuop waits, and also holds its own older Lease `gpuop-leader`, so that during a rolling
update from a release that knew only that one the old and new replicas never both act.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from gpuop.kube.backoff import Backoff
from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Rest
from gpuop.log import get_logger

log = get_logger(__name__)
LEASE = by_kind("coordination.k8s.io/v1", "Lease")
UPSTREAM_LEASE = "53822513.nvidia.com"
"""NVIDIA's GPU Operator's leader-election Lease (controller-runtime's LeaderElectionID)."""
LEGACY_LEASE = "gpuop-leader"
"""The Lease gpuop releases before upstream's was added held alone."""
DEFAULT_LEASES = (UPSTREAM_LEASE, LEGACY_LEASE)


class LostLeadership(RuntimeError):
    """The lease could not be renewed in time."""


def _micro(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(
        self,
        rest: Rest,
        namespace: str,
        name: str,
        identity: str,
        lease_seconds: float = 15,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < retry_period < renew_deadline < lease_seconds:
            raise ValueError("need 0 < retry_period < renew_deadline < lease_seconds")
        self.rest = rest
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_seconds = lease_seconds
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.clock = clock
        #: Polls and renewals: every retry_period, shortened by up to a quarter.
        self.pacing = Backoff(retry_period, retry_period)
        self.leading = False
        #: The lease spec as last seen, and when (local monotonic clock) it changed.
        self._seen: dict[str, Any] | None = None
        self._seen_at = 0.0
        #: Until when (monotonic) our last successful renewal lets us act.
        self._valid_until = 0.0

    def _spec(self, lease: dict[str, Any] | None, now: datetime) -> dict[str, Any]:
        spec = dict((lease or {}).get("spec") or {})
        if spec.get("holderIdentity") != self.identity:
            spec["acquireTime"] = _micro(now)
            spec["leaseTransitions"] = int(spec.get("leaseTransitions", 0)) + (1 if lease else 0)
        spec.update(
            holderIdentity=self.identity,
            leaseDurationSeconds=max(1, round(self.lease_seconds)),
            renewTime=_micro(now),
        )
        return spec

    def _observe(self, spec: dict[str, Any]) -> None:
        if spec != self._seen:
            self._seen = spec
            self._seen_at = self.clock()

    async def try_acquire_or_renew(self) -> bool:
        """One attempt; True when we hold the lease afterwards. Unbounded: callers
        bound it (``hold`` by the renew deadline)."""
        lease = await self.rest.get(LEASE, self.name, self.namespace)
        now = datetime.now(UTC)
        if lease is None:
            spec = self._spec(None, now)
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": spec,
            }
            try:
                created = await self.rest.create(LEASE, body, self.namespace)
            except ApiException as err:
                if err.status == 409:
                    return False
                raise
            self._observe(created.get("spec") or spec)
            return True
        spec = lease.get("spec") or {}
        self._observe(spec)
        holder = spec.get("holderIdentity")
        duration = float(spec.get("leaseDurationSeconds") or self.lease_seconds)
        if holder and holder != self.identity and self.clock() < self._seen_at + duration:
            return False  # someone else holds a lease we saw renewed recently enough
        try:
            replaced = await self.rest.replace(
                LEASE, {**lease, "spec": self._spec(lease, now)}, self.namespace
            )
        except ApiException as err:
            if err.status == 409:
                return False
            raise
        self._observe(replaced.get("spec") or {})
        return True

    async def _attempt(self, limit: float) -> bool:
        """One attempt within ``limit`` seconds; failures are answers, not errors."""
        try:
            async with asyncio.timeout(max(0.0, limit)):
                return await self.try_acquire_or_renew()
        except TimeoutError:
            log.warning("lease request timed out", lease=f"{self.namespace}/{self.name}")
        except Exception as err:  # network trouble: the caller retries
            log.warning("lease request failed", error=f"{type(err).__name__}: {err}")
        return False

    async def acquire(self) -> None:
        """Block until this process holds the lease."""
        log.info("waiting for leadership", lease=f"{self.namespace}/{self.name}")
        while True:
            started = self.clock()
            if await self._attempt(self.renew_deadline):
                self._valid_until = started + self.renew_deadline
                break
            await asyncio.sleep(self.pacing.delay(1))
        self.leading = True
        log.info("became leader", identity=self.identity)

    async def hold(self) -> None:
        """Renew until cancelled; stop leading and raise LostLeadership as soon as the
        last successful renewal is ``renew_deadline`` old."""
        if self._valid_until == 0.0:
            self._valid_until = self.clock() + self.renew_deadline
        while True:
            await asyncio.sleep(
                max(0.0, min(self.pacing.delay(1), self._valid_until - self.clock()))
            )
            started = self.clock()
            if started < self._valid_until and await self._attempt(self._valid_until - started):
                self._valid_until = started + self.renew_deadline
                continue
            if self.clock() >= self._valid_until:
                self.leading = False
                log.warning("leadership lost", lease=f"{self.namespace}/{self.name}")
                raise LostLeadership(f"could not renew lease {self.namespace}/{self.name}")

    async def release(self) -> None:
        """Give the lease up on a clean shutdown so a follower takes over at once."""
        if not self.leading:
            return
        self.leading = False
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.renew_deadline):
                lease = await self.rest.get(LEASE, self.name, self.namespace)
                if lease and (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                    spec = {**lease["spec"], "holderIdentity": "", "leaseDurationSeconds": 1}
                    await self.rest.replace(LEASE, {**lease, "spec": spec}, self.namespace)


class Leases:
    """Several Leases held as one leadership: acquired one after the other, always in
    the same order (two new replicas never wait for each other), renewed side by side;
    losing any one ends the leadership."""

    def __init__(self, electors: list[LeaderElector]) -> None:
        if not electors:
            raise ValueError("need at least one lease")
        self.electors = electors

    @classmethod
    def named(cls, rest: Rest, namespace: str, names: tuple[str, ...], identity: str) -> Leases:
        return cls([LeaderElector(rest, namespace, n, identity) for n in names])

    @property
    def leading(self) -> bool:
        return all(e.leading for e in self.electors)

    async def acquire(self) -> None:
        """Block until every Lease is ours (the first ones are renewed meanwhile)."""
        holding: list[asyncio.Task[None]] = []
        try:
            for elector in self.electors:
                waiting = asyncio.create_task(elector.acquire())
                done, _ = await asyncio.wait(
                    [waiting, *holding], return_when=asyncio.FIRST_COMPLETED
                )
                if waiting not in done:
                    waiting.cancel()
                    for task in done:
                        task.result()  # a held Lease was lost: LostLeadership
                await waiting
                holding.append(asyncio.create_task(elector.hold()))
        finally:
            for task in holding:
                task.cancel()
            for task in holding:
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def hold(self) -> None:
        """Renew every Lease until cancelled; LostLeadership as soon as one is lost."""
        async with asyncio.TaskGroup() as group:
            for elector in self.electors:
                group.create_task(elector.hold())

    async def release(self) -> None:
        for elector in reversed(self.electors):
            await elector.release()
