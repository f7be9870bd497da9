"""The operator routes each watch event once: a driver pod's event, read by both the
node passes and the NVIDIADriver unit, wakes its node and the fleet pass once."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from components.driver import COMPONENT_POD_LABEL
from gpuop.controller import Operator, OperatorConfig
from gpuop.controller._keys import NVD_KEY, node_key
from gpuop.controller._pods import trim_pod
from gpuop.metrics import OperatorMetrics


async def _never(**_: Any) -> None:
    raise AssertionError("not listed in this test")


def test_a_driver_pod_event_is_routed_once_by_the_operator() -> None:
    rest = SimpleNamespace(lister=lambda *_a, **_k: _never, observer=None)
    op = Operator(rest, OperatorConfig(namespace="gpu-operator"), OperatorMetrics())  # type: ignore[arg-type]
    added: list[str] = []
    fleet: list[str] = []
    op.queue.add = added.append  # type: ignore[method-assign]
    op.queue.add_after = lambda key, _delay: added.append(f"{key} (paced)")  # type: ignore[method-assign]
    op.node_passes.upgrades_queued = lambda: True  # type: ignore[method-assign]
    op.node_passes.fleet_soon = lambda: fleet.append("upgrades")  # type: ignore[method-assign]
    labels = {"app": "nvidia-driver-daemonset", COMPONENT_POD_LABEL: "nvidia-driver"}
    pod = {
        "metadata": {"name": "driver-x", "namespace": "gpu-operator", "labels": labels},
        "spec": {"nodeName": "n0"},
    }

    op._on_pod("ADDED", None, trim_pod(pod))

    assert added.count(node_key("n0")) == 1
    assert added.count(NVD_KEY) == 1
    assert fleet == ["upgrades"]
