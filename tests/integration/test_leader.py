"""Leader election on a real Lease: one holder at a time, takeover after release
or expiry, and a holder that cannot renew gives up."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from gpuop.leader import LEASE, LeaderElector, LostLeadership
from gpuop.rest import Rest
from tests.integration.harness import NAMESPACE

pytestmark = pytest.mark.integration


async def test_one_leader_at_a_time_and_takeover(rest: Rest) -> None:
    name = "leader-test"
    a = LeaderElector(rest, NAMESPACE, name, "a", lease_seconds=2, retry_period=0.2)
    b = LeaderElector(rest, NAMESPACE, name, "b", lease_seconds=2, retry_period=0.2)
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
    b.renew_deadline = 1.0
    with pytest.raises(LostLeadership):
        await asyncio.wait_for(b.hold(), timeout=10)
    assert not b.leading
    await rest.delete(LEASE, name, NAMESPACE)
