"""`gpuop doctor`'s rules, pure: each signature built as a support bundle's files, the
finding's line checked (cause, objects, fix), and the near miss beside it found clean."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from gpuop.admin_cli.bundle import gpu_pod_facts
from gpuop.admin_cli.doctor_facts import Finding, snapshot_from_files, troubled
from gpuop.admin_cli.doctor_rules import diagnose
from gpuop.admin_cli.doctor_signatures import DRIVER_IN_USE, SIGNATURES

NS = "gpu-operator"
Obj = dict[str, Any]


def _files(**parts: Any) -> dict[str, bytes]:
    """Bundle files from keyword parts: policies, pods, nodes, events, gpu_pods, rules,
    configmaps, daemonsets, logs ({(pod, container): text})."""
    paths = {
        "policies": "cluster/clusterpolicies.json",
        "pods": "namespace/pods.json",
        "nodes": "nodes.json",
        "events": "events.json",
        "gpu_pods": "cluster/gpu-pods.json",
        "rules": "cluster/prometheusrules.json",
        "configmaps": "namespace/configmaps.json",
    }
    files = {"manifest.json": json.dumps({"namespace": NS}).encode()}
    for key, path in paths.items():
        if key in parts:
            files[path] = json.dumps(parts[key]).encode()
    for (pod, container), text in parts.get("logs", {}).items():
        files[f"logs/{pod}/{container}.log"] = text.encode()
    return files


def _find(rule: str, **parts: Any) -> list[Finding]:
    return [f for f in diagnose(snapshot_from_files(_files(**parts))) if f.rule == rule]


def _policy(spec: Obj | None = None, reason: str | None = None) -> Obj:
    status: Obj = {"state": "notReady"}
    if reason:
        status["conditions"] = [{"type": "Ready", "status": "False", "reason": reason}]
    return {"metadata": {"name": "cluster-policy"}, "spec": spec or {}, "status": status}


def _node(name: str, labels: Obj | None = None, runtime: str = "containerd://1.7.22") -> Obj:
    return {"name": name, "labels": labels or {}, "nodeInfo": {"containerRuntimeVersion": runtime}}


def _pod(
    name: str,
    node: str,
    *,
    app: str = "",
    inits: list[Obj] | None = None,
    containers: list[Obj] | None = None,
    statuses: list[Obj] | None = None,
    init_statuses: list[Obj] | None = None,
    labels: Obj | None = None,
) -> Obj:
    return {
        "metadata": {"name": name, "namespace": NS, "labels": {"app": app, **(labels or {})}},
        "spec": {
            "nodeName": node,
            "initContainers": inits or [],
            "containers": containers or [{"name": "main", "image": "busybox"}],
        },
        "status": {
            "phase": "Running",
            "containerStatuses": statuses or [],
            "initContainerStatuses": init_statuses or [],
        },
    }


def _driver_pod(node: str, manager_status: Obj | None = None) -> Obj:
    return _pod(
        f"nvidia-driver-daemonset-{node}",
        node,
        app="nvidia-driver-daemonset",
        labels={"app.kubernetes.io/component": "nvidia-driver"},
        inits=[{"name": "k8s-driver-manager", "image": "nvcr.io/k8s-driver-manager:v0.8"}],
        containers=[{"name": "nvidia-driver-ctr", "image": "nvcr.io/nvidia/driver:595"}],
        init_statuses=[manager_status] if manager_status else [],
    )


CRASHED_MANAGER = {
    "name": "k8s-driver-manager",
    "restartCount": 2,
    "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 20s"}},
    "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": "drain failed"}},
}


def _gpu_user(name: str, node: str) -> Obj:
    facts = gpu_pod_facts(
        {
            "metadata": {"name": name, "namespace": "ml"},
            "spec": {
                "nodeName": node,
                "containers": [{"name": "t", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
            },
            "status": {"phase": "Running"},
        }
    )
    assert facts is not None
    return facts


def test_gpu_pod_facts_keeps_only_gpu_users() -> None:
    plain = {"metadata": {"name": "web", "namespace": "a"}, "spec": {"containers": [{}]}}
    assert gpu_pod_facts(plain) is None
    assert _gpu_user("train", "n1")["gpus"] == {"nvidia.com/gpu": "1"}


def test_driver_in_use_names_the_node_driver_pod_and_holders() -> None:
    (finding,) = _find(
        "driver-in-use",
        pods=[_driver_pod("gpu-1", CRASHED_MANAGER), _driver_pod("gpu-2")],
        gpu_pods=[_gpu_user("train-0", "gpu-1"), _gpu_user("idle", "gpu-2")],
    )
    assert "node gpu-1" in finding.cause
    assert "1 pod(s) hold its GPUs" in finding.cause
    assert finding.objects == (
        "node/gpu-1",
        f"pod/{NS}/nvidia-driver-daemonset-gpu-1",
        "pod/ml/train-0",
    )
    assert "ENABLE_GPU_POD_EVICTION=true" in finding.fix
    assert "kubectl label node gpu-1" in finding.fix


def test_driver_in_use_needs_a_failing_manager_or_its_words() -> None:
    holders = [_gpu_user("train-0", "gpu-1")]
    assert not _find("driver-in-use", pods=[_driver_pod("gpu-1")], gpu_pods=holders)
    assert not _find("driver-in-use", pods=[_driver_pod("gpu-1", CRASHED_MANAGER)], gpu_pods=[])
    said = 'level=info msg="Could not unload NVIDIA driver kernel modules, driver is in use"'
    (finding,) = _find(
        "driver-in-use",
        pods=[_driver_pod("gpu-1")],
        gpu_pods=[],
        logs={("nvidia-driver-daemonset-gpu-1", "k8s-driver-manager"): said},
    )
    assert "driver is in use" in finding.cause


@pytest.mark.parametrize(
    ("message", "rule", "words"),
    [
        (
            'failed to resolve reference "nvcr.io/nvidia/driver:595.91.07-ubuntu26.04": not found',
            "missing-tag",
            "driver.version",
        ),
        (
            "pull access denied, repository does not exist or may require authorization: "
            "authorization failed",
            "missing-tag",
            "driver.version",
        ),
        ("failed to authorize: 401 Unauthorized", "image-pull-refused", "driver.imagePullSecrets"),
        ("dial tcp: lookup nvcr.io: i/o timeout", "image-pull-failed", "driver.repository"),
    ],
)
def test_image_pull_failures_say_which_image_and_section(
    message: str, rule: str, words: str
) -> None:
    image = "nvcr.io/nvidia/driver:595.91.07-ubuntu26.04"
    waiting = {"reason": "ImagePullBackOff", "message": message}
    pods = [
        _pod(
            f"nvidia-driver-daemonset-{i}",
            f"gpu-{i}",
            app="nvidia-driver-daemonset",
            containers=[{"name": "nvidia-driver-ctr", "image": image}],
            statuses=[{"name": "nvidia-driver-ctr", "state": {"waiting": waiting}}],
        )
        for i in (1, 2)
    ]
    (finding,) = _find(rule, pods=pods)
    assert finding.objects[0] == f"image/{image}"
    assert {"node/gpu-1", "node/gpu-2"} <= set(finding.objects)
    assert words in finding.fix


def test_a_pulled_image_is_no_finding() -> None:
    running = {"name": "main", "state": {"running": {}}}
    creating = {"name": "main", "state": {"waiting": {"reason": "ContainerCreating"}}}
    assert not diagnose(snapshot_from_files(_files(pods=[_pod("a", "n", statuses=[running])])))
    assert not diagnose(snapshot_from_files(_files(pods=[_pod("a", "n", statuses=[creating])])))


@pytest.mark.parametrize(
    ("rule", "line", "fix_words"),
    [
        ("nouveau-loaded", "failed to unload nouveau driver: device or resource busy", "blacklist"),
        (
            "nouveau-loaded",
            "modprobe: ERROR: could not insert 'nvidia': No such device",
            "initramfs",
        ),
        (
            "unsigned-module",
            "modprobe: ERROR: could not insert 'nvidia': Key was rejected by service",
            "usePrecompiled",
        ),
        (
            "unsigned-module",
            "ERROR: The kernel module failed to load, because it was not signed by a key that"
            " is trusted by the kernel.",
            "MOK",
        ),
        ("kernel-headers", "Could not resolve Linux kernel version", "repoConfig"),
        (
            "kernel-headers",
            "E: Unable to locate package linux-headers-6.8.0-1029-gke",
            "usePrecompiled",
        ),
        (
            "kernel-headers",
            "Error: Unable to find a match: kernel-headers-5.14.0-427.el9.x86_64",
            "repoConfig",
        ),
    ],
)
def test_driver_log_signatures(rule: str, line: str, fix_words: str) -> None:
    pod = _driver_pod("gpu-1")
    logs = {(pod["metadata"]["name"], "nvidia-driver-ctr"): f"Starting...\n{line}\nexit 1\n"}
    (finding,) = _find(rule, pods=[pod], logs=logs)
    assert finding.objects[0] == "node/gpu-1"
    assert f"pod/{NS}/{pod['metadata']['name']} (nvidia-driver-ctr)" in finding.objects
    assert fix_words in finding.fix
    assert line.split(":")[0][:20] in finding.cause
    # The same words from a pod that is no driver (a workload's apt) say nothing.
    other = _pod("cuda-sample", "gpu-1", app="nvidia-cuda-validator")
    assert not _find(rule, pods=[other], logs={("cuda-sample", "main"): line})


@pytest.mark.parametrize(
    "line",
    [
        'level=error msg="error validating driver installation: Failed to create symlinks under'
        ' /dev/char that point to all possible NVIDIA character devices."',
        "check failed check=driver reason='cannot link /dev/char: permission denied'",
    ],
)
def test_dev_char_links_from_either_validator(line: str) -> None:
    pod = _pod("nvidia-operator-validator-x", "gpu-3", app="nvidia-operator-validator")
    (finding,) = _find(
        "dev-char-links", pods=[pod], logs={(pod["metadata"]["name"], "driver-validation"): line}
    )
    assert finding.objects[0] == "node/gpu-3"
    assert "DISABLE_DEV_CHAR_SYMLINK_CREATION=true" in finding.fix


def test_a_termination_message_counts_as_a_line() -> None:
    """On a live cluster without logs the status's messages still carry the words."""
    status = {
        "name": "k8s-driver-manager",
        "restartCount": 1,
        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"exitCode": 1, "message": "failed to unload nouveau driver"}},
    }
    (finding,) = _find("nouveau-loaded", pods=[_driver_pod("gpu-1", status)])
    assert finding.objects[0] == "node/gpu-1"


