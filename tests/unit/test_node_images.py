"""The driver manager's rules as the node-image simulator plays them
(``gpuop/devcluster/_driver_manager.py``), rule by rule against NVIDIA/k8s-driver-manager's
``cmd/driver-manager/main.go``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest

from gpuop.devcluster import _driver_manager as dm

NODE = "gpu-node-0000"
PAUSED = dm.PAUSED
BASE_ENV = {"NODE_NAME": NODE, "OPERATOR_NAMESPACE": "gpu-operator", "DRIVER_CONFIG_DIGEST": "d2"}
DEPLOY_TRUE = {
    dm.VALIDATOR: "true",
    dm.TOOLKIT: "true",
    dm.DEVICE_PLUGIN: "true",
    dm.GFD: "true",
    dm.DCGM_EXPORTER: "true",
    dm.DCGM: "false",
}
LOADED_OLD = dm.DriverState(loaded=True, stored_digest="d1")
LOADED_SAME = dm.DriverState(loaded=True, stored_digest="d2")
FRESH = dm.DriverState()
ALLOCATING = {"cordon", "uncordon", "evict-gpu-pods", "drain"}


def node(
    labels: Mapping[str, str] | None = None, annotations: Mapping[str, str] | None = None
) -> dm.NodeView:
    return dm.NodeView(dict(DEPLOY_TRUE if labels is None else labels), dict(annotations or {}))


POLICY = {dm.UPGRADE_ENABLED_ANNOTATION: "true"}


def env(**extra: str) -> dict[str, str]:
    return {**BASE_ENV, **extra}


def walk(steps: Sequence[dm.Step]) -> Iterator[dm.Step]:
    """Every step of a plan, on every branch (fallbacks included)."""
    for step in steps:
        yield step
        yield from walk(step.on_failure)


def kinds(steps: Sequence[dm.Step]) -> list[str]:
    """The main path, with the operand waits folded into one entry."""
    result: list[str] = []
    for step in steps:
        if step.kind == "wait-pods-gone" and result and result[-1] == "wait-pods-gone":
            continue
        result.append(step.kind)
    return result


def played(
    steps: Sequence[dm.Step], failing: set[str] | None = None
) -> tuple[list[str], dm.Outcome]:
    """Play ``steps`` with every kind in ``failing`` failing (each time)."""
    done: list[str] = []

    async def act(step: dm.Step) -> bool:
        if step.kind == "wait-pods-gone":
            if not done or done[-1] != "wait-pods-gone":
                done.append(step.kind)
        else:
            done.append(step.kind)
        return step.kind not in (failing or set())

    outcome = asyncio.run(dm.play(steps, act))
    return done, outcome


# ----------------------------------------------------------------- label values
@pytest.mark.parametrize(
    ("value", "paused"),
    [
        ("", ""),
        ("false", "false"),
        ("true", PAUSED),
        (PAUSED, PAUSED),
        ("custom", f"custom_{PAUSED}"),
        (f"custom_{PAUSED}", f"custom_{PAUSED}"),
    ],
)
def test_maybe_set_paused(value: str, paused: str) -> None:
    """main.go:maybeSetPaused: "false" is the administrator's and stays false."""
    assert dm.maybe_set_paused(value) == paused


@pytest.mark.parametrize(
    ("value", "back"),
    [
        ("false", "false"),
        (PAUSED, "true"),
        (f"custom_{PAUSED}", "custom"),
        ("true", "true"),
        ("", ""),
        (f"{PAUSED}_{PAUSED}", ""),
    ],
)
def test_maybe_set_true(value: str, back: str) -> None:
    """main.go:maybeSetTrue: the paused marker and its underscores go."""
    assert dm.maybe_set_true(value) == back


@pytest.mark.parametrize("value", ["true", "false", "", "custom", "a_b", PAUSED])
def test_pause_then_reschedule_round_trips(value: str) -> None:
    expected = "true" if value == PAUSED else value
    assert dm.maybe_set_true(dm.maybe_set_paused(value)) == expected


