"""Liveness from memory: dead root tasks, informers unable to list or watch, stuck
reconciles. The checks read what each loop reports; no API requests."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from gpuop.kube.informer import Informer, ResourceSpec
from gpuop.kube.workqueue import WorkQueue
from gpuop.operator.health import Liveness


async def _down(**_: Any) -> Any:
    raise ConnectionRefusedError("API server down")


async def _noop(_: str) -> None:
    return None


async def test_an_informer_that_cannot_list_turns_liveness_red_after_the_threshold() -> None:
    informer = Informer(ResourceSpec("nodes", _down), lambda *_: None)
    liveness = Liveness(informers=lambda: [informer], unavailable_after=60)
    task = asyncio.create_task(informer.run())
    while informer.unavailable_for() == 0.0:  # noqa: ASYNC110 - the informer has no event for this
        await asyncio.sleep(0.01)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    now = time.monotonic()
    assert liveness.check(now=now) == (True, "ok")
    ok, why = liveness.check(now=now + 61)
    assert not ok
    assert "watch nodes failing" in why


async def test_a_stuck_reconcile_and_a_dead_root_task_are_reported() -> None:
    gate = asyncio.Event()

    async def reconcile(_: str) -> None:
        await gate.wait()

    queue = WorkQueue(reconcile, workers=1)
    running = asyncio.create_task(queue.run())

    async def crash() -> None:
        raise RuntimeError("boom")

    dead = asyncio.create_task(crash(), name="operator")
    liveness = Liveness(queue=lambda: queue, tasks=[dead], stuck_after=600)
    queue.add("node/a")
    await asyncio.sleep(0.01)
    ok, why = liveness.check(now=time.monotonic() + 601)
    assert not ok
    assert "task operator ended" in why
    assert "reconcile node/a running for" in why
    gate.set()
    await queue.wait_idle()
    running.cancel()
    liveness.tasks.clear()
    assert liveness.check() == (True, "ok")
    assert isinstance(dead.exception(), RuntimeError)


def test_nothing_running_is_healthy() -> None:
    assert Liveness(queue=lambda: WorkQueue(_noop)).check() == (True, "ok")
