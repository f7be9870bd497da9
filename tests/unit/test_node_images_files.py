"""The status-file rules of the node-image simulator (``gpuop/devcluster/_node_files.py``)
against our rendered operands, and kwok's hold of the pods it plays."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

import components as c
import crd
from gpuop.devcluster import _argv, _stages
from gpuop.devcluster import _node_files as nf

CTX = c.RenderContext(namespace="gpu-operator", operator_image="img", mig_capable=True)


def pods_of(spec: crd.ClusterPolicySpec) -> dict[str, dict[str, Any]]:
    """A pod per rendered DaemonSet (its template), by DaemonSet name."""
    result = {}
    for objects in c.desired_objects(spec, CTX).values():
        for obj in objects:
            if obj["kind"] == "DaemonSet":
                template = obj["spec"]["template"]
                result[obj["metadata"]["name"]] = {
                    "metadata": {**template["metadata"], "uid": obj["metadata"]["name"]},
                    "spec": template["spec"],
                }
    return result


def everything() -> crd.ClusterPolicySpec:
    """The default policy renders every held operand but standalone DCGM."""
    return crd.ClusterPolicySpec.model_validate({"dcgm": {"enabled": True}})


DEFAULT = pods_of(crd.ClusterPolicySpec.model_validate({}))


def test_rendered_operands_wait_for_the_files_of_the_layer_below() -> None:
    needs = {name: nf.needs(pod) for name, pod in DEFAULT.items()}
    toolkit = frozenset({nf.TOOLKIT_READY})
    assert needs["nvidia-container-toolkit-daemonset"] == [frozenset({nf.DRIVER_CTR_READY})]
    # driver-validation waits for the driver container, the probe for plugin-ready
    assert needs["nvidia-operator-validator"] == [
        frozenset({nf.DRIVER_CTR_READY}),
        frozenset({nf.PLUGIN_READY}),
    ]
    assert needs["nvidia-device-plugin-daemonset"] == [toolkit]
    assert needs["gpu-feature-discovery"] == [toolkit]
    assert needs["nvidia-dcgm-exporter"] == [toolkit]
    assert needs["nvidia-driver-daemonset"] == []


def test_every_rendered_pod_that_waits_for_a_file_is_held() -> None:
    """Held by label, released by its spec: a pod waiting on a file but not held would be
    Ready at once; a held app never rendered would be a stale entry."""
    pods = {**DEFAULT, **pods_of(everything())}
    waiting = {name for name, pod in pods.items() if nf.needs(pod)}
    held = {name for name, pod in pods.items() if nf.is_held(pod)}
    assert waiting <= held
    apps = {nf.labels_of(pod).get("app") for pod in pods.values()}
    assert set(nf.HELD_APPS) <= apps
    assert nf.is_held(pods["nvidia-driver-daemonset"])


def test_init_wait_parsing() -> None:
    either = {
        "command": ["sh", "-c"],
        "args": [
            "until [ -f /run/nvidia/validations/a-ready ] || [ -f /run/nvidia/validations/b ];"
            " do echo waiting; sleep 5; done"
        ],
    }
    assert nf.file_wait(either) == frozenset({"a-ready", "b"})
    more = {
        "command": ["sh", "-c"],
        "args": ["until [ -f /run/nvidia/validations/x ]; do sleep 5; done; cat /x"],
    }
    assert nf.file_wait(more) is None  # does more than wait: not played
    elsewhere = {"command": ["sh", "-c", "until [ -f /tmp/x ]; do sleep 5; done"]}
    assert nf.file_wait(elsewhere) is None


def ready(pod: dict[str, Any], is_ready: bool = True) -> dict[str, Any]:
    status = {"conditions": [{"type": "Ready", "status": "True" if is_ready else "False"}]}
    return {**pod, "status": status}


def test_the_chain_driver_toolkit_validator_on_one_node() -> None:
    driver = DEFAULT["nvidia-driver-daemonset"]
    toolkit = DEFAULT["nvidia-container-toolkit-daemonset"]
    validator = DEFAULT["nvidia-operator-validator"]
    plugin = DEFAULT["nvidia-device-plugin-daemonset"]

    files = nf.advance(set(), [driver, toolkit, validator, plugin], gpus=True)
    assert files == set()  # no driver Ready: nothing passes
    assert not nf.releasable(toolkit, files)

    files = nf.advance(files, [ready(driver), toolkit, validator, plugin], gpus=True)
    assert files == {nf.DRIVER_CTR_READY, nf.DRIVER_READY}  # toolkit-validation waits
    assert nf.releasable(toolkit, files)
    assert not nf.releasable(plugin, files)
    assert not nf.releasable(validator, files)

    files = nf.advance(files, [ready(driver), ready(toolkit), validator, plugin], gpus=True)
    assert files >= {nf.TOOLKIT_READY, nf.CUDA_READY, nf.PLUGIN_READY}
    assert nf.releasable(plugin, files)
    assert nf.releasable(validator, files)

    no_gpus = nf.advance(files, [ready(driver), ready(toolkit), validator], gpus=False)
    assert nf.PLUGIN_READY not in no_gpus  # the main container rechecks the plugin
    assert {nf.DRIVER_READY, nf.TOOLKIT_READY, nf.CUDA_READY} <= no_gpus
    # the init containers ran once: a toolkit pod restarting takes nothing away
    restarting = nf.advance(files, [ready(driver), ready(toolkit, False), validator], gpus=True)
    assert restarting == files


def test_the_validators_driver_validation_writes_driver_ready() -> None:
    """Without a toolkit DaemonSet (a toolkit on the host) the validator's own
    driver-validation init container writes driver-ready, then its toolkit check runs."""
    policy = crd.ClusterPolicySpec.model_validate({"toolkit": {"enabled": False}})
    pods = pods_of(policy)
    driver = pods["nvidia-driver-daemonset"]
    validator = pods["nvidia-operator-validator"]
    assert nf.advance(set(), [driver, validator], gpus=True) == set()
    files = nf.advance(set(), [ready(driver), validator], gpus=True)
    assert files == {
        nf.DRIVER_CTR_READY,
        nf.DRIVER_READY,
        nf.TOOLKIT_READY,
        nf.CUDA_READY,
        nf.PLUGIN_READY,
    }


def test_without_a_validator_only_the_toolkit_check_writes() -> None:
    driver = DEFAULT["nvidia-driver-daemonset"]
    toolkit = DEFAULT["nvidia-container-toolkit-daemonset"]
    files = nf.advance(set(), [ready(driver), ready(toolkit)], gpus=True)
    assert files == {nf.DRIVER_CTR_READY, nf.DRIVER_READY}


def test_a_driver_restart_and_a_stopped_validator_take_their_files() -> None:
    files = {nf.DRIVER_CTR_READY, nf.DRIVER_READY, nf.TOOLKIT_READY, nf.PLUGIN_READY}
    after_driver = nf.on_stopping(files, DEFAULT["nvidia-driver-daemonset"])
    assert after_driver == files - {nf.DRIVER_CTR_READY}
    after_validator = nf.on_stopping(files, DEFAULT["nvidia-operator-validator"])
    assert after_validator == {nf.DRIVER_CTR_READY}  # rm -f *-ready spares dotfiles
    # A validator still running does not notice (as upstream's, its driver check ran
    # once, in an init container): the driver manager stops it, which takes the files.
    validator = DEFAULT["nvidia-operator-validator"]
    assert nf.advance(after_driver, [validator], gpus=True) >= after_driver


def test_released_pods_are_not_held() -> None:
    pod = DEFAULT["nvidia-device-plugin-daemonset"]
    released = {
        **pod,
        "metadata": {**pod["metadata"], "annotations": {nf.RELEASED_ANNOTATION: "status-files"}},
    }
    assert nf.is_held(pod)
    assert not nf.is_held(released)


def test_gpus_advertised() -> None:
    assert nf.gpus_advertised({"status": {"allocatable": {"nvidia.com/gpu": "8"}}})
    assert not nf.gpus_advertised({"status": {"allocatable": {"nvidia.com/gpu": "0"}}})
    assert not nf.gpus_advertised({"status": {"allocatable": {"cpu": "4"}}})


# ----------------------------------------------------------------- kwok's hold
STAGES = """apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-ready
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
  next:
    statusTemplate: |
      phase: Running
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-delete
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'Exists'
  next:
    delete: true
