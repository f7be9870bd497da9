"""The comparison itself: a changed field is reported where it is, allowlist paths are
literal but for `*`, and an entry that explains nothing is stale."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.conformance._diff import (
    Allowed,
    Difference,
    compare,
    conformance_dir,
    scenarios,
    split,
    stale,
    upstream,
)


def _copy_scenario(tmp_path: Path, mutate: str) -> Path:
    """The default scenario with one upstream field changed."""
    source = conformance_dir() / "default"
    target = tmp_path / "mutated"
    target.mkdir()
    (target / "policy.yaml").write_text((source / "policy.yaml").read_text())
    docs = [d for d in yaml.safe_load_all((source / "rendered.yaml").read_text()) if d]
    for doc in docs:
        if doc.get("kind") == "DaemonSet" and doc["metadata"]["name"] == mutate:
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
        ("DaemonSet/gpu-feature-discovery", "containers[gpu-feature-discovery].privileged"),
        ("DaemonSet/gpu-feature-discovery", "nodeSelector.extra"),
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
        _, labels = upstream(folder)
        assert labels, f"{folder.name}: no NodeLabels document"