def test_toolkit_configuring_another_runtime() -> None:
    toolkit = _pod(
        "nvidia-container-toolkit-daemonset-a",
        "gpu-1",
        app="nvidia-container-toolkit-daemonset",
        containers=[{"name": "ctr", "env": [{"name": "RUNTIME", "value": "containerd"}]}],
    )
    nodes = [_node("gpu-1", runtime="cri-o://1.30.2")]
    (finding,) = _find("toolkit-runtime-mismatch", pods=[toolkit], nodes=nodes)
    assert "configures containerd but node gpu-1 runs crio" in finding.cause
    assert not _find("toolkit-runtime-mismatch", pods=[toolkit], nodes=[_node("gpu-1")])


def test_no_nvidia_handler_in_events() -> None:
    event = {
        "involvedObject": {
            "kind": "Pod",
            "namespace": NS,
            "name": "nvidia-device-plugin-daemonset-x",
        },
        "reason": "FailedCreatePodSandBox",
        "message": "Failed to create pod sandbox: rpc error: code = Unknown desc = failed to get"
        ' sandbox runtime: no runtime for "nvidia" is configured',
    }
    (finding,) = _find("toolkit-runtime-mismatch", events=[event])
    assert finding.objects == (f"pod/{NS}/nvidia-device-plugin-daemonset-x",)