def test_pause_patch_keeps_false_writes_absent_as_empty_and_optional_only_when_set() -> None:
    """evictAllGPUOperatorComponents writes a plain map: absent labels become "";
    mig-manager, the custom label and gpu clients only when they had a value."""
    cfg = dm.Config.from_env(env(NODE_LABEL_FOR_GPU_POD_EVICTION="example.com/gpu-client"))
    patch = dm.pause_labels(node(), cfg)
    assert patch[dm.DEVICE_PLUGIN] == PAUSED
    assert patch[dm.DCGM] == "false"
    assert patch[dm.NVSM] == ""
    assert dm.MIG_MANAGER not in patch
    assert dm.GPU_CLIENT not in patch
    assert "example.com/gpu-client" not in patch
    assert dm.DRA_DRIVER_LABEL not in patch  # paused apart, by evictKubeletPlugin
    labels = {**DEPLOY_TRUE, dm.MIG_MANAGER: "true", "example.com/gpu-client": "yes"}
    patch = dm.pause_labels(node(labels), cfg)
    assert patch[dm.MIG_MANAGER] == PAUSED
    assert patch["example.com/gpu-client"] == f"yes_{PAUSED}"


def test_reschedule_patch_comes_from_the_values_read_at_the_start() -> None:
    cfg = dm.Config.from_env(env())
    labels = {**DEPLOY_TRUE, dm.GFD: PAUSED, dm.TOOLKIT: f"x_{PAUSED}"}
    patch = dm.reschedule_labels(node(labels), cfg)
    assert patch[dm.DEVICE_PLUGIN] == "true"
    assert patch[dm.GFD] == "true"
    assert patch[dm.TOOLKIT] == "x"
    assert patch[dm.DCGM] == "false"
    assert patch[dm.DRA_DRIVER_LABEL] == ""


# ----------------------------------------------------------------- the plan
def test_fresh_node_without_policy_uncordons_and_reschedules() -> None:
    """No driver loaded: no eviction, but the node is uncordoned (eviction or auto
    drain on) and the components rescheduled."""
    steps = dm.plan(env(), node(), FRESH)
    assert kinds(steps) == ["uncordon", "reschedule-labels"]
    assert steps[0].best_effort  # a failed uncordon is a warning upstream


def test_fresh_node_with_eviction_and_drain_off_only_reschedules() -> None:
    steps = dm.plan(env(ENABLE_GPU_POD_EVICTION="false", ENABLE_AUTO_DRAIN="0"), node(), FRESH)
    assert kinds(steps) == ["reschedule-labels"]


def test_upgrade_policy_node_is_never_cordoned_or_uncordoned() -> None:
    """Annotation "true": the operator's upgrade controller owns cordon and drain, on
    every path (fresh, same digest, new digest) and every fallback."""
    for driver in (FRESH, LOADED_SAME, LOADED_OLD):
        steps = dm.plan(env(ENABLE_AUTO_DRAIN="true"), node(annotations=POLICY), driver)
        assert not {s.kind for s in walk(steps)} & ALLOCATING
    steps = dm.plan(env(), node(annotations=POLICY), LOADED_OLD)
    assert kinds(steps) == ["pause-labels", "wait-pods-gone", "unload", "reschedule-labels"]


def test_annotation_other_than_true_leaves_the_manager_in_charge() -> None:
    steps = dm.plan(env(), node(annotations={dm.UPGRADE_ENABLED_ANNOTATION: "false"}), FRESH)
    assert kinds(steps) == ["uncordon", "reschedule-labels"]


def test_loaded_driver_with_the_same_digest_is_kept() -> None:
    """shouldSkipUninstall: operands are still paused and waited for, nothing cordoned."""
    steps = dm.plan(env(), node(), LOADED_SAME)
    assert kinds(steps) == ["pause-labels", "wait-pods-gone", "reschedule-labels"]


