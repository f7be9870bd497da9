"""The ClusterPolicies the time-to-ready figures can run (``--policies``).

``sample``: gpuop's own sample policy (:func:`crd.sample_policy`). ``upstream-default``:
the policy NVIDIA's v26.7 chart installs with its default values, as recorded in
``tests/conformance/upstream/default/policy.yaml`` (what a user migrating with the
chart's defaults runs). The operator's run applies the policy; the baseline and the
floor render the same policy, so each ratio compares like with like.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

import crd

UPSTREAM_DEFAULT = (
    Path(__file__).resolve().parent.parent / "conformance" / "upstream" / "default" / "policy.yaml"
)


def _upstream_default() -> dict[str, Any]:
    policy: dict[str, Any] = yaml.safe_load(UPSTREAM_DEFAULT.read_text())
    return policy


POLICIES: dict[str, Callable[[], dict[str, Any]]] = {
    "sample": crd.sample_policy,
    "upstream-default": _upstream_default,
}
"""Name -> the policy object (a fresh one on each call)."""
DEFAULT = "sample"