def test_nfd_labels_missing_from_the_status_or_the_nodes() -> None:
    said = _policy(reason="NFDLabelsMissing")
    labelled = [_node("gpu-1", {"feature.node.kubernetes.io/pci-10de.present": "true"})]
    (finding,) = _find("nfd-labels-missing", policies=[said], nodes=labelled)
    assert finding.objects == ("clusterpolicy/cluster-policy",)
    assert "nfd.enabled=true" in finding.fix
    assert _find("nfd-labels-missing", policies=[_policy()], nodes=[_node("cpu-1")])
    assert not _find("nfd-labels-missing", policies=[_policy()], nodes=labelled)
    assert not _find("nfd-labels-missing", policies=[], nodes=[_node("cpu-1")])


NODE_RULE = {
    "metadata": {"name": "my-gpu-alerts", "namespace": "monitoring"},
    "spec": {
        "groups": [
            {"name": "g", "rules": [{"alert": "Lost", "expr": "gpu_operator_node_gpu_up == 0"}]}
        ]
    },
}


def test_node_status_exporter_off_while_its_alerts_are_installed() -> None:
    (finding,) = _find("node-status-exporter-off", policies=[_policy()], rules=[NODE_RULE])
    assert finding.objects == (
        "clusterpolicy/cluster-policy",
        "prometheusrule/monitoring/my-gpu-alerts",
    )
    assert "nodeStatusExporter.enabled=true" in finding.fix
    on = _policy({"nodeStatusExporter": {"enabled": True}})
    assert not _find("node-status-exporter-off", policies=[on], rules=[NODE_RULE])
    other = {**NODE_RULE, "spec": {"groups": [{"name": "g", "rules": [{"expr": "up == 0"}]}]}}
    assert not _find("node-status-exporter-off", policies=[_policy()], rules=[other])
    (chart,) = _find(
        "node-status-exporter-off", policies=[_policy()], configmaps=["gpu-operator-alert-rules"]
    )
    assert chart.objects[-1] == f"configmap/{NS}/gpu-operator-alert-rules"


