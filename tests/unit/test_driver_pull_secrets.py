"""The driver pod pulls every image it runs: its pull secrets are the driver's, the
driver manager's and, where their sidecars run, GDS's and GDRCopy's, each once, in
upstream's order (`TransformDriver` for the ClusterPolicy: manager first; the
NVIDIADriver template: the driver's first)."""

from __future__ import annotations

from typing import Any

import crd
from components.driver import driver_pull_secrets
from components.nvidiadriver import render
from tests.unit.test_components_render import ctx


def _policy(**sections: Any) -> crd.ClusterPolicySpec:
    return crd.ClusterPolicySpec.model_validate(sections)


SECRETS = {
    "driver": {"imagePullSecrets": ["own", "shared"], "manager": {"imagePullSecrets": ["mgr"]}},
    "gds": {"enabled": True, "imagePullSecrets": ["gds", "shared"]},
    "gdrcopy": {"enabled": True, "imagePullSecrets": ["gdr"]},
}


def _names(secrets: list[dict[str, str]]) -> list[str]:
    return [s["name"] for s in secrets]


def test_cluster_policy_driver_pod_has_every_image_s_secrets_once() -> None:
    assert _names(driver_pull_secrets(_policy(**SECRETS))) == ["mgr", "own", "shared", "gds", "gdr"]


def test_sidecars_that_do_not_run_add_nothing() -> None:
    off = {**SECRETS, "gds": {"enabled": False, "imagePullSecrets": ["gds"]}}
    off["gdrcopy"] = {"imagePullSecrets": ["gdr"]}
    assert _names(driver_pull_secrets(_policy(**off))) == ["mgr", "own", "shared"]


def test_none_set_is_no_pull_secrets() -> None:
    assert driver_pull_secrets(_policy()) == []


def test_nvidiadriver_pool_lists_the_driver_s_before_the_manager_s() -> None:
    spec = crd.NVIDIADriverSpec.model_validate(
        {
            "imagePullSecrets": ["own"],
            "manager": {"imagePullSecrets": ["mgr"]},
            "gds": {"enabled": True, "imagePullSecrets": ["gds"]},
        }
    )
    node = {
        "metadata": {
            "name": "n",
            "labels": {
                "nvidia.com/gpu.present": "true",
                "feature.node.kubernetes.io/system-os_release.ID": "ubuntu",
                "feature.node.kubernetes.io/system-os_release.VERSION_ID": "22.04",
                crd.OWNER_LABEL: "pool-a",
            },
        }
    }
    (ds,) = render("pool-a", "uid", spec, [node], _policy(), ctx())
    pod = ds["spec"]["template"]["spec"]
    assert _names(pod["imagePullSecrets"]) == ["own", "mgr", "gds"]
