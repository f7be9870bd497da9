"""The comparison itself: a changed field is reported where it is, allowlist paths are
literal but for `*`, and an entry that explains nothing is stale."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conformance._diff import (
    ABSENT,
    Allowed,
    Difference,
    compare,
    conformance_dir,
    labelled_nodes,
    load_allowlist,
    load_node_labels,
    load_nvidiadrivers,
    load_policy,
    normalize,
    recorded_annotations,
    scenarios,
    served_monitoring_kinds,
    split,
    stale,
    upstream,
)


def _copy_scenario(
    tmp_path: Path, mutate: str, change: Callable[[dict[str, Any]], None] | None = None
) -> Path:
    """The default scenario with upstream's object `mutate` changed (by default: its
    first container unprivileged and an extra node selector)."""
    source = conformance_dir() / "default"
    target = tmp_path / "mutated"
    target.mkdir(parents=True)
    for name in ("policy.yaml", "node-annotations.yaml"):
        (target / name).write_text((source / name).read_text())
    docs = [d for d in yaml.safe_load_all((source / "rendered.yaml").read_text()) if d]
    for doc in docs:
        if doc.get("metadata", {}).get("name") == mutate and change is not None:
            change(doc)
        elif doc.get("kind") == "DaemonSet" and doc["metadata"]["name"] == mutate:
            pod = doc["spec"]["template"]["spec"]
            pod["containers"][0]["securityContext"] = {"privileged": False}
            pod["nodeSelector"]["extra"] = "x"
    (target / "rendered.yaml").write_text(yaml.safe_dump_all(docs))
    return target


def test_a_changed_upstream_field_shows_up_by_path(tmp_path: Path) -> None:
    base = {(d.object, d.path) for d in compare(conformance_dir() / "default")}
    mutated = _copy_scenario(tmp_path, "gpu-feature-discovery")
    new = {(d.object, d.path) for d in compare(mutated)} - base
    assert new == {
        (
            "DaemonSet/gpu-feature-discovery",
            "spec.template.spec.containers[gpu-feature-discovery].securityContext.privileged",
        ),
        ("DaemonSet/gpu-feature-discovery", "spec.template.spec.nodeSelector.extra"),
    }


def test_allowlist_globs_only_on_star() -> None:
    diff = Difference("s", "DaemonSet/a", "initContainers[x].image", "ours", "theirs")
    assert Allowed("*", "DaemonSet/*", "initContainers[x].image", "r").matches(diff)
    assert Allowed("*", "DaemonSet/a", "initContainers[*].image", "r").matches(diff)
    # `[x]` is not a character class: it must match the brackets literally.
    assert not Allowed("*", "DaemonSet/a", "initContainersx.image", "r").matches(diff)
    assert not Allowed("other", "DaemonSet/a", "*", "r").matches(diff)
    entries = [Allowed("*", "DaemonSet/a", "*", "r"), Allowed("*", "DaemonSet/b", "*", "r")]
    allowed, unexplained = split([diff], entries)
    assert (allowed, unexplained) == ([diff], [])
    assert stale([diff], entries) == [entries[1]]


def test_every_scenario_has_node_labels_to_compare() -> None:
    for folder in scenarios():
        assert upstream(folder).labels, f"{folder.name}: no NodeLabels document"


def _annotated_copy(tmp_path: Path, change: Callable[[dict[str, Any]], None]) -> Path:
    """The default scenario with upstream's node annotations changed."""
    source = conformance_dir() / "default"
    target = tmp_path / "annotated"
    target.mkdir(parents=True)
    for name in ("policy.yaml", "rendered.yaml"):
        (target / name).write_text((source / name).read_text())
    document = yaml.safe_load((source / "node-annotations.yaml").read_text())
    change(document["nodes"])
    (target / "node-annotations.yaml").write_text(yaml.safe_dump(document))
    return target


