"""Default operand images are upstream v26.7's chart defaults (tests/data/upstream)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from crd._images import DEFAULT_IMAGES

UPSTREAM_VALUES = Path(__file__).parent.parent / "data" / "upstream" / "values.yaml"

#: Sections whose default is ours on purpose, with why.
OURS: dict[str, str] = {
    "validator": "our node agent image runs the validation, not nvidia-validator",
    "nodeStatusExporter": "our node agent image serves the node metrics",
    "operator.initContainer": "upstream's chart no longer sets it; kept for old policies",
    "kataManager": "deprecated upstream; not in v26.7's values",
}


def _section(values: dict[str, Any], path: str) -> dict[str, Any] | None:
    node: Any = values
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node if isinstance(node, dict) else None


@pytest.mark.parametrize("path", sorted(set(DEFAULT_IMAGES) - set(OURS)))
def test_default_image_is_upstreams(path: str) -> None:
    section = _section(yaml.safe_load(UPSTREAM_VALUES.read_text()), path)
    assert section is not None, f"{path}: not in upstream's values.yaml; list it in OURS"
    ours = DEFAULT_IMAGES[path]
    assert (ours.repository, ours.image, ours.version) == (
        section["repository"],
        section["image"],
        str(section["version"]),
    )


def test_every_listed_exception_is_still_a_default() -> None:
    assert set(OURS) <= set(DEFAULT_IMAGES)
