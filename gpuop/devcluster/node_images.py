"""The node-image simulator: plays, for each simulated node, what NVIDIA's node images do
through the API, which kwok (it runs no container) cannot.

- Driver pods (``_node_files.DRIVER_COMPONENTS``): their ``k8s-driver-manager`` init
  container's steps (``_driver_manager.plan``): pause the deploy labels, wait for the
  operands to go, cordon, evict GPU pods, unload the driver, uncordon, reschedule. A
  failed run is retried as the kubelet restarts a failed init container (back-off 10 s
  doubling to 300 s). The pod is released (kwok makes it Ready) only when a run
  succeeds; a driver pod deleted meanwhile cancels its run.
- Operand pods (``_node_files.HELD_APPS``): released once the status files they wait
  for exist on their node (``_node_files.advance``).

Per node it keeps what the kernel would: whether a driver is loaded (a driver pod
became Ready; the unload step clears it) and the digest it was installed with.

Run by ``LocalCluster.up(node_images=True)`` as ``python -m gpuop.devcluster.node_images
--kubeconfig PATH``; one key=value line per step goes to stdout (the cluster's
``logs/node-images.log``). The operator never imports this (import-linter contract
``operator-without-simulator``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from kubernetes_asyncio.client.exceptions import ApiException

from gpuop.kube.informer import Informer, ResourceSpec, key_of
from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Rest

from . import _driver_manager as dm
from . import _node_files as nf
from ._nodes import KWOK_ANNOTATION

NODE = by_kind("v1", "Node")
POD = by_kind("v1", "Pod")
DAEMONSET = by_kind("apps/v1", "DaemonSet")
CLAIM = by_kind("resource.k8s.io/v1", "ResourceClaim")

BACKOFF_INITIAL_S = 10.0
BACKOFF_MAX_S = 300.0
"""The kubelet's restart back-off for a failed container (CrashLoopBackOff)."""
EVICT_RETRY_S = 1.0
"""Between evictions a PodDisruptionBudget refuses (429). Upstream's drain helper is
given no delay and retries at once; a second keeps the simulator from spinning."""
RETRY_S = 1.0
"""Before a release that failed is tried again."""
PATCH_ATTEMPTS = 4
"""``client.go:UpdateNodeLabels`` retries a failed patch (7 times, from 1 s doubling);
fewer here, the local API server does not flap."""

Obj = dict[str, Any]


def _fmt(value: object) -> str:
    text = str(value)
    return repr(text) if (" " in text or not text or "=" in text) else text


@dataclass
class NodeState:
    """What the simulated node's kernel and /run/nvidia hold."""

    loaded: bool = False
    digest: str | None = None
    files: set[str] = field(default_factory=set)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


def _deleting(pod: Mapping[str, Any]) -> bool:
    return bool(pod.get("metadata", {}).get("deletionTimestamp"))


