"""The node-image simulator on its own (no operator): driver pods shaped like ours, with
the ``k8s-driver-manager`` init container's env, on a cluster started with
``node_images=True``.

- Without the hand-off annotation the driver manager uncordons a fresh node; on a
  driver change it pauses the deploy labels, cordons, evicts the GPU pod, unloads,
  uncordons and reschedules, and only then does kwok make the driver pod Ready.
- With ``nvidia.com/gpu-driver-upgrade-enabled=true`` it never cordons: a GPU pod left
  on the node makes the unload fail, the init container crash-loops (the pod held not
  Ready), and the retry after the pod is gone succeeds.
- Status files: an operand pod waiting for the driver's file stays not Ready while the
  driver restarts, and the validator chain releases the later operands.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuop.devcluster import ClusterInfo
from gpuop.devcluster import _driver_manager as dm
from gpuop.devcluster import _node_files as nf
from gpuop.kube.client import api_client as make_api_client
from gpuop.kube.informer import Informer, Obj, ResourceSpec
from gpuop.kube.kinds import KINDS, by_kind
from gpuop.kube.rest import Rest
from gpuop.operator.install import ensure_namespace
from tests.integration.harness import eventually, own_cluster

pytestmark = pytest.mark.integration

NODE = by_kind("v1", "Node")
POD = by_kind("v1", "Pod")
DAEMONSET = by_kind("apps/v1", "DaemonSet")
NAMESPACE_KIND = by_kind("v1", "Namespace")
A, B = "gpu-node-0000", "gpu-node-0001"
PLUGIN_APP = "nvidia-device-plugin-daemonset"
VALIDATIONS = "/run/nvidia/validations"


@pytest.fixture(scope="module")
def sim() -> Iterator[ClusterInfo]:
    with own_cluster("-images-sim", gpu_nodes=2, node_images=True) as info:
        yield info


@pytest.fixture(scope="module")
async def rest(sim: ClusterInfo) -> AsyncIterator[Rest]:
    async with make_api_client(sim.kubeconfig, user_agent="gpuop-tests") as api:
        yield Rest(api, KINDS)


@pytest.fixture
async def ns(rest: Rest) -> AsyncIterator[str]:
    """The operator namespace the driver pods run in (OPERATOR_NAMESPACE's fieldRef)."""
    name = f"ops-{uuid.uuid4().hex[:6]}"
    await ensure_namespace(rest, name)

    async def account() -> bool:
        return await rest.get(by_kind("v1", "ServiceAccount"), "default", name) is not None

    await eventually(account, timeout=30)
    try:
        yield name
    finally:
        await rest.delete(NAMESPACE_KIND, name)


def _env(name: str, value: str) -> dict[str, Any]:
    return {"name": name, "value": value}


def _field(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def driver_pod(name: str, node: str, digest: str) -> dict[str, Any]:
    """A bare pod shaped like our driver pod (labels, manager env as rendered)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"app": "nvidia-driver-daemonset", nf.COMPONENT_LABEL: "nvidia-driver"},
        },
        "spec": {
            "nodeName": node,
            "initContainers": [
                {
                    "name": dm.MANAGER_CONTAINER,
                    "image": "nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.9.0",
                    "command": ["driver-manager"],
                    "args": ["uninstall_driver"],
                    "env": [
                        _field("NODE_NAME", "spec.nodeName"),
                        _env("ENABLE_GPU_POD_EVICTION", "true"),
                        _env("ENABLE_AUTO_DRAIN", "false"),
                        _env("DRAIN_USE_FORCE", "true"),
                        _env("DRAIN_POD_SELECTOR_LABEL", ""),
                        _env("DRAIN_TIMEOUT_SECONDS", "0s"),
                        _env("DRAIN_DELETE_EMPTYDIR_DATA", "false"),
                        _field("OPERATOR_NAMESPACE", "metadata.namespace"),
                        _env("DRIVER_CONFIG_DIGEST", digest),
                    ],
                }
            ],
            "containers": [{"name": "nvidia-driver-ctr", "image": "nvcr.io/nvidia/driver:580"}],
        },
    }


def gpu_pod(name: str, node: str) -> dict[str, Any]:
    """A GPU workload no controller manages (DRAIN_USE_FORCE lets the manager take it)."""
    limits = {"nvidia.com/gpu": "1"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "trainer"}},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "image": "cuda", "resources": {"limits": limits}}],
        },
    }


def operand_pod(name: str, node: str, app: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}], **spec},
    }


def _sh(name: str, script: str) -> dict[str, Any]:
    return {"name": name, "image": "gpuop", "command": ["sh", "-c"], "args": [script]}


def plugin_daemonset(node: str) -> dict[str, Any]:
    labels = {"app": PLUGIN_APP}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "plugin", "labels": labels},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {dm.DEVICE_PLUGIN: "true", "kubernetes.io/hostname": node},
                    "containers": [{"name": "plugin", "image": "plugin"}],
                },
            },
        },
    }


def _ready(pod: Obj | None) -> bool:
    conditions = ((pod or {}).get("status") or {}).get("conditions") or ()
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


class Recorder:
    """Every node and pod event, with the (monotonic) time it arrived."""

    def __init__(self, rest: Rest) -> None:
        self.events: list[tuple[float, str, Obj]] = []
        self.nodes = Informer(ResourceSpec("t-nodes", rest.lister(NODE)), self._on_node)
        self.pods = Informer(ResourceSpec("t-pods", rest.lister(POD)), self._on_pod)

    def _on_node(self, event: str, old: Obj | None, new: Obj | None) -> None:
        if new is not None:
            self.events.append((time.monotonic(), "node", new))

    def _on_pod(self, event: str, old: Obj | None, new: Obj | None) -> None:
        if new is not None:
            self.events.append((time.monotonic(), "pod", new))

    def node_history(self, name: str) -> list[Obj]:
        return [o for _, kind, o in self.events if kind == "node" and o["metadata"]["name"] == name]

    def first(self, kind: str, name: str, test: Any) -> float | None:
        for at, k, obj in self.events:
            if k == kind and obj["metadata"]["name"] == name and test(obj):
                return at
        return None

    def pod(self, namespace: str, name: str) -> Obj | None:
        return self.pods.get(f"{namespace}/{name}")


@contextlib.asynccontextmanager
async def recording(rest: Rest) -> AsyncIterator[Recorder]:
    rec = Recorder(rest)
    tasks = [asyncio.create_task(rec.nodes.run()), asyncio.create_task(rec.pods.run())]
    try:
        await rec.nodes.synced.wait()
        await rec.pods.synced.wait()
        yield rec
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


def log_lines(info: ClusterInfo, **match: str) -> list[dict[str, str]]:
    """The simulator's key=value lines whose fields include ``match``."""
    path = Path(info.directory) / "logs" / "node-images.log"
    result = []
    for line in path.read_text().splitlines():
        if not line.startswith("ts="):
            continue
        fields: dict[str, str] = {}
        for part in _split(line):
            key, _, value = part.partition("=")
            fields[key] = value.strip("'\"")
        if all(fields.get(k) == v for k, v in match.items()):
            result.append(fields)
    return result


def _split(line: str) -> list[str]:
    """Split on spaces outside quotes (the log quotes values with spaces)."""
    parts, current, quote = [], "", ""
    for ch in line:
        if quote:
            current += ch
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
            current += ch
        elif ch == " ":
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return parts


async def _gone(rest: Rest, name: str, namespace: str) -> None:
    async def gone() -> bool:
        return await rest.get(POD, name, namespace) is None

    await eventually(gone, timeout=30, what=f"{namespace}/{name} gone")


async def test_driver_manager_evicts_cordons_and_uncordons_before_the_driver_is_ready(
    rest: Rest, ns: str, sim: ClusterInfo
) -> None:
    await rest.merge_patch(
        NODE,
        A,
        {
            "metadata": {"labels": {dm.DEVICE_PLUGIN: "true", dm.DCGM: "false"}},
            "spec": {"unschedulable": True},  # an old cordon: a fresh node is uncordoned
        },
    )
    async with recording(rest) as rec:
        await rest.create(DAEMONSET, plugin_daemonset(A), ns)

        def plugin_ready() -> list[Obj]:
            return [
                p
                for p in rec.pods.values()
                if p["metadata"]["namespace"] == ns
                and p["metadata"]["labels"].get("app") == PLUGIN_APP
                and _ready(p)
            ]

        async def plugin_up() -> bool:
            return bool(plugin_ready())

        await eventually(plugin_up, timeout=30, what="operand pod (held app, waits for nothing)")
        first_plugin = plugin_ready()[0]["metadata"]["uid"]

        # Fresh node: no driver loaded, nothing evicted, the node uncordoned.
        await rest.create(POD, driver_pod("driver-1", A, "d1"), ns)

        async def d1_ready() -> bool:
            return _ready(rec.pod(ns, "driver-1"))

        await eventually(d1_ready, timeout=30, what="fresh driver pod Ready")
        node = rec.nodes.get(A)
        assert node is not None
        assert not node["spec"].get("unschedulable")
        steps = [x["step"] for x in log_lines(sim, event="step", pod=f"{ns}/driver-1")]
        assert steps == ["uncordon", "reschedule-labels"]

        # A GPU workload, then a driver change: the manager empties the node itself.
        await rest.create(POD, gpu_pod("trainer", A), ns)

        async def trainer_ready() -> bool:
            return _ready(rec.pod(ns, "trainer"))

        await eventually(trainer_ready, timeout=30)
        await rest.delete(POD, "driver-1", ns)
        await _gone(rest, "driver-1", ns)
        mark = len(rec.events)
        await rest.create(POD, driver_pod("driver-2", A, "d2"), ns)

        async def d2_ready() -> bool:
            return _ready(rec.pod(ns, "driver-2"))

        await eventually(d2_ready, timeout=40, what="driver pod Ready after its steps")

        assert rec.pod(ns, "trainer") is None  # evicted
        history = [
            o for _, kind, o in rec.events[mark:] if kind == "node" and o["metadata"]["name"] == A
        ]
        cordoned = [bool(o["spec"].get("unschedulable")) for o in history]
        assert True in cordoned, "never cordoned"
        assert cordoned[-1] is False, "left cordoned"
        plugin_values = [o["metadata"]["labels"].get(dm.DEVICE_PLUGIN) for o in history]
        assert dm.PAUSED in plugin_values
        assert plugin_values[-1] == "true"
        assert {o["metadata"]["labels"].get(dm.DCGM) for o in history} == {"false"}
        # Upstream writes every label of its patch: absent ones as "" (a plain map).
        assert history[-1]["metadata"]["labels"].get(dm.NVSM) == ""

        uncordoned = max(
            at
            for at, kind, o in rec.events[mark:]
            if kind == "node"
            and o["metadata"]["name"] == A
            and not o["spec"].get("unschedulable")
            and dm.PAUSED in o["metadata"]["labels"].values()
        )
        ready_at = rec.first("pod", "driver-2", _ready)
        assert ready_at is not None
        assert uncordoned < ready_at
        steps = [x["step"] for x in log_lines(sim, event="step", pod=f"{ns}/driver-2")]
        folded = [s for i, s in enumerate(steps) if i == 0 or s != steps[i - 1]]
        assert folded == [
            "pause-labels",
            "wait-pods-gone",
            "cordon",
            "evict-gpu-pods",
            "unload",
            "uncordon",
            "reschedule-labels",
        ]

        # The paused operand went and came back (a new pod, released once more).
        async def plugin_back() -> bool:
            return any(p["metadata"]["uid"] != first_plugin for p in plugin_ready())

        await eventually(plugin_back, timeout=30, what="operand rescheduled")
    await rest.merge_patch(NODE, A, {"metadata": {"labels": {k: None for k in dm.FETCHED}}})


async def test_upgrade_policy_node_is_never_cordoned_and_files_gate_operands(
    rest: Rest, ns: str, sim: ClusterInfo
) -> None:
    files_ns = f"{ns}-files"  # not the operator namespace: the manager waits for nothing here
    await ensure_namespace(rest, files_ns)
    await rest.merge_patch(
        NODE,
        B,
        {
            "metadata": {
                "labels": {dm.DEVICE_PLUGIN: "true"},
                "annotations": {dm.UPGRADE_ENABLED_ANNOTATION: "true"},
            }
        },
    )
    try:
        async with recording(rest) as rec:
            await rest.create(POD, driver_pod("driver-1", B, "d1"), ns)

            async def d1_ready() -> bool:
                return _ready(rec.pod(ns, "driver-1"))

            await eventually(d1_ready, timeout=30)
            await rest.create(POD, gpu_pod("trainer", B), ns)

            async def trainer_ready() -> bool:
                return _ready(rec.pod(ns, "trainer"))

            await eventually(trainer_ready, timeout=30)
            await rest.delete(POD, "driver-1", ns)
            await _gone(rest, "driver-1", ns)
            removed = log_lines(sim, event="files", node=B)
            assert removed
            assert nf.DRIVER_CTR_READY in removed[-1]["removed"]
            await rest.create(POD, driver_pod("driver-2", B, "d2"), ns)
            # The driver's file is gone with the old pod: the toolkit's driver check waits.
            check = (
                "until gpuop node-agent validate --checks driver --driver-root /run/nvidia/driver"
                " --driver-container; do sleep 5; done"
            )
            toolkit = operand_pod(
                "toolkit", B, nf.TOOLKIT_APP, initContainers=[_sh("driver-validation", check)]
            )
            await rest.create(POD, toolkit, files_ns)

            # The GPU pod holds the driver: the unload fails, the pod crash-loops.
            async def failed() -> bool:
                return bool(log_lines(sim, event="driver-manager-failed", pod=f"{ns}/driver-2"))

            await eventually(failed, timeout=30, what="unload refused while a GPU pod runs")
            await asyncio.sleep(1)
            assert not _ready(rec.pod(ns, "driver-2"))  # held by kwok
            assert not _ready(rec.pod(files_ns, "toolkit"))
            held = rec.pod(ns, "driver-2")
            assert held is not None
            statuses = held["status"].get("initContainerStatuses") or []
            assert statuses
            assert statuses[0]["restartCount"] == 1
            node = rec.nodes.get(B)
            assert node is not None
            assert node["metadata"]["labels"][dm.DEVICE_PLUGIN] == "true"  # rescheduled

            await rest.delete(POD, "trainer", ns)

            async def d2_ready() -> bool:
                return _ready(rec.pod(ns, "driver-2")) and _ready(rec.pod(files_ns, "toolkit"))

            await eventually(d2_ready, timeout=40, what="retry after the back-off, then toolkit")
            history = rec.node_history(B)
            assert not any(o["spec"].get("unschedulable") for o in history), "cordoned"
            assert dm.PAUSED in [o["metadata"]["labels"].get(dm.DEVICE_PLUGIN) for o in history]
            kinds = {x["step"] for x in log_lines(sim, event="step", node=B)}
            assert not kinds & {"cordon", "uncordon", "evict-gpu-pods", "drain"}
            toolkit_at = rec.first("pod", "toolkit", _ready)
            driver_at = rec.first("pod", "driver-2", _ready)
            assert toolkit_at is not None
            assert driver_at is not None
            assert toolkit_at > driver_at

            # The validator's init containers write driver-ready and toolkit-ready, its
            # main container cuda-ready and plugin-ready (components/validator.py).
            wait = f"until [ -f {VALIDATIONS}/toolkit-ready ]; do echo waiting; sleep 5; done"
            plugin = operand_pod(
                "plugin", B, PLUGIN_APP, initContainers=[_sh("toolkit-validation", wait)]
            )
            probe = {"exec": {"command": ["test", "-f", f"{VALIDATIONS}/plugin-ready"]}}
            toolkit_check = ["gpuop", "node-agent", "validate", "--checks", "toolkit"]
            validator = operand_pod(
                "validator",
                B,
                nf.VALIDATOR_APP,
                initContainers=[
                    _sh("driver-validation", check),
                    {"name": "toolkit-validation", "image": "gpuop", "command": toolkit_check},
                ],
                containers=[
                    {
                        "name": "nvidia-operator-validator",
                        "image": "gpuop",
                        "command": ["gpuop", "node-agent", "validate", "--checks", "cuda,plugin"],
                        "readinessProbe": probe,
                    }
                ],
            )
            await rest.create(POD, plugin, files_ns)
            await rest.create(POD, validator, files_ns)

            async def chain() -> bool:
                return _ready(rec.pod(files_ns, "plugin")) and _ready(
                    rec.pod(files_ns, "validator")
                )

            await eventually(chain, timeout=30, what="validator chain")
            last = log_lines(sim, event="files", node=B)[-1]["files"].split(",")
            assert {nf.TOOLKIT_READY, nf.CUDA_READY, nf.PLUGIN_READY} <= set(last)
    finally:
        await rest.delete(NAMESPACE_KIND, files_ns)
        await rest.merge_patch(
            NODE,
            B,
            {
                "metadata": {
                    "labels": {k: None for k in dm.FETCHED},
                    "annotations": {dm.UPGRADE_ENABLED_ANNOTATION: None},
                }
            },
        )


async def test_a_driver_pod_deleted_mid_steps_cancels_them(
    rest: Rest, ns: str, sim: ClusterInfo
) -> None:
    """The manager waits for an operand nobody removes; deleting its driver pod stops it
    there (labels stay paused, as a killed init container leaves them) and the next
    driver pod's manager reschedules them."""
    await rest.merge_patch(NODE, A, {"metadata": {"labels": {dm.DEVICE_PLUGIN: "true"}}})
    try:
        async with recording(rest) as rec:
            await rest.create(POD, driver_pod("driver-0", A, "d0"), ns)

            async def loaded() -> bool:
                return _ready(rec.pod(ns, "driver-0"))

            await eventually(loaded, timeout=30)
            await rest.delete(POD, "driver-0", ns)
            await _gone(rest, "driver-0", ns)
            await rest.create(POD, operand_pod("dcgm", A, "nvidia-dcgm"), ns)

            async def dcgm_ready() -> bool:
                return _ready(rec.pod(ns, "dcgm"))

            await eventually(dcgm_ready, timeout=30)
            await rest.create(POD, driver_pod("driver-3", A, "d3"), ns)
            pod = f"{ns}/driver-3"

            async def waiting() -> bool:
                return bool(log_lines(sim, event="step", pod=pod, app="nvidia-dcgm-exporter"))

            await eventually(waiting, timeout=30, what="manager waiting for nvidia-dcgm")
            await rest.delete(POD, "driver-3", ns)

            async def cancelled() -> bool:
                return bool(log_lines(sim, event="cancelled", pod=pod))

            await eventually(cancelled, timeout=30)
            await rest.delete(POD, "dcgm", ns)  # what the run waited for: it must not go on
            await _gone(rest, "dcgm", ns)
            await _gone(rest, "driver-3", ns)
            await asyncio.sleep(0.5)
            after = [x["step"] for x in log_lines(sim, event="step", pod=pod)]
            assert "cordon" not in after
            assert not log_lines(sim, event="step", pod=pod, app="nvidia-dcgm")
            assert not log_lines(sim, event="driver-manager-done", pod=pod)
            node = rec.nodes.get(A)
            assert node is not None
            assert node["metadata"]["labels"][dm.DEVICE_PLUGIN] == dm.PAUSED

            await rest.create(POD, driver_pod("driver-4", A, "d3"), ns)

            async def back() -> bool:
                current = rec.nodes.get(A) or {"metadata": {"labels": {}}}
                labels = current["metadata"]["labels"]
                return _ready(rec.pod(ns, "driver-4")) and labels.get(dm.DEVICE_PLUGIN) == "true"

            await eventually(back, timeout=30, what="next driver pod reschedules the operands")
    finally:
        await rest.merge_patch(NODE, A, {"metadata": {"labels": {k: None for k in dm.FETCHED}}})