"""


def test_without_the_simulator_kwoks_config_is_untouched() -> None:
    text = _argv.kwok_config(STAGES, _argv.ClientTuning())
    assert f"---\n{STAGES}\n---\n{_stages.WORKLOAD_COMPLETE_STAGE}" in text
    assert nf.RELEASED_ANNOTATION not in text


def test_with_the_simulator_only_pod_ready_holds() -> None:
    text = _argv.kwok_config(STAGES, _argv.ClientTuning(), hold=True)
    docs = [d for d in yaml.safe_load_all(text) if d and d.get("kind") == "Stage"]
    by_name = {d["metadata"]["name"]: d for d in docs}
    original = {d["metadata"]["name"]: d for d in yaml.safe_load_all(STAGES)}
    ready = by_name["pod-ready"]["spec"]
    assert ready["selector"]["matchExpressions"][-1] == nf.hold_expression()
    assert ready["next"] == original["pod-ready"]["spec"]["next"]
    assert by_name["pod-delete"] == original["pod-delete"]


def test_the_hold_query_names_what_is_held_predicate_holds() -> None:
    query = nf.kwok_hold_query()
    for name in (*nf.DRIVER_COMPONENTS, *nf.HELD_APPS, nf.RELEASED_ANNOTATION):
        assert f'"{name}"' in query
    assert '.metadata.labels["app.kubernetes.io/component"]' in query


def test_missing_pod_ready_stage_is_an_error() -> None:
    with pytest.raises(ValueError, match="pod-ready"):
        _stages.hold_pod_ready(STAGES.split("---")[1])