def test_a_missing_file_is_no_finding_and_the_line_has_all_parts() -> None:
    assert diagnose(snapshot_from_files({"manifest.json": b"{}"})) == []
    line = Finding("r", "a cause", "a fix", ("node/a", "pod/b/c")).line()
    assert line == "r: a cause [node/a, pod/b/c]; fix: a fix"


@pytest.mark.parametrize(
    ("status", "read"),
    [
        ({"state": {"running": {}}, "ready": True}, False),
        ({"state": {"terminated": {"exitCode": 0}}}, False),
        ({"state": {"running": {}}, "ready": True, "restartCount": 2}, True),
        ({"state": {"waiting": {"reason": "CrashLoopBackOff"}}}, True),
        ({"state": {"terminated": {"exitCode": 1}}}, True),
        ({"state": {"running": {}}, "ready": False}, True),
    ],
)
def test_only_troubled_containers_logs_are_read(status: Obj, read: bool) -> None:
    pod = _pod("p", "n", init_statuses=[{"name": "init", **status}])
    assert troubled(pod, "init") is read
    assert troubled(pod, "other") is False  # not started: no log yet


def test_signature_patterns_survive_lowering() -> None:
    """Patterns are searched lowered (``Signature.match``): an escape such as ``\\S``
    would turn into another (``\\s``), so none may hold an upper-case escape."""
    patterns = [p for sig in SIGNATURES for p in sig.patterns] + list(DRIVER_IN_USE)
    assert patterns
    assert not [p for p in patterns if re.search(r"\\[A-Z]", p)]
