"""Leader election on a real Lease: one holder at a time, takeover after release
or expiry, a holder that cannot renew stops leading before anyone else can start,
and expiry is judged by local observation, not by the holder's clock."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gpuop.devcluster import ClusterInfo
from gpuop.kube.kinds import KINDS
from gpuop.kube.rest import Rest
from gpuop.operator.leader import LEASE, LeaderElector, LostLeadership
from tests.integration.harness import NAMESPACE, eventually
from tests.integration.proxy import proxied_client

pytestmark = pytest.mark.integration


async def test_one_leader_at_a_time_and_takeover(rest: Rest) -> None:
    name = "leader-test"
    timing: dict[str, Any] = {"lease_seconds": 2, "renew_deadline": 1.0, "retry_period": 0.2}
    a = LeaderElector(rest, NAMESPACE, name, "a", **timing)
    b = LeaderElector(rest, NAMESPACE, name, "b", **timing)
    await a.acquire()
    assert a.leading
    assert not await b.try_acquire_or_renew()

    holding = asyncio.create_task(a.hold())
    waiting = asyncio.create_task(b.acquire())
    await asyncio.sleep(3)  # longer than the lease: a keeps renewing, b keeps waiting
    assert not waiting.done()
    lease = await rest.get(LEASE, name, NAMESPACE)
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == "a"

    holding.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await holding
    await a.release()  # clean shutdown: b takes over without waiting for expiry
    await asyncio.wait_for(waiting, timeout=5)
    assert b.leading
    lease = await rest.get(LEASE, name, NAMESPACE)
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == "b"
    assert lease["spec"]["leaseTransitions"] >= 1

    # b's lease is taken by someone else (a partition, say): b must step down.
    lease["spec"]["holderIdentity"] = "c"
    lease["spec"]["leaseDurationSeconds"] = 60
    await rest.replace(LEASE, lease, NAMESPACE)
    with pytest.raises(LostLeadership):
        await asyncio.wait_for(b.hold(), timeout=10)
    assert not b.leading
    await rest.delete(LEASE, name, NAMESPACE)


class _Recorded(LeaderElector):
    """Appends every change of ``leading`` to a shared timeline, as it happens."""

    timeline: list[tuple[str, bool]]

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "leading" and value != self.__dict__.get("leading", False):
            self.timeline.append((self.identity, bool(value)))
        super().__setattr__(name, value)


async def test_a_leader_whose_renewals_hang_stops_before_another_takes_over(
    rest: Rest, local_cluster: ClusterInfo
) -> None:
    """The old leader's connection goes silent (no reset, no error): its renewal must
    not outlive the renew deadline, and the two never lead at the same moment."""
    name = "leader-blackhole"
    timeline: list[tuple[str, bool]] = []
    _Recorded.timeline = timeline
    timing: dict[str, Any] = {"lease_seconds": 3, "renew_deadline": 1.5, "retry_period": 0.3}
    async with proxied_client(local_cluster.kubeconfig) as (api, proxy):
        a = _Recorded(Rest(api, KINDS), NAMESPACE, name, "a", **timing)
        b = _Recorded(rest, NAMESPACE, name, "b", **timing)
        await a.acquire()
        holding = asyncio.create_task(a.hold())
        waiting = asyncio.create_task(b.acquire())
        try:
            await asyncio.sleep(1)  # a renews through the proxy a few times
            assert not holding.done()
            assert not waiting.done()
            proxy.blackhole()
            with pytest.raises(LostLeadership):
                await asyncio.wait_for(holding, timeout=30)
            await asyncio.wait_for(waiting, timeout=30)
        finally:
            for task in (holding, waiting):
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
    await rest.delete(LEASE, name, NAMESPACE)
    assert timeline == [("a", True), ("a", False), ("b", True)]
    leading: set[str] = set()
    for who, now_leading in timeline:
        (leading.add if now_leading else leading.discard)(who)
        assert len(leading) <= 1, timeline


async def test_expiry_is_measured_on_the_local_clock_not_the_holders(rest: Rest) -> None:
    """A holder whose clock runs an hour behind writes old renewTimes; as long as
    its record keeps changing it holds the lease. Once it stops, the lease is free
    a lease duration after this replica last saw it change."""
    name = "leader-skew"
    skewed = datetime.now(UTC) - timedelta(hours=1)
    body = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "holderIdentity": "skewed",
            "leaseDurationSeconds": 2,
            "renewTime": skewed.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        },
    }
    lease = await rest.create(LEASE, body, NAMESPACE)
    b = LeaderElector(
        rest, NAMESPACE, name, "b", lease_seconds=2, renew_deadline=1, retry_period=0.2
    )
    try:
        assert not await b.try_acquire_or_renew()  # renewTime + 2 s is an hour ago
        # The skewed holder renews (its renewTime moves, still an hour behind).
        lease["spec"]["renewTime"] = (skewed + timedelta(seconds=1)).strftime(
            "%Y-%m-%dT%H:%M:%S.%fZ"
        )
        lease = await rest.replace(LEASE, lease, NAMESPACE)
        assert not await b.try_acquire_or_renew()
        # It stops renewing: b takes over once the record has been still for 2 s.
        await eventually(b.try_acquire_or_renew, timeout=20, interval=0.2)
        got = await rest.get(LEASE, name, NAMESPACE)
        assert got is not None
        assert got["spec"]["holderIdentity"] == "b"
    finally:
        await rest.delete(LEASE, name, NAMESPACE)
