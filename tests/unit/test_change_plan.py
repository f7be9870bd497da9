"""statemachine.change_plan: what two renders of a policy differ in, per DaemonSet."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from components import RenderContext
from components.context import node_facts
from components.registry import desired_objects
from crd import ClusterPolicySpec, sample_policy
from gpuop.admin_cli.plan import read_policy
from gpuop.admin_cli.validate import _helm
from gpuop.upgrades_cli._snapshot import PlanError
from statemachine.change_plan import driver_changed, driver_digest, plan_change
from statemachine.fleet_plan import PlanNode, UpgradePlan

NS = "gpu-operator"


def _node(name: str, **labels: str) -> dict[str, Any]:
    base = {
        "feature.node.kubernetes.io/pci-10de.present": "true",
        "feature.node.kubernetes.io/system-os_release.ID": "ubuntu",
        "feature.node.kubernetes.io/system-os_release.VERSION_ID": "22.04",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.deploy.driver": "true",
        "nvidia.com/gpu.deploy.container-toolkit": "true",
        "nvidia.com/gpu.deploy.device-plugin": "true",
    }
    return {"metadata": {"name": name, "labels": {**base, **labels}}}


NODES = [_node("a"), _node("b"), _node("c", **{"nvidia.com/gpu.deploy.device-plugin": "false"})]


def _render(spec_doc: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    spec = ClusterPolicySpec.model_validate(spec_doc)
    ctx = RenderContext(
        namespace=NS, operator_image="gpuop:test", gpu_nodes=tuple(node_facts(n) for n in NODES)
    )
    return desired_objects(spec, ctx)


def _gpu_pod(name: str, node: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "team"},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
        "status": {"phase": "Running"},
    }


def test_an_unchanged_policy_rolls_nothing() -> None:
    doc = sample_policy()["spec"]
    plan = plan_change(
        _render(doc), _render(doc), NODES, [], max_unavailable="1", driver_plan=None, namespace=NS
    )
    assert plan.rolling == ()
    assert plan.objects == ()


def test_a_toolkit_change_restarts_the_runtime_where_the_toolkit_runs() -> None:
    doc = sample_policy()["spec"]
    new = copy.deepcopy(doc)
    new.setdefault("toolkit", {})["env"] = [{"name": "X", "value": "1"}]
    plan = plan_change(
        _render(doc), _render(new), NODES, [], max_unavailable="1", driver_plan=None, namespace=NS
    )
    (toolkit,) = plan.rolling
    assert toolkit.daemonset == "nvidia-container-toolkit-daemonset"
    assert toolkit.action == "restart"
    assert toolkit.runtime_restart
    assert toolkit.nodes == ("a", "b", "c")
    assert toolkit.steps == 3  # one node at a time


def test_the_device_plugin_rolls_only_where_its_label_selects() -> None:
    doc = sample_policy()["spec"]
    new = copy.deepcopy(doc)
    new.setdefault("devicePlugin", {})["env"] = [{"name": "X", "value": "1"}]
    plan = plan_change(
        _render(doc), _render(new), NODES, [], max_unavailable="50%", driver_plan=None, namespace=NS
    )
    (plugin,) = plan.rolling
    assert plugin.nodes == ("a", "b")
    assert not plugin.runtime_restart
    assert plugin.steps == 1  # 50% of 3 nodes, rounded up: 2 at a time


def test_a_driver_change_takes_the_upgrade_plans_nodes_and_their_gpu_pods() -> None:
    doc = sample_policy()["spec"]
    new = copy.deepcopy(doc)
    new["driver"]["version"] = "580.105.08"
    before, after = _render(doc), _render(new)
    assert driver_changed(before, after)
    (old_ds,) = [o for o in before["driver"] if o["kind"] == "DaemonSet"]
    (new_ds,) = [o for o in after["driver"] if o["kind"] == "DaemonSet"]
    assert driver_digest(old_ds) != driver_digest(new_ds) != ""
    waves = ((PlanNode("a", restart_only=False),), (PlanNode("b", restart_only=True),))
    upgrade = UpgradePlan(
        waves=waves,
        excluded={},
        soak_after_wave=None,
        soak_seconds=0,
        wave_seconds=600,
        unbounded=(),
        up_to_date=(),
    )
    pods = [_gpu_pod("train", "a"), _gpu_pod("infer", "b")]
    plan = plan_change(
        before, after, NODES, pods, max_unavailable="1", driver_plan=upgrade, namespace=NS
    )
    (driver,) = plan.rolling
    assert driver.action == "upgrade"
    assert driver.reinstall == ("a",)
    assert driver.restart_only == ("b",)
    assert driver.gpu_pods == {"a": ("team/train",)}
    assert driver.steps == 2
    assert plan.driver is upgrade


def test_a_component_turned_off_is_removed_and_its_objects_named() -> None:
    doc = sample_policy()["spec"]
    new = copy.deepcopy(doc)
    new.setdefault("dcgmExporter", {})["enabled"] = False
    plan = plan_change(
        _render(doc), _render(new), NODES, [], max_unavailable="1", driver_plan=None, namespace=NS
    )
    removed = {o.daemonset for o in plan.rolling if o.action == "remove"}
    assert removed == {"nvidia-dcgm-exporter"}
    assert "ServiceAccount/nvidia-dcgm-exporter" in plan.objects


needs_helm = pytest.mark.skipif(_helm() is None, reason="no cached Helm (gpuop cluster build)")


@needs_helm
def test_chart_values_are_planned_as_the_clusterpolicy_the_chart_renders(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"toolkit": {"env": [{"name": "X", "value": "1"}]}}))
    policy = read_policy(str(values))
    assert policy["kind"] == "ClusterPolicy"
    assert {"name": "X", "value": "1"} in policy["spec"]["toolkit"]["env"]


def test_a_file_without_one_clusterpolicy_is_one_error(tmp_path: Path) -> None:
    two = tmp_path / "two.yaml"
    doc = sample_policy()
    two.write_text(yaml.safe_dump_all([doc, doc]))
    with pytest.raises(PlanError, match="expected one ClusterPolicy, found 2"):
        read_policy(str(two))
    bad = tmp_path / "bad.yaml"
    broken = copy.deepcopy(doc)
    broken["spec"]["mig"] = {"strategy": "bogus"}
    bad.write_text(yaml.safe_dump(broken))
    with pytest.raises(PlanError, match="invalid ClusterPolicy"):
        read_policy(str(bad))
