"""Our rendering against upstream v26.7's, scenario by scenario (see tests.conformance._diff).

`python -m tests.conformance --all` prints every difference, allowlisted or not.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conformance._diff import (
    Difference,
    compare,
    conformance_dir,
    load_allowlist,
    recorded_annotations,
    scenarios,
    split,
    stale,
)

ROOT = conformance_dir()
SCENARIOS = scenarios(ROOT)


def test_conformance_data_is_present() -> None:
    """The recorded data is in the repository: without it the comparison would silently
    not run."""
    assert ROOT.is_dir(), f"no conformance data at {ROOT} (set GPUOP_CONFORMANCE_DIR)"
    assert SCENARIOS, f"no scenario (a folder with policy.yaml) under {ROOT}"
    for folder in SCENARIOS:
        assert (folder / "rendered.yaml").is_file(), f"{folder.name} has no rendered.yaml"
        # The GPU nodes' annotations: a NodeAnnotations document in rendered.yaml, or
        # node-annotations.yaml beside it (recordings from before they were kept).
        assert recorded_annotations(folder) is not None, f"{folder.name}: no node annotations"


def _report(diffs: list[Difference]) -> str:
    return "\n".join(f"  {d}" for d in diffs)


@pytest.mark.parametrize("folder", SCENARIOS, ids=[f.name for f in SCENARIOS])
def test_renders_what_upstream_renders(folder: Path) -> None:
    _, unexplained = split(compare(folder), load_allowlist())
    assert not unexplained, (
        f"{len(unexplained)} difference(s) from upstream no allowlist entry explains "
        f"(fix them, or add a reviewed entry to tests/conformance/allowlist.yaml):\n"
        + _report(unexplained)
    )


def test_allowlist_has_no_stale_entries() -> None:
    allowlist = load_allowlist()
    diffs = [d for folder in SCENARIOS for d in compare(folder)]
    unused = stale(diffs, allowlist)
    assert not unused, "allowlist entries that explain no difference any more:\n" + "\n".join(
        f"  {e.scenario} {e.object} {e.path}" for e in unused
    )


def test_every_allowlist_entry_has_a_reason() -> None:
    assert all(len(e.reason.split()) >= 5 for e in load_allowlist())
