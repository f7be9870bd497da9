"""Leader election on a coordination.k8s.io Lease, so two replicas never both act.

Only the holder runs the controller. It renews every ``retry_period``; if it cannot
renew within ``renew_deadline`` it raises ``LostLeadership`` and the process exits
(Kubernetes restarts it as a follower), because acting on without the lease could
double-drain a node. Renewals are the only periodic writes an idle operator makes,
and only when leader election is on (multi-replica installs).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from gpuop.log import get_logger
from gpuop.rest import Rest, by_kind

log = get_logger(__name__)
LEASE = by_kind("coordination.k8s.io/v1", "Lease")


class LostLeadership(RuntimeError):
    """The lease could not be renewed in time."""


def _micro(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


class LeaderElector:
    def __init__(
        self,
        rest: Rest,
        namespace: str,
        name: str,
        identity: str,
        lease_seconds: int = 15,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
    ) -> None:
        self.rest = rest
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_seconds = lease_seconds
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.leading = False

    def _spec(self, lease: dict[str, Any] | None, now: datetime) -> dict[str, Any]:
        spec = dict((lease or {}).get("spec") or {})
        if spec.get("holderIdentity") != self.identity:
            spec["acquireTime"] = _micro(now)
            spec["leaseTransitions"] = int(spec.get("leaseTransitions", 0)) + (1 if lease else 0)
        spec.update(
            holderIdentity=self.identity,
            leaseDurationSeconds=self.lease_seconds,
            renewTime=_micro(now),
        )
        return spec

    async def try_acquire_or_renew(self) -> bool:
        now = datetime.now(UTC)
        lease = await self.rest.get(LEASE, self.name, self.namespace)
        if lease is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(None, now),
            }
            try:
                await self.rest.create(LEASE, body, self.namespace)
            except ApiException as err:
                if err.status == 409:
                    return False
                raise
            return True
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        renewed = _parse(spec.get("renewTime"))
        duration = int(spec.get("leaseDurationSeconds") or self.lease_seconds)
        live = renewed is not None and renewed + timedelta(seconds=duration) > now
        if holder and holder != self.identity and live:
            return False  # someone else holds a live lease
        body = {**lease, "spec": self._spec(lease, now)}
        try:
            await self.rest.replace(LEASE, body, self.namespace)
        except ApiException as err:
            if err.status == 409:
                return False
            raise
        return True

    async def acquire(self) -> None:
        """Block until this process holds the lease."""
        log.info("waiting for leadership", lease=f"{self.namespace}/{self.name}")
        while not await self.try_acquire_or_renew():  # noqa: ASYNC110 - polling the Lease is the protocol
            await asyncio.sleep(self.retry_period)
        self.leading = True
        log.info("became leader", identity=self.identity)

    async def hold(self) -> None:
        """Renew until cancelled; raise LostLeadership when renewal keeps failing."""
        last = time.monotonic()
        while True:
            await asyncio.sleep(self.retry_period)
            try:
                ok = await self.try_acquire_or_renew()
            except Exception as err:  # network trouble: keep trying until the deadline
                log.warning("lease renewal failed", error=str(err))
                ok = False
            if ok:
                last = time.monotonic()
            elif time.monotonic() - last > self.renew_deadline:
                self.leading = False
                raise LostLeadership(f"could not renew lease {self.namespace}/{self.name}")

    async def release(self) -> None:
        """Give the lease up on a clean shutdown so a follower takes over at once."""
        if not self.leading:
            return
        with contextlib.suppress(Exception):
            lease = await self.rest.get(LEASE, self.name, self.namespace)
            if lease and (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                spec = {**lease["spec"], "holderIdentity": "", "leaseDurationSeconds": 1}
                await self.rest.replace(LEASE, {**lease, "spec": spec}, self.namespace)
        self.leading = False
