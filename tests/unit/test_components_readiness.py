"""DaemonSet readiness as the rollout sees it."""

from __future__ import annotations

from typing import Any

import pytest

from components import component_ready, daemonset_ready


def ds(
    *,
    generation: int = 2,
    observed: int | None = 2,
    desired: int = 4,
    available: int = 4,
    unavailable: int | None = 0,
    updated: int = 4,
    strategy: str = "RollingUpdate",
    name: str = "nvidia-device-plugin-daemonset",
) -> dict[str, Any]:
    status: dict[str, Any] = {
        "desiredNumberScheduled": desired,
        "numberAvailable": available,
        "updatedNumberScheduled": updated,
    }
    if observed is not None:
        status["observedGeneration"] = observed
    if unavailable is not None:
        status["numberUnavailable"] = unavailable
    return {
        "kind": "DaemonSet",
        "metadata": {"name": name, "generation": generation},
        "spec": {"updateStrategy": {"type": strategy}},
        "status": status,
    }


def test_all_available_and_updated_is_ready() -> None:
    assert daemonset_ready(ds()) == (True, "4/4 pods available")


def test_absent_unavailable_counts_as_zero() -> None:
    assert daemonset_ready(ds(unavailable=None))[0]


def test_no_matching_nodes_is_ready() -> None:
    assert daemonset_ready(ds(desired=0, available=0, updated=0)) == (True, "no nodes to run on")


def test_missing_pods() -> None:
    assert daemonset_ready(ds(available=3, unavailable=1)) == (False, "3/4 pods available")
    assert daemonset_ready(ds(available=3, unavailable=None)) == (False, "3/4 pods available")


def test_unavailable_pods_block_even_when_counts_look_fine() -> None:
    ready, message = daemonset_ready(ds(unavailable=1))
    assert not ready
    assert "4/4" in message


def test_old_revision_blocks_rolling_update() -> None:
    assert daemonset_ready(ds(updated=2)) == (False, "2/4 pods updated")


def test_on_delete_skips_the_revision_check() -> None:
    assert daemonset_ready(ds(updated=2, strategy="OnDelete"))[0]
    assert not daemonset_ready(ds(available=1, unavailable=3, strategy="OnDelete"))[0]


@pytest.mark.parametrize("observed", [None, 1])
def test_unobserved_generation_is_not_ready(observed: int | None) -> None:
    ready, message = daemonset_ready(ds(observed=observed))
    assert not ready
    assert "observed" in message
    # Not even when the stale status says it wants no pods (a DaemonSet just created).
    assert not daemonset_ready(ds(observed=observed, desired=0, available=0, updated=0))[0]


def test_newly_created_without_status() -> None:
    fresh = {"kind": "DaemonSet", "metadata": {"name": "x", "generation": 1}, "spec": {}}
    assert not daemonset_ready(fresh)[0]


def test_newer_observed_generation_is_fine() -> None:
    assert daemonset_ready(ds(generation=2, observed=3))[0]


def test_component_ready() -> None:
    desired = [
        {"kind": "ServiceAccount", "metadata": {"name": "sa"}},
        {"kind": "DaemonSet", "metadata": {"name": "a"}},
        {"kind": "DaemonSet", "metadata": {"name": "b"}},
    ]
    assert component_ready(desired, {"a": ds(name="a"), "b": ds(name="b")}) == (True, "ready")
    ready, message = component_ready(desired, {"a": ds(name="a", available=1)})
    assert not ready
    assert message == "a: 1/4 pods available; b: not created yet"
    assert component_ready([{"kind": "Service", "metadata": {"name": "s"}}], {}) == (
        True,
        "ready",
    )