def test_a_missing_or_extra_node_annotation_is_reported(tmp_path: Path) -> None:
    """Node annotations are compared like node labels, one Difference per key (the
    hand-off annotation our node pass writes, and a cordon), so the allowlist can
    target each."""
    handoff = "nvidia.com/gpu-driver-upgrade-enabled"
    default = compare(conformance_dir() / "default")
    # Ours: the hand-off annotation on every GPU node, as upstream's.
    assert not [d for d in default if d.object.startswith("Node/") and "annotations." in d.path]

    def change(nodes: dict[str, dict[str, str]]) -> None:
        del nodes["gpu-node-0001"][handoff]  # upstream lacks it: ours is extra
        nodes["gpu-node-0002"]["nvidia.com/extra"] = "x"  # ours lacks it
        nodes["gpu-node-0003"]["(spec.unschedulable)"] = "true"  # upstream's node cordoned

    diffs = {
        (d.object, d.path, d.ours, d.upstream)
        for d in compare(_annotated_copy(tmp_path, change))
        if d.object.startswith("Node/") and d.path.startswith("annotations.")
    }
    assert diffs == {
        ("Node/gpu-node-0001", f"annotations.{handoff}", "true", ABSENT),
        ("Node/gpu-node-0002", "annotations.nvidia.com/extra", ABSENT, "x"),
        ("Node/gpu-node-0003", "annotations.(spec.unschedulable)", ABSENT, "true"),
    }
    # A label entry does not explain an annotation: `Node/*` paths are distinct.
    unexplained = split(compare(_annotated_copy(tmp_path / "2", change)), load_allowlist())[1]
    assert {d.path for d in unexplained} == {p for _, p, _, _ in diffs}


def test_the_handoff_annotation_follows_each_nvidiadrivers_auto_upgrade(tmp_path: Path) -> None:
    """Our side of an NVIDIADriver scenario comes from the resources: with the pinned
    resource upgrading automatically too, its node gets the annotation (and an upgrade
    state) that upstream's recording does not have."""
    source = conformance_dir() / "nvidiadriver-pools"
    recorded = recorded_annotations(source)
    assert recorded is not None
    assert {n for n, a in recorded.items() if a} == {"gpu-node-0000"}
    for name in ("policy.yaml", "rendered.yaml"):
        (tmp_path / name).write_text((source / name).read_text())
    drivers = list(yaml.safe_load_all((source / "nvidiadrivers.yaml").read_text()))
    for driver in drivers:
        driver["spec"]["upgradePolicy"]["autoUpgrade"] = True
    (tmp_path / "nvidiadrivers.yaml").write_text(yaml.safe_dump_all(drivers))
    unexplained = split(compare(tmp_path), load_allowlist())[1]
    assert {(d.object, d.path) for d in unexplained if d.object.startswith("Node/")} == {
        ("Node/gpu-node-0002", "annotations.nvidia.com/gpu-driver-upgrade-enabled")
    }
    assert len(load_nvidiadrivers(tmp_path)) == 2


def test_served_prometheus_kinds_come_from_the_scenario(tmp_path: Path) -> None:
    """`prometheus-crds.yaml` says which Prometheus Operator kinds the recording cluster
    served; without it we render no ServiceMonitor and upstream's show as missing."""
    source = conformance_dir() / "monitoring-servicemonitors"
    assert served_monitoring_kinds(source) == {"ServiceMonitor", "PrometheusRule"}
    assert served_monitoring_kinds(conformance_dir() / "default") == frozenset()
    for name in ("policy.yaml", "rendered.yaml"):
        (tmp_path / name).write_text((source / name).read_text())
    missing = {d.object for d in compare(tmp_path) if d.ours == ABSENT and not d.path}
    assert missing == {
        "ServiceMonitor/gpu-operator",
        "ServiceMonitor/nvidia-dcgm-exporter",
        "ServiceMonitor/nvidia-node-status-exporter",
    }


def _new_paths(tmp_path: Path, name: str, change: Callable[[dict[str, Any]], None]) -> set[str]:
    """Where a difference appears or changes once upstream's object is changed."""
    base = {(d.object, d.path, d.ours, d.upstream) for d in compare(conformance_dir() / "default")}
    mutated = _copy_scenario(tmp_path, name, change)
    after = {(d.object, d.path, d.ours, d.upstream) for d in compare(mutated)}
    return {f"{o} {p}" for o, p, _, _ in after - base}