@pytest.mark.parametrize(
    ("extra", "driver"),
    [
        ({}, LOADED_OLD),
        ({"FORCE_REINSTALL": "true"}, LOADED_SAME),
        ({"DRIVER_CONFIG_DIGEST": ""}, dm.DriverState(loaded=True, stored_digest="")),
        ({}, dm.DriverState(loaded=True, stored_digest=None)),
    ],
    ids=["new-digest", "force-reinstall", "no-digest", "none-stored"],
)
def test_loaded_driver_to_replace_is_evicted_cordoned_and_unloaded(
    extra: dict[str, str], driver: dm.DriverState
) -> None:
    steps = dm.plan(env(**extra), node(), driver)
    assert kinds(steps) == [
        "pause-labels",
        "wait-pods-gone",
        "cordon",
        "evict-gpu-pods",
        "unload",
        "uncordon",
        "reschedule-labels",
    ]


def test_operand_waits_follow_upstream_order_and_optional_components() -> None:
    steps = dm.plan(env(OPERATOR_NAMESPACE="ops"), node(), LOADED_SAME)
    waits = [s.app for s in steps if s.kind == "wait-pods-gone"]
    assert waits == [
        "nvidia-operator-validator",
        "nvidia-container-toolkit-daemonset",
        "nvidia-device-plugin-daemonset",
        "gpu-feature-discovery",
        "nvidia-dcgm-exporter",
        "nvidia-dcgm",
        "nvidia-dcgm-exporter-dra",
        "nvidia-dcgm-dra",
    ]
    assert {s.namespace for s in steps if s.kind == "wait-pods-gone"} == {"ops"}
    assert all(s.timeout_s == 300 for s in steps if s.kind == "wait-pods-gone")
    labels = {**DEPLOY_TRUE, dm.MIG_MANAGER: "false", dm.GPU_CLIENT: "true"}
    steps = dm.plan(env(), node(labels), LOADED_SAME)
    assert "nvidia-mig-manager" in [s.app for s in steps]  # "false" is a value too
    assert [s.node_selector_key for s in steps if s.kind == "wait-gpu-clients-gone"] == [
        dm.GPU_CLIENT
    ]


def test_eviction_failure_without_auto_drain_cleans_up_and_fails() -> None:
    steps = dm.plan(env(ENABLE_AUTO_DRAIN="false"), node(), LOADED_OLD)
    done, outcome = played(steps, {"evict-gpu-pods"})
    assert done == [
        "pause-labels",
        "wait-pods-gone",
        "cordon",
        "evict-gpu-pods",
        "uncordon",
        "reschedule-labels",
    ]
    assert not outcome.ok
    assert "drained" in outcome.reason


def test_eviction_failure_with_auto_drain_drains_and_goes_on() -> None:
    steps = dm.plan(env(ENABLE_AUTO_DRAIN="true"), node(), LOADED_OLD)
    done, outcome = played(steps, {"evict-gpu-pods"})
    assert done == [
        "pause-labels",
        "wait-pods-gone",
        "cordon",
        "evict-gpu-pods",
        "drain",
        "unload",
        "uncordon",
        "reschedule-labels",
    ]
    assert outcome.ok
    done, outcome = played(steps, {"evict-gpu-pods", "drain"})
    assert done[-3:] == ["drain", "uncordon", "reschedule-labels"]
    assert not outcome.ok


def test_unload_failure_retries_after_a_drain_only_with_auto_drain() -> None:
    steps = dm.plan(env(ENABLE_AUTO_DRAIN="true"), node(), LOADED_OLD)
    done, outcome = played(steps, {"unload"})
    assert done[4:] == ["unload", "drain", "unload", "uncordon", "reschedule-labels"]
    assert not outcome.ok
    assert "uninstall" in outcome.reason
    steps = dm.plan(env(ENABLE_AUTO_DRAIN="false"), node(), LOADED_OLD)
    done, outcome = played(steps, {"unload"})
    assert done[4:] == ["unload", "uncordon", "reschedule-labels"]
    assert not outcome.ok


