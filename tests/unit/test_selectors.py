"""Selectors are immutable: ours equal NVIDIA's for every recorded object, so gpuop
adopts the DaemonSets NVIDIA's operator created instead of being refused (422)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conformance._diff import (
    conformance_dir,
    load_node_labels,
    load_policy,
    ours,
    scenarios,
    upstream,
)

SCENARIOS = scenarios(conformance_dir())
SELECTING = ("DaemonSet", "Deployment")


@pytest.mark.parametrize("folder", SCENARIOS, ids=[f.name for f in SCENARIOS])
def test_every_selector_is_upstreams(folder: Path) -> None:
    spec, _ = load_policy(folder)
    objects = ours(spec, load_node_labels(folder))[0]
    mine = {(o["kind"], o["metadata"]["name"]): o for o in objects}
    theirs = [o for o in upstream(folder)[0] if o["kind"] in SELECTING]
    assert theirs
    for obj in theirs:
        key = (obj["kind"], obj["metadata"]["name"])
        assert key in mine, key
        assert mine[key]["spec"]["selector"] == obj["spec"]["selector"], key


@pytest.mark.parametrize("folder", SCENARIOS, ids=[f.name for f in SCENARIOS])
def test_our_pods_carry_their_selector(folder: Path) -> None:
    spec, _ = load_policy(folder)
    for obj in ours(spec, load_node_labels(folder))[0]:
        if obj["kind"] in SELECTING:
            labels = obj["spec"]["template"]["metadata"]["labels"]
            wanted = obj["spec"]["selector"]["matchLabels"]
            assert wanted.items() <= labels.items(), obj["metadata"]["name"]