def test_every_field_counts_not_a_chosen_few(tmp_path: Path) -> None:
    """Probes, resources, lifecycle, pod-level fields, labels, selectors, Service
    ports and RBAC rules: fields the old, narrow comparison never looked at."""

    def driver(doc: dict[str, Any]) -> None:
        pod = doc["spec"]["template"]["spec"]
        main = pod["containers"][0]
        main["startupProbe"]["periodSeconds"] = 99
        main["resources"] = {"limits": {"memory": "1Gi"}}
        main["lifecycle"]["preStop"] = {"exec": {"command": ["true"]}}
        pod["dnsPolicy"] = "Default"
        doc["spec"]["selector"]["matchLabels"]["extra"] = "x"
        doc["spec"]["template"]["metadata"]["labels"]["extra"] = "x"

    assert _new_paths(tmp_path, "nvidia-driver-daemonset", driver) == {
        f"DaemonSet/nvidia-driver-daemonset {p}"
        for p in (
            "spec.template.spec.containers[nvidia-driver-ctr].startupProbe.periodSeconds",
            "spec.template.spec.containers[nvidia-driver-ctr].resources.limits",
            "spec.template.spec.containers[nvidia-driver-ctr].lifecycle.preStop.exec.command",
            "spec.template.spec.dnsPolicy",
            "spec.selector.matchLabels.extra",
            "spec.template.metadata.labels.extra",
        )
    }


def test_script_contents_and_rules_count(tmp_path: Path) -> None:
    def script(doc: dict[str, Any]) -> None:
        if doc["kind"] == "ConfigMap":
            doc["data"]["entrypoint.sh"] += "\necho extra\n"

    assert _new_paths(tmp_path, "nvidia-mig-manager-entrypoint", script) == {
        "ConfigMap/nvidia-mig-manager-entrypoint data.entrypoint.sh"
    }

    def rules(doc: dict[str, Any]) -> None:
        if doc["kind"] == "Role":
            doc["rules"].append({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]})

    assert _new_paths(tmp_path / "r", "nvidia-driver", rules) == {
        "Role/nvidia-driver rules[core/secrets:get]"
    }


def test_server_defaults_are_not_differences() -> None:
    """A field the API server fills in (or drops: an empty env value) is the same
    object whether or not the render spells it out."""
    ours = {
        "kind": "DaemonSet",
        "metadata": {"name": "x"},
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {"name": "c", "image": "i:1", "env": [{"name": "E", "value": ""}]}
                    ]
                }
            }
        },
    }
    stored = normalize(ours)
    container = stored["spec"]["template"]["spec"]["containers"][0]
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert container["env"] == [{"name": "E"}]
    assert stored["spec"]["updateStrategy"]["rollingUpdate"] == {
        "maxUnavailable": 1,
        "maxSurge": 0,
    }
    assert normalize(stored) == stored


def test_upgrade_label_is_the_upgrade_machines(tmp_path: Path) -> None:
    """The node label comes from our upgrade machine, so it follows the policy: with
    auto-upgrade off the machine writes no state."""
    folder = conformance_dir() / "default"
    spec, _ = load_policy(folder)
    states = {
        n["metadata"]["labels"].get("nvidia.com/gpu-driver-upgrade-state")
        for n in labelled_nodes(spec)
        if n["metadata"]["labels"].get("nvidia.com/gpu.present") == "true"
    }
    assert states == {"upgrade-done"}
    policy = yaml.safe_load((folder / "policy.yaml").read_text())
    policy["spec"]["driver"]["upgradePolicy"]["autoUpgrade"] = False
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(policy))
    off, _ = load_policy(tmp_path)
    assert not any(
        "nvidia.com/gpu-driver-upgrade-state" in n["metadata"]["labels"]
        for n in labelled_nodes(off)
    )


def test_a_scenarios_node_labels_are_applied_before_labelling(tmp_path: Path) -> None:
    """`node-labels.yaml` is on the nodes before our labeller runs, as it was before
    upstream's operator started: without it the mixed fleet would render as all-container
    and the comparison would report every VM host's labels."""
    folder = conformance_dir() / "sandbox-mixed-kata"
    assert load_node_labels(folder)["gpu-node-0001"] == {
        "nvidia.com/gpu.workload.config": "vm-passthrough"
    }
    allowlist = load_allowlist()
    assert not [d for d in split(compare(folder), allowlist)[1] if d.object.startswith("Node/")]
    for name in ("policy.yaml", "rendered.yaml"):
        (tmp_path / name).write_text((folder / name).read_text())
    unexplained = split(compare(tmp_path), allowlist)[1]
    node_diffs = [d for d in unexplained if d.object.startswith("Node/")]
    assert {d.object for d in node_diffs} == {"Node/gpu-node-0001", "Node/gpu-node-0002"}
    (tmp_path / "node-labels.yaml").write_text(yaml.safe_dump({"gpu-node-0042": {"a": "b"}}))
    with pytest.raises(ValueError, match="gpu-node-0042"):
        compare(tmp_path)
