"""Selectors are immutable: ours equal NVIDIA's for every recorded object, so gpuop
adopts the DaemonSets NVIDIA's operator created instead of being refused (422)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conformance._diff import conformance_dir, ours_for, scenarios, uid_hash_named, upstream

SCENARIOS = scenarios(conformance_dir())
SELECTING = ("DaemonSet", "Deployment")


@pytest.mark.parametrize("folder", SCENARIOS, ids=[f.name for f in SCENARIOS])
def test_every_selector_is_upstreams(folder: Path) -> None:
    # An NVIDIADriver's DaemonSet is named (and selected) by a hash of its owner's uid,
    # which the recordings strip: compared with the hash written out on both sides.
    mine = {(o["kind"], o["metadata"]["name"]): o for o in map(uid_hash_named, ours_for(folder)[0])}
    theirs = [uid_hash_named(o) for o in upstream(folder)[0] if o["kind"] in SELECTING]
    assert theirs
    for obj in theirs:
        key = (obj["kind"], obj["metadata"]["name"])
        assert key in mine, key
        assert mine[key]["spec"]["selector"] == obj["spec"]["selector"], key


@pytest.mark.parametrize("folder", SCENARIOS, ids=[f.name for f in SCENARIOS])
def test_our_pods_carry_their_selector(folder: Path) -> None:
    for obj in ours_for(folder)[0]:
        if obj["kind"] in SELECTING:
            labels = obj["spec"]["template"]["metadata"]["labels"]
            wanted = obj["spec"]["selector"]["matchLabels"]
            assert wanted.items() <= labels.items(), obj["metadata"]["name"]
