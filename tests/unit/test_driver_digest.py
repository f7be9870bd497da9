"""DRIVER_CONFIG_DIGEST: upstream's value for the same policy, and only install inputs.

The recorded upstream objects (tests/conformance/upstream/) carry the value NVIDIA's
operator computed; a node it set up keeps its driver under gpuop only if ours is equal.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from components import driver, driver_digest
from components.context import KERNEL_LABEL
from tests.conformance._diff import conformance_dir, load_policy, ours, scenarios, upstream

SCENARIOS = [
    f
    for f in scenarios(conformance_dir())
    if any(
        o["kind"] == "DaemonSet" and o["metadata"]["name"] == driver.DAEMONSET_NAME
        for o in upstream(f)[0]
    )
]


def _driver_daemonsets(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        o
        for o in objects
        if o["kind"] == "DaemonSet" and o["metadata"]["name"].startswith(driver.DAEMONSET_NAME)
    ]


def _recorded(ds: dict[str, Any]) -> set[str]:
    pod = ds["spec"]["template"]["spec"]
    return {
        str(v["value"])
        for ctr in [*pod.get("initContainers", []), *pod["containers"]]
        for v in ctr.get("env", [])
        if v["name"] == driver.CONFIG_DIGEST_ENV
    }


def test_the_recordings_have_driver_scenarios() -> None:
    assert len(SCENARIOS) >= 3


@pytest.mark.parametrize("folder", SCENARIOS, ids=[f.name for f in SCENARIOS])
def test_upstreams_pod_spec_hashes_to_upstreams_recorded_digest(folder: Path) -> None:
    """The algorithm: upstream's own pod spec gives the value upstream wrote into it."""
    (ds,) = _driver_daemonsets(upstream(folder)[0])
    (recorded,) = _recorded(ds)
    assert driver_digest.digest(ds["spec"]["template"]["spec"]) == recorded


@pytest.mark.parametrize("folder", SCENARIOS, ids=[f.name for f in SCENARIOS])
def test_our_digest_equals_upstreams_for_the_same_policy(folder: Path) -> None:
    spec, _ = load_policy(folder)
    (theirs,) = _driver_daemonsets(upstream(folder)[0])
    (mine,) = _driver_daemonsets(ours(spec)[0])
    assert _recorded(mine) == _recorded(theirs)


def test_precompiled_digest_equals_upstreams_per_kernel_daemonset() -> None:
    """Upstream makes a precompiled DaemonSet from the regular one by changing only the
    driver image (`<repo>/<image>:<branch>-<kernel>-<os>`), name, labels and node
    selector before hashing: applied to the recorded default DaemonSet, that gives the
    digest upstream writes, and ours must equal it for every kernel."""
    folder = conformance_dir() / "default"
    base, _ = load_policy(folder)
    spec = base.model_copy(
        update={
            "driver": base.driver.model_copy(update={"use_precompiled": True, "version": "595"})
        }
    )
    (recorded,) = _driver_daemonsets(upstream(folder)[0])
    mine = _driver_daemonsets(ours(spec)[0])
    assert mine, "no precompiled DaemonSet rendered"
    for ds in mine:
        kernel = ds["spec"]["template"]["spec"]["nodeSelector"][KERNEL_LABEL]
        pod = copy.deepcopy(recorded["spec"]["template"]["spec"])
        ctr = next(x for x in pod["containers"] if x["name"] == driver.CONTAINER_NAME)
        repository, tag = ctr["image"].rsplit(":", 1)
        ctr["image"] = f"{repository}:595-{kernel}-{tag.rsplit('-', 1)[1]}"
        assert _recorded(ds) == {driver_digest.digest(pod)}, kernel
    assert len({d for ds in mine for d in _recorded(ds)}) == len(mine)


def _default_driver(**driver_section: Any) -> str:
    spec, _ = load_policy(conformance_dir() / "default")
    merged = spec.model_validate(
        {
            **spec.model_dump(by_alias=True, exclude_none=True),
            "driver": {
                **spec.driver.model_dump(by_alias=True, exclude_none=True),
                **driver_section,
            },
        }
    )
    (ds,) = _driver_daemonsets(ours(merged)[0])
    (value,) = _recorded(ds)
    return value


RESTART_ONLY = {
    "startup probe": {"startupProbe": {"initialDelaySeconds": 5, "periodSeconds": 3}},
    "liveness probe": {"livenessProbe": {"periodSeconds": 7}},
    "readiness probe": {"readinessProbe": {"periodSeconds": 9}},
    "resources": {"resources": {"limits": {"memory": "2Gi"}, "requests": {"cpu": "500m"}}},
    "pull secrets": {"imagePullSecrets": ["regcred"]},
    "pull policy": {"imagePullPolicy": "Always"},
}


@pytest.mark.parametrize("change", RESTART_ONLY.values(), ids=list(RESTART_ONLY))
def test_a_restart_only_change_keeps_the_digest(change: dict[str, Any]) -> None:
    assert _default_driver(**change) == _default_driver()


INSTALL = {
    "version": {"version": "580.95.05"},
    "env": {"env": [{"name": "NVIDIA_DRIVER_FOO", "value": "1"}]},
    "kernel module type": {"kernelModuleType": "proprietary"},
    "args": {"args": ["--debug"]},
}


@pytest.mark.parametrize("change", INSTALL.values(), ids=list(INSTALL))
def test_an_install_change_changes_the_digest(change: dict[str, Any]) -> None:
    assert _default_driver(**change) != _default_driver()


def test_pod_wide_settings_keep_the_digest() -> None:
    """Labels, annotations, tolerations and priority class are the DaemonSet's, not the
    installed driver's."""
    spec, _ = load_policy(conformance_dir() / "default")
    (before,) = _driver_daemonsets(ours(spec)[0])
    changed = spec.model_validate(
        {
            **spec.model_dump(by_alias=True, exclude_none=True),
            "daemonsets": {
                **spec.daemonsets.model_dump(by_alias=True, exclude_none=True),
                "annotations": {"example.com/team": "gpu"},
                "labels": {"example.com/cost": "a"},
                "priorityClassName": "other",
                "tolerations": [{"key": "x", "operator": "Exists"}],
            },
        }
    )
    (after,) = _driver_daemonsets(ours(changed)[0])
    assert after["spec"]["template"] != before["spec"]["template"]
    assert _recorded(after) == _recorded(before)


def test_downward_api_variables_and_the_digest_itself_do_not_count() -> None:
    pod: dict[str, Any] = {
        "containers": [
            {
                "name": driver.CONTAINER_NAME,
                "image": "i",
                "env": [{"name": "A", "value": "1"}, {"name": driver.CONFIG_DIGEST_ENV}],
            }
        ]
    }
    before = driver_digest.digest(pod)
    pod["containers"][0]["env"] += [
        {"name": "N", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
    ]
    pod["containers"][0]["env"][1]["value"] = "123"
    assert driver_digest.digest(pod) == before
    pod["containers"][0]["env"][0]["value"] = "2"
    assert driver_digest.digest(pod) != before