def test_unload_failure_under_the_upgrade_policy_does_not_uncordon() -> None:
    """cleanupOnFailure uncordons only when the manager could have evicted."""
    steps = dm.plan(env(ENABLE_AUTO_DRAIN="true"), node(annotations=POLICY), LOADED_OLD)
    done, outcome = played(steps, {"unload"})
    assert done == ["pause-labels", "wait-pods-gone", "unload", "reschedule-labels"]
    assert not outcome.ok


def test_operands_that_never_go_clean_up() -> None:
    steps = dm.plan(env(), node(), LOADED_OLD)
    done, outcome = played(steps, {"wait-pods-gone"})
    assert done == ["pause-labels", "wait-pods-gone", "uncordon", "reschedule-labels"]
    assert not outcome.ok


def test_a_failed_cordon_fails_without_cleanup() -> None:
    steps = dm.plan(env(), node(), LOADED_OLD)
    done, outcome = played(steps, {"cordon"})
    assert done == ["pause-labels", "wait-pods-gone", "cordon"]
    assert not outcome.ok


def test_failed_uncordon_is_only_a_warning() -> None:
    done, outcome = played(dm.plan(env(), node(), LOADED_OLD), {"uncordon"})
    assert done[-2:] == ["uncordon", "reschedule-labels"]
    assert outcome.ok


def test_dra_driver_label_adds_the_kubelet_plugin_and_claim_check() -> None:
    labels = {**DEPLOY_TRUE, dm.DRA_DRIVER_LABEL: "true"}
    steps = dm.plan(env(ENABLE_GPU_POD_EVICTION="false"), node(labels), LOADED_OLD)
    assert "cordon" in kinds(steps)  # DRA with auto drain evicts up front
    tail = kinds(steps)[kinds(steps).index("check-claim-holders") :]
    assert tail[:4] == ["check-claim-holders", "pause-labels", "wait-pods-gone", "unload"]
    plugin = [s for s in steps if s.app == dm.KUBELET_PLUGIN_APP]
    assert len(plugin) == 1
    assert [s.labels for s in steps if s.kind == "pause-labels"][1] == {dm.DRA_DRIVER_LABEL: PAUSED}


# ----------------------------------------------------------------- configuration
def test_defaults_are_upstreams() -> None:
    cfg = dm.Config.from_env({"NODE_NAME": NODE})
    assert cfg.enable_auto_drain
    assert cfg.enable_gpu_pod_eviction
    assert cfg.operator_namespace == "gpu-operator"
    assert cfg.drain == dm.DrainOptions()


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("0s", 0.0), ("0", 0.0), ("300s", 300.0), ("1m30s", 90.0), ("1.5h", 5400.0), ("", 0.0)],
)
def test_drain_timeout_is_a_go_duration(text: str, seconds: float) -> None:
    assert dm.Config.from_env(env(DRAIN_TIMEOUT_SECONDS=text)).drain.timeout_s == seconds


@pytest.mark.parametrize(
    "bad",
    [
        {"DRAIN_TIMEOUT_SECONDS": "300"},
        {"ENABLE_AUTO_DRAIN": "yes"},
        {"DRAIN_USE_FORCE": "on"},
        {"NODE_NAME": ""},
    ],
)
def test_an_env_the_cli_refuses_fails_before_any_step(bad: dict[str, str]) -> None:
    steps = dm.plan(env(**bad), node(), LOADED_OLD)
    assert [s.kind for s in steps] == ["fail"]


