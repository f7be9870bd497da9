"""The chart's maintenance-window values: they become the ClusterPolicy's (and the
default NVIDIADriver's) window annotations, read back by the operator's own parser."""

from __future__ import annotations

import pytest

from statemachine.maintenance_window import (
    TIMEZONE_ANNOTATION,
    WINDOWS_ANNOTATION,
    parse_schedule,
)
from tests.integration.helm_chart import documents, one, template

pytestmark = pytest.mark.integration


def test_maintenance_window_values_annotate_the_policy_and_the_default_nvidiadriver() -> None:
    docs = documents(
        template(
            "--set",
            "driver.upgradePolicy.maintenanceWindows={0 22 * * 1-5 6h,0 0 * * sat 2d}",
            "--set",
            "driver.upgradePolicy.maintenanceTimeZone=Europe/Berlin",
            "--set",
            "driver.nvidiaDriverCRD.enabled=true",
            "--set",
            "driver.nvidiaDriverCRD.deployDefaultCR=true",
        )
    )
    for kind, name in (("ClusterPolicy", "cluster-policy"), ("NVIDIADriver", "default")):
        annotations = one(docs, kind, name)["metadata"]["annotations"]
        assert annotations[WINDOWS_ANNOTATION] == "0 22 * * 1-5 6h; 0 0 * * sat 2d"
        assert annotations[TIMEZONE_ANNOTATION] == "Europe/Berlin"
        schedule = parse_schedule(annotations)
        assert schedule is not None
        assert [w.describe() for w in schedule.windows] == ["0 22 * * 1-5 6h", "0 0 * * sat 2d"]


def test_no_windows_by_default_so_upgrades_start_any_time() -> None:
    policy = one(documents(template()), "ClusterPolicy", "cluster-policy")
    assert WINDOWS_ANNOTATION not in (policy["metadata"].get("annotations") or {})
