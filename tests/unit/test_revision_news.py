"""Only a driver DaemonSet's new revision wakes the upgrade passes.

A fresh install creates one ControllerRevision per operand DaemonSet; each used to
queue the fleet pass and every GPU node's pass, though only the driver's revision
can start an upgrade (the others roll by themselves).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from components.keys import NFD_GPU_LABELS
from gpuop.operator.controller.base.keys import UPGRADES_KEY, node_key
from gpuop.operator.controller.wiring.router import EventRouter
from statemachine.upgrade_keys import STATE_LABEL

NS = "gpu-operator"


class _Queue:
    def __init__(self) -> None:
        self.added: list[str] = []

    def add(self, key: str) -> None:
        self.added.append(key)


def _operator(
    daemonsets: dict[str, dict[str, Any]],
    driver_on: tuple[str, ...] = ("g0",),
    extra_nodes: dict[str, dict[str, str]] | None = None,
) -> Any:
    gpu = {"metadata": {"name": "g0", "labels": {NFD_GPU_LABELS[0]: "true"}}}
    cpu = {"metadata": {"name": "c0", "labels": {}}}
    more = {
        name: {"metadata": {"name": name, "labels": {NFD_GPU_LABELS[0]: "true", **extra}}}
        for name, extra in (extra_nodes or {}).items()
    }
    fake = SimpleNamespace(
        queue=_Queue(),
        nvd=SimpleNamespace(driver_pods=SimpleNamespace(nodes=lambda: set(driver_on))),
        caches=SimpleNamespace(
            nodes=SimpleNamespace(store={"g0": gpu, "c0": cpu, **more}),
            owned={"DaemonSet": {f"{NS}/{name}": ds for name, ds in daemonsets.items()}},
        ),
        namespace=NS,
    )
    router = EventRouter(fake)
    router.wake = lambda wake: [fake.queue.add(key) for key in wake.keys]  # type: ignore[method-assign]
    return router


def _ds(name: str, nvd: str | None = None) -> dict[str, Any]:
    refs = [{"kind": "NVIDIADriver", "name": nvd, "controller": True}] if nvd else []
    return {"metadata": {"name": name, "ownerReferences": refs}}


def _revision(owner: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"{owner}-5d8f",
            "ownerReferences": [{"kind": "DaemonSet", "name": owner, "uid": "u"}],
        }
    }


def _woken(router: Any, owner: str) -> list[str]:
    router.on_revision("ADDED", None, _revision(owner))
    added: list[str] = router.op.queue.added
    return added


def test_an_operand_revision_wakes_nothing() -> None:
    op = _operator({"nvidia-device-plugin-daemonset": _ds("nvidia-device-plugin-daemonset")})
    assert _woken(op, "nvidia-device-plugin-daemonset") == []


def test_the_policys_driver_revision_wakes_the_fleet_and_a_gpu_node_running_its_pod() -> None:
    op = _operator({"nvidia-driver-daemonset": _ds("nvidia-driver-daemonset")})
    assert _woken(op, "nvidia-driver-daemonset") == [UPGRADES_KEY, node_key("g0")]


def test_an_nvidiadrivers_revision_wakes_the_upgrade_passes() -> None:
    op = _operator({"nvidia-gpu-driver-ubuntu22.04-abc": _ds("x", nvd="default")})
    assert UPGRADES_KEY in _woken(op, "nvidia-gpu-driver-ubuntu22.04-abc")


def test_a_revision_of_a_daemonset_not_yet_cached_counts_as_a_drivers() -> None:
    assert UPGRADES_KEY in _woken(_operator({}), "whatever-daemonset")


def test_a_driver_revision_wakes_only_the_nodes_whose_upgrade_step_reads_it() -> None:
    """A fresh install's driver revision finds no driver pod yet: it woke 1,000 node
    passes at 1,000 nodes that each decided nothing. A node with a driver pod compares
    its revision; one mid-upgrade or failed reads the newest for its retry."""
    op = _operator(
        {"nvidia-driver-daemonset": _ds("nvidia-driver-daemonset")},
        driver_on=("g1",),
        extra_nodes={
            "g1": {STATE_LABEL: "upgrade-done"},
            "g2": {STATE_LABEL: "upgrade-done"},
            "g3": {STATE_LABEL: "upgrade-failed"},
            "g4": {STATE_LABEL: "pod-restart-required"},
        },
    )
    assert _woken(op, "nvidia-driver-daemonset") == [
        UPGRADES_KEY,
        node_key("g1"),
        node_key("g3"),
        node_key("g4"),
    ]
