"""New workloads wait for the deploy labels, at most LABEL_WAIT_MAX_S, and only new ones."""

from __future__ import annotations

from typing import Any

import pytest

import crd
from components.labels import apply_label_changes, node_label_changes
from crd import ClusterPolicySpec, parse_policy
from gpuop.operator.controller.views.label_gate import RECHECK_S, LabelGate, adds_labels
from tests.factories import node

GPU = {"feature.node.kubernetes.io/pci-10de.present": "true"}
POLICY = ("uid-1", 1)


def _spec() -> ClusterPolicySpec:
    model, problems = parse_policy(crd.sample_policy())
    assert model is not None
    assert not problems
    return model.spec


def _node(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return node(name, labels)


def _labelled(name: str, spec: ClusterPolicySpec) -> dict[str, Any]:
    return _node(name, apply_label_changes(GPU, node_label_changes(GPU, spec)))


def _obj(kind: str, name: str) -> dict[str, Any]:
    return {"kind": kind, "metadata": {"name": name, "namespace": "gpu-operator"}}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


DS = _obj("DaemonSet", "nvidia-driver-daemonset")
CM = _obj("ConfigMap", "default-mig-parted-config")


def test_a_new_daemonset_waits_while_a_gpu_node_lacks_its_deploy_labels() -> None:
    spec, clock = _spec(), Clock()
    gate = LabelGate(clock=clock, max_wait_s=60)
    nodes = [_labelled("a", spec), _node("b", dict(GPU))]
    held, again = gate.hold([CM, DS], lambda o: False, nodes, spec, POLICY, 1)
    assert held == [DS]  # the ConfigMap is applied at once
    assert again == RECHECK_S  # counted again soon, in memory
    assert gate.waiting_nodes == 1


def test_it_is_created_once_every_gpu_node_is_labelled() -> None:
    spec = _spec()
    gate = LabelGate(clock=Clock())
    nodes = [_labelled("a", spec), _labelled("b", spec)]
    assert all(not adds_labels(n, spec) for n in nodes)
    assert gate.hold([CM, DS], lambda o: False, nodes, spec, POLICY, 1) == ([], None)
    assert gate.waiting_nodes == 0


def test_an_existing_daemonset_is_never_held_so_a_joining_node_delays_no_update() -> None:
    spec = _spec()
    gate = LabelGate(clock=Clock())
    nodes = [_labelled("a", spec), _node("new", dict(GPU))]
    held, again = gate.hold([CM, DS], lambda o: o is DS, nodes, spec, POLICY, 1)
    assert (held, again) == ([], None)


def test_the_wait_ends_at_the_deadline_even_if_a_node_is_never_labelled() -> None:
    spec, clock = _spec(), Clock()
    gate = LabelGate(clock=clock, max_wait_s=60)
    nodes = [_node("refused", dict(GPU))]
    assert gate.hold([DS], lambda o: False, nodes, spec, POLICY, 1)[0] == [DS]
    clock.now += 45
    held, again = gate.hold([DS], lambda o: False, nodes, spec, POLICY, 1)
    assert held == [DS]
    assert again == RECHECK_S
    clock.now += 14.9
    assert gate.hold([DS], lambda o: False, nodes, spec, POLICY, 1) == ([DS], pytest.approx(0.1))
    clock.now += 0.1
    assert gate.hold([DS], lambda o: False, nodes, spec, POLICY, 1) == ([], None)


def test_a_new_generation_waits_afresh_for_its_own_labels() -> None:
    spec, clock = _spec(), Clock()
    gate = LabelGate(clock=clock, max_wait_s=60)
    nodes = [_node("b", dict(GPU))]
    gate.hold([DS], lambda o: False, nodes, spec, POLICY, 1)
    clock.now += 70
    assert gate.hold([DS], lambda o: False, nodes, spec, POLICY, 1)[0] == []
    held, again = gate.hold([DS], lambda o: False, nodes, spec, ("uid-1", 2), 1)
    assert held == [DS]
    assert again == RECHECK_S


def test_the_fleet_is_counted_again_only_when_the_node_cache_changed() -> None:
    spec = _spec()
    gate = LabelGate(clock=Clock())
    nodes = [_node("b", dict(GPU))]
    gate.hold([DS], lambda o: False, nodes, spec, POLICY, 1)
    assert gate.waiting_nodes == 1
    nodes[0] = _labelled("b", spec)
    gate.hold([DS], lambda o: False, nodes, spec, POLICY, 1)
    assert gate.waiting_nodes == 1  # same cache version: the count is reused
    assert gate.hold([DS], lambda o: False, nodes, spec, POLICY, 2) == ([], None)
    assert gate.waiting_nodes == 0


def test_a_label_only_being_removed_does_not_hold_anything() -> None:
    spec = _spec()
    gate = LabelGate(clock=Clock())
    # A CPU node (NFD labels it, no NVIDIA device) that still carries gpu.present: the
    # pass removes it, adds nothing.
    kernel = "feature.node.kubernetes.io/kernel-version.full"
    cpu = _node("cpu", {kernel: "5.15", "nvidia.com/gpu.present": "true"})
    assert node_label_changes(cpu["metadata"]["labels"], spec)
    assert not adds_labels(cpu, spec)
    assert gate.hold([DS], lambda o: False, [cpu], spec, POLICY, 1) == ([], None)