def _ready(pod: Mapping[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or ()
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _node_of(pod: Mapping[str, Any]) -> str | None:
    name = pod.get("spec", {}).get("nodeName")
    return str(name) if name else None


def _terminal(pod: Mapping[str, Any]) -> bool:
    return pod.get("status", {}).get("phase") in ("Succeeded", "Failed")


class Simulator:
    """Watches nodes and pods; one driver-manager run per held driver pod (serialised
    per node), and status-file releases as pods change."""

    def __init__(self, rest: Rest, out: TextIO = sys.stdout) -> None:
        self.rest = rest
        self.out = out
        self.nodes: Informer[Obj] = Informer(
            ResourceSpec("nodes", rest.lister(NODE)), self._on_node
        )
        self.pods: Informer[Obj] = Informer(
            ResourceSpec("pods", rest.lister(POD), index=_node_of), self._on_pod
        )
        self.state: dict[str, NodeState] = {}
        self.runs: dict[str, asyncio.Task[None]] = {}
        self._releasing: set[str] = set()
        self._stopped: set[str] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._changed = asyncio.Event()
        self.started = False

    # ------------------------------------------------------------------ log
    def log(self, event: str, **fields: object) -> None:
        stamp = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        parts = [f"ts={stamp}", f"event={event}"]
        parts += [f"{k}={_fmt(v)}" for k, v in fields.items()]
        self.out.write(" ".join(parts) + "\n")
        self.out.flush()

    # ------------------------------------------------------------------ run
    async def run(self) -> None:
        watches = [asyncio.create_task(self.nodes.run()), asyncio.create_task(self.pods.run())]
        try:
            await self.nodes.synced.wait()
            await self.pods.synced.wait()
            self._start()
            await asyncio.gather(*watches)
        finally:
            for task in [*watches, *self.runs.values(), *self._tasks]:
                task.cancel()

    def _start(self) -> None:
        """Derive each node's kernel from the driver pods already Ready, then act on
        everything as if just added."""
        self.started = True
        simulated = [n for n in self.nodes.values() if self._simulated(n["metadata"]["name"])]
        self.log("started", nodes=len(simulated), pods=len(self.pods.store))
        # Runs start as tasks, so every Ready driver pod has set its node's kernel
        # (below) before any run reads it.
        for pod in self.pods.values():
            self._on_pod("ADDED", None, pod)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ events
    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _simulated(self, node_name: str) -> bool:
        node = self.nodes.get(node_name)
        annotations = (node or {}).get("metadata", {}).get("annotations") or {}
        return annotations.get(KWOK_ANNOTATION) == "fake"

    def _state(self, node: str) -> NodeState:
        return self.state.setdefault(node, NodeState())

    def _loaded(self, node: str, pod: Mapping[str, Any]) -> None:
        state = self._state(node)
        state.loaded, state.digest = True, dm.pod_digest(pod)
        self.log("driver-loaded", node=node, pod=key_of(dict(pod)), digest=state.digest)

    def _on_node(self, event: str, old: Obj | None, new: Obj | None) -> None:
        self._wake()
        if not self.started or new is None or not self._simulated(new["metadata"]["name"]):
            return
        name = new["metadata"]["name"]
        if old is None:  # pods that came before their node: as if just added
            for pod in self.pods.indexed(name):
                self._on_pod("ADDED", None, pod)
        self._files(name)

    def _on_pod(self, event: str, old: Obj | None, new: Obj | None) -> None:
        self._wake()
        if not self.started:
            return
        pod = new if new is not None else old
        assert pod is not None
        node = _node_of(pod)
        if node is None or not self._simulated(node):
            return
        key, uid = key_of(pod), pod["metadata"].get("uid", "")
        if new is None or _deleting(new):
            task = self.runs.pop(key, None)
            if task is not None and not task.done():
                task.cancel()
                self.log("cancelled", node=node, pod=key, reason="driver pod deleted")
            if uid not in self._stopped:
                self._stopped.add(uid)
                state = self._state(node)
                before = set(state.files)
                state.files = nf.on_stopping(state.files, pod)
                self._log_files(node, before, state.files, f"{key} stopping")
        else:
            if nf.is_driver_pod(new) and _ready(new) and not (old is not None and _ready(old)):
                self._loaded(node, new)
            if nf.is_driver_pod(new) and nf.is_held(new) and key not in self.runs:
                self.runs[key] = asyncio.create_task(self._driver_run(key))
        if new is None:
            self._stopped.discard(uid)
            self._releasing.discard(uid)
        self._files(node)

    def _log_files(self, node: str, before: set[str], after: set[str], why: str) -> None:
        if before != after:
            self.log(
                "files",
                node=node,
                added=",".join(sorted(after - before)) or "-",
                removed=",".join(sorted(before - after)) or "-",
                files=",".join(sorted(after)) or "-",
                why=why,
            )

    def _files(self, node: str) -> None:
        """Advance the node's status files and release the operand pods they let go."""
        state = self._state(node)
        pods = self.pods.indexed(node)
        before = set(state.files)
        state.files = nf.advance(state.files, pods, nf.gpus_advertised(self.nodes.get(node) or {}))
        self._log_files(node, before, state.files, "writers")
        for pod in pods:
            uid = pod["metadata"].get("uid", "")
            if nf.is_driver_pod(pod) or not nf.is_held(pod) or _deleting(pod):
                continue
            if uid in self._releasing or not nf.releasable(pod, state.files):
                continue
            self._releasing.add(uid)
            self._spawn(self._release(pod, "status-files"))

    async def _until(self, check: Callable[[], bool], timeout_s: float | None) -> bool:
        """Wait until ``check()`` holds, re-checked on every watched change."""
        loop = asyncio.get_running_loop()
        deadline = None if not timeout_s else loop.time() + timeout_s
        while True:
            changed = self._changed
            if check():
                return True
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return False
            # Not asyncio.wait_for: on 3.11 it drops a cancel that comes with the wake-up
            # (a deleted driver pod does both at once), and the run would go on.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await changed.wait()

    # ------------------------------------------------------------------ releases
    async def _release(self, pod: Mapping[str, Any], by: str) -> bool:
        """Annotate ``pod`` released (kwok then makes it Ready); False when that failed
        (a status-file release is then tried again a second later)."""
        meta = pod["metadata"]
        patch = {"metadata": {"annotations": {nf.RELEASED_ANNOTATION: by}}}
        try:
            # Cached at once: a stale event meanwhile must not start the pod's run again.
            self.pods.observe(
                await self.rest.merge_patch(POD, meta["name"], patch, meta["namespace"])
            )
        except Exception as err:  # the API server restarting, say: never give a pod up
            self._releasing.discard(meta.get("uid", ""))
            gone = isinstance(err, ApiException) and err.status == 404
            if not gone:
                self.log("release-failed", pod=key_of(dict(pod)), error=f"{type(err).__name__}")
                node = _node_of(pod)
                if node is not None and by == "status-files":
                    asyncio.get_running_loop().call_later(RETRY_S, self._files, node)
            return gone
        self.log("released", node=_node_of(pod), pod=key_of(dict(pod)), by=by)
        return True

    # ------------------------------------------------------------------ driver manager
    async def _driver_run(self, key: str) -> None:
        """Runs of the driver manager until one succeeds, as the kubelet restarts it."""
        restarts = 0
        try:
            while True:
                pod = self.pods.get(key)
                if pod is None or _deleting(pod) or not nf.is_held(pod):
                    return
                node = _node_of(pod)
                assert node is not None
                state = self._state(node)
                try:
                    async with state.lock:
                        outcome = await self._attempt(pod, node, state, restarts)
                except Exception as err:  # no answer from the API server: the run fails
                    outcome = dm.Outcome(False, f"{type(err).__name__}: {err}")
                if outcome.ok:
                    self.log("driver-manager-done", node=node, pod=key, restarts=restarts)
                    while True:
                        if await self._release(pod, "driver-manager"):
                            return
                        await asyncio.sleep(RETRY_S)
                restarts += 1
                delay = min(BACKOFF_INITIAL_S * 2 ** (restarts - 1), BACKOFF_MAX_S)
                self.log(
                    "driver-manager-failed",
                    node=node,
                    pod=key,
                    reason=outcome.reason,
                    restarts=restarts,
                    backoff_s=delay,
                )
                await self._crash_status(pod, restarts, outcome.reason, delay)
                await asyncio.sleep(delay)
        finally:
            if self.runs.get(key) is asyncio.current_task():
                del self.runs[key]

    async def _attempt(
        self, pod: Mapping[str, Any], node: str, state: NodeState, restarts: int
    ) -> dm.Outcome:
        key = key_of(dict(pod))
        env = dm.manager_env(pod)
        if env is None:
            self.log("no-driver-manager", node=node, pod=key)
            return dm.Outcome(True)
        got = await self.rest.get(NODE, node)
        if got is None:
            return dm.Outcome(False, f"node {node} not found")
        view = dm.NodeView.of(got)
        driver = dm.DriverState(state.loaded, state.digest)
        steps = dm.plan(env, view, driver)
        self.log(
            "driver-manager-start",
            node=node,
            pod=key,
            attempt=restarts + 1,
            loaded=driver.loaded,
            stored_digest=driver.stored_digest or "-",
            digest=env.get("DRIVER_CONFIG_DIGEST") or "-",
            upgrade_policy=dm.upgrade_policy_enabled(view),
        )

        async def act(step: dm.Step) -> bool:
            if self.runs.get(key) is not asyncio.current_task():
                raise asyncio.CancelledError  # its pod went: never a step more
            started = time.monotonic()
            try:
                ok, detail = await self._act(step, node, state)
            except ApiException as err:
                ok, detail = False, f"API {err.status}: {err.reason}"
            self.log(
                "step",
                node=node,
                pod=key,
                **step.fields(),
                result="ok" if ok else "failed",
                detail=detail or "-",
                took_s=round(time.monotonic() - started, 2),
            )
            return ok

        return await dm.play(steps, act)

    async def _act(self, step: dm.Step, node: str, state: NodeState) -> tuple[bool, str]:
        kind = step.kind
        if kind in ("pause-labels", "reschedule-labels"):
            return await self._patch_node(node, {"metadata": {"labels": dict(step.labels)}})
        if kind in ("cordon", "uncordon"):
            return await self._cordon(node, kind == "cordon")
        if kind in ("wait-pods-gone", "wait-gpu-clients-gone"):

            def left() -> list[Obj]:
                if kind == "wait-pods-gone":
                    return self._pods_on(node, step.namespace, step.app)
                return self._selector_pods(node, step.node_selector_key)

            waited = len(left())
            ok = await self._until(lambda: not left(), step.timeout_s)
            if not ok:
                return False, f"{len(left())} pod(s) still there after {step.timeout_s:.0f}s"
            return True, f"{waited} pod(s) gone" if waited else ""
        if kind == "evict-gpu-pods":
            assert step.drain is not None
            return await self._evict_gpu_pods(node, step.drain)
        if kind == "drain":
            assert step.drain is not None
            return await self._drain(node, step.drain)
        if kind == "check-claim-holders":
            holders = [key_of(p) for p in await self._gpu_pods(node, claims_only=True)]
            return not holders, ",".join(holders)
        if kind == "unload":
            users = [key_of(p) for p in await self._gpu_pods(node)]
            if users:
                return False, "module nvidia is in use by " + ",".join(users)
            state.loaded, state.digest = False, None
            before = set(state.files)
            state.files -= {nf.DRIVER_CTR_READY, nf.DRIVER_DAEMONS_STATUS}
            self._log_files(node, before, state.files, "driver unloaded")
            return True, "driver unloaded"
        raise AssertionError(f"unplayable step {kind}")

    # ------------------------------------------------------------------ API actions
    async def _patch_node(self, node: str, patch: Mapping[str, Any]) -> tuple[bool, str]:
        delay = 1.0
        for attempt in range(PATCH_ATTEMPTS):
            try:
                self.nodes.observe(await self.rest.merge_patch(NODE, node, patch))
                return True, ""
            except ApiException as err:
                if attempt == PATCH_ATTEMPTS - 1 or err.status == 404:
                    return False, f"API {err.status}"
                await asyncio.sleep(delay)
                delay *= 2
        return False, "unreachable"

    async def _cordon(self, node: str, desired: bool) -> tuple[bool, str]:
        """``drain.RunCordonOrUncordon``: nothing written when already so."""
        got = await self.rest.get(NODE, node)
        if got is None:
            return False, "node not found"
        if bool(got.get("spec", {}).get("unschedulable")) == desired:
            return True, "already " + ("cordoned" if desired else "schedulable")
        return await self._patch_node(node, {"spec": {"unschedulable": True if desired else None}})

    def _pods_on(self, node: str, namespace: str, app: str) -> list[Obj]:
        return [
            p
            for p in self.pods.indexed(node)
            if p["metadata"].get("namespace") == namespace and nf.labels_of(p).get("app") == app
        ]

    def _selector_pods(self, node: str, key: str) -> list[Obj]:
        """``client.go:WaitForPodsWithNodeSelector``: DaemonSet pods selecting on ``key``."""
        return [
            p
            for p in self.pods.indexed(node)
            if (dm.controller_of(p) or {}).get("kind") == "DaemonSet"
            and key in (p.get("spec", {}).get("nodeSelector") or {})
        ]

    async def _gpu_claims(self, pods: Iterable[Mapping[str, Any]]) -> dict[str, set[str]]:
        """Per namespace, the names of the pods' claims allocated to NVIDIA GPUs."""
        result: dict[str, set[str]] = {}
        for pod in pods:
            ns = pod["metadata"]["namespace"]
            for name in dm.claim_names(pod):
                claim = await self.rest.get(CLAIM, name, ns)
                if claim is not None and dm.claim_is_gpu(claim):
                    result.setdefault(ns, set()).add(name)
        return result

    async def _gpu_pods(self, node: str, claims_only: bool = False) -> list[Obj]:
        """Pods on the node that hold the driver: GPU users not yet finished (with
        ``claims_only``, those holding a GPU claim: ``GetGPUResourceClaimHolders``)."""
        pods = [p for p in self.pods.indexed(node) if not _terminal(p)]
        claims = await self._gpu_claims(pods)
        if claims_only:
            return [
                p
                for p in pods
                if set(dm.claim_names(p)) & claims.get(p["metadata"]["namespace"], set())
            ]
        return [p for p in pods if dm.uses_gpu(p, claims.get(p["metadata"]["namespace"], ()))]

    async def _list_node_pods(self, node: str, selector: str = "") -> list[Obj]:
        params = {"field_selector": f"spec.nodeName={node}"}
        if selector:
            params["label_selector"] = selector
        return await self.rest.list(POD, **params)

    async def _verdicts(
        self, pods: list[Obj], opts: dm.DrainOptions, ignore_daemonsets: bool
    ) -> list[tuple[Obj, dm.DeleteVerdict, str]]:
        result = []
        for pod in pods:
            owner = dm.daemonset_owner(pod)
            exists = True
            if owner is not None and not _terminal(pod):
                ds = await self.rest.get(DAEMONSET, owner, pod["metadata"]["namespace"])
                exists = ds is not None
            verdict, why = dm.delete_verdict(
                pod, opts, ignore_daemonsets=ignore_daemonsets, daemonset_exists=exists
            )
            result.append((pod, verdict, why))
        return result

    async def _evict_gpu_pods(self, node: str, opts: dm.DrainOptions) -> tuple[bool, str]:
        """``client.go:DeleteOrEvictPods``: every GPU pod on the node must pass kubectl
        drain's filters (DaemonSets ignored), else nothing is evicted."""
        pods = await self._list_node_pods(node)
        claims = await self._gpu_claims(pods)
        gpu = [p for p in pods if dm.uses_gpu(p, claims.get(p["metadata"]["namespace"], ()))]
        if not gpu:
            return True, "no GPU pods"
        verdicts = await self._verdicts(gpu, opts, ignore_daemonsets=True)
        deletable = [p for p, verdict, _ in verdicts if verdict == "delete"]
        if len(deletable) != len(gpu):
            refused = [
                f"{key_of(p)} ({why})" for p, verdict, why in verdicts if verdict != "delete"
            ]
            return False, "cannot delete all GPU pods: " + "; ".join(refused)
        return await self._evict(deletable, opts.timeout_s)

    async def _drain(self, node: str, opts: dm.DrainOptions) -> tuple[bool, str]:
        """``client.go:DrainNode`` (``drain.RunNodeDrain``): the pods the selector names,
        DaemonSet pods not ignored, so any running one fails the drain."""
        try:
            pods = await self._list_node_pods(node, opts.pod_selector)
        except ApiException as err:
            return False, f"listing pods: API {err.status}"
        verdicts = await self._verdicts(pods, opts, ignore_daemonsets=False)
        errors = [f"{key_of(p)} ({why})" for p, verdict, why in verdicts if verdict == "error"]
        if errors:
            return False, "; ".join(errors)
        return await self._evict([p for p, v, _ in verdicts if v == "delete"], opts.timeout_s)

    async def _evict(self, pods: list[Obj], timeout_s: float) -> tuple[bool, str]:
        """``drain.go:evictPods``: evict each (retrying while a PodDisruptionBudget says
        429), then wait for each to be gone (or replaced by a new uid), all within the
        timeout (0: none)."""
        loop = asyncio.get_running_loop()
        deadline = None if not timeout_s else loop.time() + timeout_s

        async def one(pod: Obj) -> str | None:
            meta = pod["metadata"]
            ns, name, uid = meta["namespace"], meta["name"], meta.get("uid")
            while True:
                if deadline is not None and loop.time() > deadline:
                    return f"{ns}/{name}: global timeout reached"
                try:
                    await self.rest.evict(name, ns)
                    break
                except ApiException as err:
                    if err.status == 404:
                        return None
                    if err.status != 429:
                        return f"{ns}/{name}: API {err.status}"
                await asyncio.sleep(EVICT_RETRY_S)

            def gone() -> bool:
                current = self.pods.get(f"{ns}/{name}")
                return current is None or current["metadata"].get("uid") != uid

            left = None if deadline is None else max(deadline - loop.time(), 0.001)
            if not await self._until(gone, left):
                return f"{ns}/{name}: not gone in time"
            return None

        results = await asyncio.gather(*(one(p) for p in pods))
        errors = [r for r in results if r]
        names = ",".join(key_of(p) for p in pods) or "-"
        return (not errors), ("; ".join(errors) if errors else f"evicted {names}")

    async def _crash_status(
        self, pod: Mapping[str, Any], restarts: int, reason: str, delay: float
    ) -> None:
        """What the kubelet shows for a failed init container: restarts and back-off."""
        container = dm.manager_container(pod) or {"name": dm.MANAGER_CONTAINER}
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        status = {
            "name": container.get("name"),
            "image": container.get("image", ""),
            "imageID": "",
            "ready": False,
            "started": False,
            "restartCount": restarts,
            "state": {
                "waiting": {
                    "reason": "CrashLoopBackOff",
                    "message": f"back-off {delay:.0f}s restarting failed container",
                }
            },
            "lastState": {
                "terminated": {
                    "exitCode": 1,
                    "reason": "Error",
                    "message": reason[:1000],
                    "startedAt": now,
                    "finishedAt": now,
                }
            },
        }
        meta = pod["metadata"]
        with contextlib.suppress(ApiException):
            await self.rest.merge_patch(
                POD,
                meta["name"],
                {"status": {"initContainerStatuses": [status]}},
                meta["namespace"],
                subresource="status",
            )


async def _main(kubeconfig: Path) -> None:
    from gpuop.kube.client import api_client
    from gpuop.kube.kinds import KINDS

    async with api_client(kubeconfig, user_agent="gpuop-node-images") as api:
        await Simulator(Rest(api, KINDS)).run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpuop.devcluster.node_images",
        description="play NVIDIA's driver manager and status files on the simulated nodes",
    )
    parser.add_argument("--kubeconfig", required=True, help="the local cluster's kubeconfig")
    args = parser.parse_args(argv)
    from gpuop.log import configure

    configure(fmt="console")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main(Path(args.kubeconfig)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