def test_env_resolves_pod_field_references_and_last_wins() -> None:
    pod: dict[str, Any] = {
        "metadata": {"name": "drv", "namespace": "ops"},
        "spec": {
            "nodeName": NODE,
            "initContainers": [
                {
                    "name": dm.MANAGER_CONTAINER,
                    "env": [
                        {
                            "name": "NODE_NAME",
                            "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}},
                        },
                        {"name": "ENABLE_AUTO_DRAIN", "value": "false"},
                        {"name": "ENABLE_AUTO_DRAIN", "value": "true"},
                        {
                            "name": "OPERATOR_NAMESPACE",
                            "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
                        },
                        {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}},
                        {"name": "DRIVER_CONFIG_DIGEST", "value": "abc"},
                    ],
                }
            ],
        },
    }
    got = dm.manager_env(pod)
    assert got == {
        "NODE_NAME": NODE,
        "ENABLE_AUTO_DRAIN": "true",
        "OPERATOR_NAMESPACE": "ops",
        "DRIVER_CONFIG_DIGEST": "abc",
    }
    assert dm.pod_digest(pod) == "abc"
    assert dm.manager_env({"spec": {"initContainers": [{"name": "other"}]}}) is None


# ----------------------------------------------------------------- drain rules
def pod(
    *,
    owner: str | None = "ReplicaSet",
    gpu: bool = True,
    phase: str = "Running",
    empty_dir: bool = False,
    mirror: bool = False,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "namespace": "ns"}
    if owner:
        api = "apps/v1"
        meta["ownerReferences"] = [
            {"apiVersion": api, "kind": owner, "name": "o", "controller": True}
        ]
    if mirror:
        meta["annotations"] = {dm.MIRROR_ANNOTATION: "x"}
    resources = {"limits": {"nvidia.com/gpu": "1"}} if gpu else {}
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": resources}]}
    if empty_dir:
        spec["volumes"] = [{"name": "scratch", "emptyDir": {}}]
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


OPTS = dm.DrainOptions()
FORCE = dm.DrainOptions(force=True, delete_emptydir_data=True)


@pytest.mark.parametrize(
    ("kwargs", "opts", "ignore_ds", "ds_exists", "verdict"),
    [
        ({}, OPTS, True, True, "delete"),
        ({"owner": "DaemonSet"}, OPTS, True, True, "skip"),
        ({"owner": "DaemonSet"}, OPTS, False, True, "error"),
        ({"owner": "DaemonSet"}, FORCE, False, False, "delete"),
        ({"owner": "DaemonSet"}, OPTS, True, False, "error"),
        ({"owner": "DaemonSet", "phase": "Succeeded"}, OPTS, False, True, "delete"),
        ({"owner": None}, OPTS, True, True, "error"),
        ({"owner": None}, FORCE, True, True, "delete"),
        ({"owner": None, "phase": "Failed"}, OPTS, True, True, "delete"),
        ({"empty_dir": True}, OPTS, True, True, "error"),
        ({"empty_dir": True}, FORCE, True, True, "delete"),
        ({"mirror": True, "owner": None}, OPTS, True, True, "skip"),
    ],
)
def test_kubectl_drain_filters(
    kwargs: dict[str, Any], opts: dm.DrainOptions, ignore_ds: bool, ds_exists: bool, verdict: str
) -> None:
    got, _ = dm.delete_verdict(
        pod(**kwargs), opts, ignore_daemonsets=ignore_ds, daemonset_exists=ds_exists
    )
    assert got == verdict


def test_gpu_pods_by_resource_or_allocated_claim() -> None:
    assert dm.uses_gpu(pod())
    mig = pod(gpu=False)
    mig["spec"]["containers"][0]["resources"] = {"requests": {"nvidia.com/mig-1g.10gb": "1"}}
    assert dm.uses_gpu(mig)
    claimed = pod(gpu=False)
    claimed["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "t"}]
    claimed["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": "p-gpu"}]
    assert dm.claim_names(claimed) == ["p-gpu"]
    assert not dm.uses_gpu(claimed)
    assert dm.uses_gpu(claimed, {"p-gpu"})
    allocated = {"status": {"allocation": {"devices": {"results": [{"driver": "gpu.nvidia.com"}]}}}}
    assert dm.claim_is_gpu(allocated)
    assert not dm.claim_is_gpu({"status": {}})
