"""The driver's site configuration on the real control plane: a repository ConfigMap the
policy names but nobody created yet leaves the driver DaemonSet as it was and makes the
policy notReady naming the field and the ConfigMap; creating it mounts each of its files
into the driver pods, and a file added later is mounted too."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from kubernetes_asyncio import client

import crd
from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Rest
from tests.integration.harness import NAMESPACE, POLICY, Running, eventually, policy_state_is

pytestmark = pytest.mark.integration

DS = by_kind("apps/v1", "DaemonSet")
CONFIG_MAP = by_kind("v1", "ConfigMap")
DRIVER = "nvidia-driver-daemonset"
REPOS = "site-repos"


def _policy() -> dict[str, Any]:
    policy = copy.deepcopy(crd.sample_policy())
    policy["spec"]["driver"]["repoConfig"] = {"configMapName": REPOS}
    policy["spec"]["driver"]["secretEnv"] = "site-proxy"
    return policy


async def _error(rest: Rest) -> dict[str, Any] | None:
    status = ((await rest.get(POLICY, "cluster-policy")) or {}).get("status") or {}
    for cond in status.get("conditions") or []:
        if cond["type"] == "Error" and cond["status"] == "True":
            return cond if cond["reason"] == "DriverConfigMissing" else None
    return None


def _repo_mounts(ds: dict[str, Any] | None) -> list[str]:
    if ds is None:
        return []
    pod = ds["spec"]["template"]["spec"]
    main = next(c for c in pod["containers"] if c["name"] == "nvidia-driver-ctr")
    return sorted(m["mountPath"] for m in main.get("volumeMounts") or [] if m["name"] == REPOS)


async def test_a_missing_repository_config_map_holds_the_driver_until_it_exists(
    rest: Rest, api_client: client.ApiClient
) -> None:
    await rest.apply(crd.sample_policy())
    async with Running(api_client):
        assert await eventually(lambda: policy_state_is(rest, "ready"), timeout=150)
        before = await rest.get(DS, DRIVER, NAMESPACE)
        assert before is not None

        await rest.apply(_policy())
        error = await eventually(lambda: _error(rest), timeout=60)
        assert "spec.driver.repoConfig.configMapName" in error["message"]
        assert f"ConfigMap {NAMESPACE}/{REPOS} not found" in error["message"]
        assert await policy_state_is(rest, "notReady")
        after = await rest.get(DS, DRIVER, NAMESPACE)
        assert after is not None
        assert after["metadata"]["generation"] == before["metadata"]["generation"]

        await rest.create(
            CONFIG_MAP,
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": REPOS, "namespace": NAMESPACE},
                "data": {"mirror.list": "deb http://mirror.example/ubuntu jammy main\n"},
            },
            NAMESPACE,
        )

        async def mounted(expected: list[str]) -> bool:
            return _repo_mounts(await rest.get(DS, DRIVER, NAMESPACE)) == expected

        first = ["/etc/apt/sources.list.d/mirror.list"]
        assert await eventually(lambda: mounted(first), timeout=60)
        assert await eventually(lambda: _none(_error(rest)), timeout=60)
        ds = await rest.get(DS, DRIVER, NAMESPACE)
        assert ds is not None
        main = ds["spec"]["template"]["spec"]["containers"][0]
        assert main["envFrom"] == [{"secretRef": {"name": "site-proxy"}}]

        # A file added to the ConfigMap is mounted too (its keys are watched).
        cm = await rest.get(CONFIG_MAP, REPOS, NAMESPACE)
        assert cm is not None
        cm["data"]["cuda.list"] = "deb http://mirror.example/cuda /\n"
        await rest.replace(CONFIG_MAP, cm, NAMESPACE)
        both = ["/etc/apt/sources.list.d/cuda.list", "/etc/apt/sources.list.d/mirror.list"]
        assert await eventually(lambda: mounted(both), timeout=60)
    await rest.apply(crd.sample_policy())
    await rest.delete(CONFIG_MAP, REPOS, NAMESPACE)


async def _none(value: Any) -> bool:
    return (await value) is None
