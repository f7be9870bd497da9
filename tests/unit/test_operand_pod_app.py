"""Operand pods are found by their DaemonSet's name, whichever label upstream names it by."""

from __future__ import annotations

import components as c
from gpuop.operator.controller.views.pod_records import daemonset_app, pod_app, pod_index, trim_pod
from tests.conformance._diff import conformance_dir, load_policy


def test_every_sandbox_daemonset_is_found_by_its_pods() -> None:
    spec, _ = load_policy(conformance_dir() / "sandbox-mixed-kata")
    ctx = c.RenderContext(namespace="gpu-operator", operator_image="img")
    daemonsets = [
        o
        for objs in c.desired_objects(spec, ctx).values()
        for o in objs
        if o["kind"] == "DaemonSet"
    ]
    assert {"nvidia-vfio-manager", "nvidia-cc-manager"} <= {
        d["metadata"]["name"] for d in daemonsets
    }
    for ds in daemonsets:
        pod = trim_pod(
            {
                "metadata": {
                    "name": "p",
                    "namespace": "gpu-operator",
                    "labels": ds["spec"]["template"]["metadata"]["labels"],
                },
                "spec": {"nodeName": "gpu-node-0001"},
            }
        )
        assert daemonset_app(ds) == ds["metadata"]["name"] == pod_app(pod) == pod.app
        assert pod_index(pod) == "gpu-node-0001"
