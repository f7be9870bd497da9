"""The fleet pass's wait scales with what it last cost, within bounds."""

from __future__ import annotations

from typing import Any, cast

import pytest

from gpuop.controller._keys import FLEET_COALESCE_MAX_S, FLEET_COALESCE_S, UPGRADES_KEY
from gpuop.controller._node import NodeReconciler


class _Queue:
    def __init__(self) -> None:
        self.after: list[tuple[str, float]] = []

    def add_after(self, key: str, delay: float) -> None:
        self.after.append((key, delay))


@pytest.mark.parametrize(
    ("last_pass_cpu_s", "wait"),
    [(0.0, FLEET_COALESCE_S), (0.001, FLEET_COALESCE_S), (0.1, 2.0), (10.0, FLEET_COALESCE_MAX_S)],
)
def test_fleet_news_waits_twenty_times_the_last_pass(last_pass_cpu_s: float, wait: float) -> None:
    queue = _Queue()
    nothing = cast(Any, None)
    passes = NodeReconciler(
        rest=nothing,
        nodes=nothing,
        queue=cast(Any, queue),
        active_policy=nothing,
        upgrades=nothing,
        gate=nothing,
        nvd=nothing,
    )
    passes._fleet_cpu_s = last_pass_cpu_s
    passes.fleet_soon()
    assert queue.after == [(UPGRADES_KEY, pytest.approx(wait))]
