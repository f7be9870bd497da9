"""`gpuop plan -f` against the real control plane: plan a policy change, apply it, and
compare what the plan said would restart with what a pod watcher saw restart."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client

import crd
from gpuop.admin_cli.plan import compute
from gpuop.devcluster import ClusterInfo
from gpuop.kube.informer import Informer, Obj, ResourceSpec
from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Rest
from tests.integration.harness import NAMESPACE, POLICY, Running, eventually, policy_state_is

pytestmark = pytest.mark.integration

POD = by_kind("v1", "Pod")
DS = by_kind("apps/v1", "DaemonSet")


class Restarts:
    """Per DaemonSet (a pod's ``app`` label), the nodes where one of its pods was deleted
    once ``armed``: that pod was replaced."""

    def __init__(self, rest: Rest) -> None:
        self.armed = False
        self.deleted: dict[str, set[str]] = {}
        self.informer = Informer(
            ResourceSpec("test-plan-pods", rest.lister(POD, NAMESPACE)), self._on_pod
        )

    def _on_pod(self, event: str, old: Obj | None, new: Obj | None) -> None:
        pod = new or old
        assert pod is not None
        if not self.armed or event != "DELETED":
            return
        app = (pod["metadata"].get("labels") or {}).get("app", "")
        node = (pod.get("spec") or {}).get("nodeName") or ""
        self.deleted.setdefault(app, set()).add(node)


def _proposal(*sections: str) -> dict[str, Any]:
    """The sample policy with the env of each of ``sections`` changed (none: the
    default policy as it is)."""
    policy = copy.deepcopy(crd.sample_policy())
    spec = policy["spec"]
    for section in sections:
        env = list(spec.get(section, {}).get("env") or [])
        spec.setdefault(section, {})["env"] = [*env, {"name": "GPUOP_PLAN_TEST", "value": "1"}]
    return policy


TOOLKIT_DS = "nvidia-container-toolkit-daemonset"
PLUGIN_DS = "nvidia-device-plugin-daemonset"
#: (sections changed, the DaemonSets whose pods must roll): the issue's scenarios.
SCENARIOS = {
    "default": ((), set()),
    "toolkit-change": (("toolkit",), {TOOLKIT_DS}),
    "device-plugin-change": (("devicePlugin",), {PLUGIN_DS}),
}


async def _settled(rest: Rest) -> bool:
    """Every operand DaemonSet has all its pods updated and available."""
    if not await policy_state_is(rest, "ready"):
        return False
    for ds in await rest.list(DS, NAMESPACE):
        status = ds.get("status") or {}
        want = status.get("desiredNumberScheduled", 0)
        if ds["metadata"].get("generation") != status.get("observedGeneration"):
            return False
        if ds["spec"].get("updateStrategy", {}).get("type") == "OnDelete":
            continue
        if status.get("updatedNumberScheduled", 0) != want:
            return False
        if status.get("numberAvailable", 0) != want:
            return False
    return True


@pytest.mark.parametrize("scenario", list(SCENARIOS))
async def test_the_plan_names_exactly_what_applying_restarts(
    scenario: str,
    local_cluster: ClusterInfo,
    rest: Rest,
    api_client: client.ApiClient,
    tmp_path: Path,
) -> None:
    sections, rolls = SCENARIOS[scenario]
    await rest.apply(crd.sample_policy())
    proposal = tmp_path / "policy.yaml"
    proposal.write_text(yaml.safe_dump(_proposal(*sections)))
    restarts = Restarts(rest)
    watcher = asyncio.create_task(restarts.informer.run())
    try:
        async with Running(api_client) as running:
            assert await eventually(lambda: _settled(rest), timeout=180, what="settled")
            plan = await compute(rest, str(proposal), NAMESPACE)
            cli = [sys.executable, "-m", "gpuop", "plan", "-f", str(proposal)]
            cli += ["-n", NAMESPACE, "--kubeconfig", str(local_cluster.kubeconfig)]
            proc = await asyncio.to_thread(
                subprocess.run, cli, capture_output=True, text=True, timeout=120, check=False
            )
            assert proc.returncode == 0, proc.stderr
            print(f"$ gpuop plan -f policy.yaml  # {scenario}\n{proc.stdout}")
            await restarts.informer.synced.wait()
            restarts.armed = True
            await rest.apply(_proposal(*sections))

            async def rolled() -> bool:
                return await _settled(rest) and set(restarts.deleted) >= rolls

            assert await eventually(rolled, timeout=240, what="the change rolled out")
            await running.settle()  # the operator is done: no later restart is missed
            await asyncio.sleep(2)  # the last deletions' events
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        await rest.apply(crd.sample_policy())

    said = {o.daemonset: set(o.nodes) for o in plan.rolling}
    seen = {app: nodes for app, nodes in restarts.deleted.items() if app}
    assert said == seen, (said, seen)
    assert set(said) == rolls
    by_name = {o.daemonset: o for o in plan.operands}
    assert by_name["nvidia-driver-daemonset"].action == "nothing"
    out = proc.stdout
    if not rolls:
        assert "restarts nothing" in out
    if TOOLKIT_DS in rolls:
        assert by_name[TOOLKIT_DS].runtime_restart
        assert "container runtime restarts on each" in out
    assert "nvidia-driver-daemonset" not in out  # nothing to say of the driver


async def test_a_driver_version_change_is_a_reinstall_in_waves(
    rest: Rest, api_client: client.ApiClient, tmp_path: Path
) -> None:
    await rest.apply(crd.sample_policy())
    policy = copy.deepcopy(crd.sample_policy())
    policy["spec"]["driver"]["version"] = "580.105.08"
    policy["spec"]["driver"]["upgradePolicy"] = {
        "autoUpgrade": True,
        "maxParallelUpgrades": 2,
        "maxUnavailable": "100%",
    }
    proposal = tmp_path / "driver.yaml"
    proposal.write_text(yaml.safe_dump(policy))
    async with Running(api_client):
        assert await eventually(lambda: _settled(rest), timeout=180, what="settled")
        plan = await compute(rest, str(proposal), NAMESPACE)
    (driver,) = [o for o in plan.operands if o.daemonset == "nvidia-driver-daemonset"]
    assert driver.action == "upgrade"
    assert driver.nodes
    assert set(driver.reinstall) == set(driver.nodes)
    assert driver.restart_only == ()
    assert plan.driver is not None
    assert driver.steps == len(plan.driver.waves) == -(-len(driver.nodes) // 2)
    # nothing else's pod template depends on the driver's version
    assert {o.daemonset for o in plan.rolling} == {"nvidia-driver-daemonset"}
    assert await rest.get(POLICY, "cluster-policy") is not None
