"""The walk of one node name through a node pass: which modules it visits, how often it
climbs from the pure core back into the shell (issue 45, item 1).

Run: ``python -m tests.tools.walk [--verbose]``. The real operator is built over caches
filled by hand and an API that answers from memory (no awaits that suspend), and one
node pass runs per scenario under ``sys.setprofile``.

Counting rule:

- A frame is *on the walk* when it runs code of ``gpuop``, ``statemachine``,
  ``components`` or ``crd`` (generated code, e.g. a dataclass's ``__init__``, is not
  counted: it has no source file) and one of its arguments carries the node's name: the
  name itself, an object (node) whose ``metadata.name`` is it, or a value whose ``name``
  or ``node`` attribute is it (views, snapshots, plans, decisions).
- The walk is where execution stands among those frames: a call into an on-walk frame
  moves it to the callee's module, that frame's return moves it back to the caller's
  (the nearest on-walk frame below it). Consecutive positions in one module collapse
  into one *stop*.
- *Modules*: the distinct modules among the stops. *Returns*: stops in a module the walk
  had already left. *Climbs*: stops in a ``gpuop`` module that directly follow a stop in
  a pure-core module (``statemachine``, ``components``, ``crd``).
- Rule ``core as one stop``: a descent into the pure core is one stop in the module
  entered (what the core does inside is its own business; a shell frame reached from
  inside the core, a callback, is still a stop and a climb).
- Rule ``+ edges``: besides, the shell's infrastructure below the controller
  (``gpuop.kube.informer``, ``gpuop.kube.compact``, ``gpuop.operator.events``,
  ``gpuop.kube.rest``, ``gpuop.log``, ``gpuop.kube.kinds``: caches and I/O, which know no
  node pass), and the caches' record types (``views.pod_records``: a ``PodRecord``'s
  fields and its conversion to the rulebook's pod view; ``views.node_views``: a cached
  node's labels) are edges, not stops, and
  what runs inside it (an informer's transform) is not followed.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import crd
from components.keys import NFD_GPU_LABELS
from components.labels import apply_label_changes, node_label_changes
from gpuop.operator.controller.base.config import OperatorConfig
from gpuop.operator.controller.wiring.operator import Operator
from gpuop.operator.metrics import OperatorMetrics
from statemachine.upgrade_keys import (
    INITIAL_UNSCHEDULABLE_ANNOTATION,
    STATE_LABEL,
    STATE_SINCE_ANNOTATION,
)
from tests.factories import operand_pod

Obj = dict[str, Any]
OURS = ("gpuop", "statemachine", "components", "crd")
CORE = ("statemachine", "components", "crd")
EDGES = (
    # the caches' record types: a pod record's fields, a cached node's labels
    "gpuop.operator.controller.views.pod_records",
    "gpuop.operator.controller.views.node_views",
    "gpuop.kube.informer",
    "gpuop.kube.compact",
    "gpuop.operator.events",
    "gpuop.kube.rest",
    "gpuop.log",
    "gpuop.kube.kinds",
)
NAME = "gpu-0"


class MemoryRest:
    """An API over memory: patches apply to the node it holds, lists return ``pods``."""

    def __init__(self, node: Obj, pods: list[Obj]) -> None:
        self.node = copy.deepcopy(node)
        self.pods = pods
        self.writes: list[tuple[str, Any]] = []

    def lister(self, *_: Any, **__: Any) -> Any:
        async def never(**_: Any) -> Any:
            raise AssertionError("no informer runs here")

        return never

    async def list(self, kind: Any, namespace: Any = None, **selectors: str) -> list[Obj]:
        if selectors.get("field_selector") == f"spec.nodeName={NAME}":
            return copy.deepcopy(self.pods)
        return []

    async def get(self, *_: Any, **__: Any) -> Obj | None:
        return None

    async def merge_patch(self, kind: Any, name: str, patch: Obj, *_: Any, **__: Any) -> Obj:
        self.writes.append(("patch", patch))
        meta = self.node["metadata"]
        for part in ("labels", "annotations"):
            values = meta.setdefault(part, {})
            for key, value in ((patch.get("metadata") or {}).get(part) or {}).items():
                if value is None:
                    values.pop(key, None)
                else:
                    values[key] = value
        if "spec" in patch:
            self.node["spec"].update(patch["spec"])
        meta["resourceVersion"] = str(int(meta.get("resourceVersion", "1")) + 1)
        return copy.deepcopy(self.node)

    async def create(self, kind: Any, obj: Obj, *_: Any, **__: Any) -> Obj:
        self.writes.append(("create", obj.get("reason")))
        return obj

    async def apply(self, obj: Any, *_: Any, **__: Any) -> Obj:
        self.writes.append(("apply", obj))
        return dict(obj)

    async def delete(self, *args: Any, **__: Any) -> None:
        self.writes.append(("delete", args))

    async def evict(self, *args: Any, **__: Any) -> None:
        self.writes.append(("evict", args))


def _policy(drain: bool) -> Obj:
    policy = crd.sample_policy()
    up = policy["spec"]["driver"].setdefault("upgradePolicy", {})
    up["autoUpgrade"] = True
    if drain:
        up["drain"] = {"enable": True, "force": True, "timeoutSeconds": 3000}
    policy["metadata"].update(
        uid="p", resourceVersion="1", creationTimestamp="2026-01-01T00:00:00Z", generation=1
    )
    return policy


def _node(node_labels: dict[str, str], annotations: dict[str, str], cordoned: bool) -> Obj:
    return {
        "metadata": {
            "name": NAME,
            "uid": "n",
            "resourceVersion": "7",
            "labels": node_labels,
            "annotations": annotations,
        },
        "spec": {"unschedulable": True} if cordoned else {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def _workload_pod() -> Obj:
    return {
        "metadata": {
            "name": "train",
            "namespace": "ml",
            "uid": "w",
            "ownerReferences": [{"kind": "ReplicaSet", "name": "train-1", "controller": True}],
        },
        "spec": {"nodeName": NAME, "containers": [{"name": "c"}]},
        "status": {"phase": "Running"},
    }


def _operand_pod(app: str, revision: str) -> Obj:
    return operand_pod(app, NAME, revision, uid=f"uid-{app}")


def scenario(which: str) -> tuple[Operator, MemoryRest]:
    """``enrol``: a new GPU node gets its deploy labels, the hand-off annotation and its
    first upgrade state in one write. ``drain``: a node in ``drain-required`` under a
    policy that drains, its driver and validator pods running: its pods are listed,
    planned and evicted."""
    gpu = {NFD_GPU_LABELS[0]: "true"}
    policy = _policy(drain=which == "drain")
    if which == "enrol":
        node = _node(gpu, {}, cordoned=False)
        pods: list[Obj] = []
    else:
        spec = crd.parse_policy(policy)[0]
        assert spec is not None
        deployed = apply_label_changes(gpu, node_label_changes(gpu, spec.spec))
        node = _node(
            {**deployed, STATE_LABEL: "drain-required"},
            {
                STATE_SINCE_ANNOTATION: "1700000000",
                INITIAL_UNSCHEDULABLE_ANNOTATION: "false",
                "nvidia.com/gpu-driver-upgrade-enabled": "true",
            },
            cordoned=True,
        )
        pods = [_workload_pod()]
    rest = MemoryRest(node, pods)
    op = Operator(rest, OperatorConfig(), OperatorMetrics())  # type: ignore[arg-type]
    op.policies.observe(policy)
    op.nodes.observe(node)
    if which == "drain":
        op.pods.observe(_operand_pod("nvidia-driver-daemonset", "old"))
        op.pods.observe(_operand_pod("nvidia-operator-validator", "v1"))
    for informer in [*op.informers, op.owners.drivers]:
        informer.synced.set()
    op.gpuclusters.knows_whether_one_exists = lambda: True  # type: ignore[method-assign]
    return op, rest


def _carries(value: Any, name: str) -> bool:
    if isinstance(value, str):
        return value == name
    if isinstance(value, dict):
        meta = value.get("metadata")
        return isinstance(meta, dict) and meta.get("name") == name
    for attr in ("name", "node"):
        try:
            got = getattr(value, attr, None)
        except Exception:
            continue
        if isinstance(got, str) and got == name:
            return True
    return False


def _module(frame: FrameType) -> str:
    return str(frame.f_globals.get("__name__", ""))


def _ours(frame: FrameType) -> bool:
    module = _module(frame)
    return (
        module.split(".", 1)[0] in OURS
        and not frame.f_code.co_filename.startswith("<")
        and module != __name__
    )


def _on_walk(frame: FrameType, name: str) -> bool:
    code = frame.f_code
    count = code.co_argcount + code.co_kwonlyargcount
    count += bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)
    for var in code.co_varnames[:count]:
        value = frame.f_locals.get(var)
        if isinstance(value, tuple | list) and any(_carries(v, name) for v in value):
            return True
        if (
            isinstance(value, dict)
            and not _carries(value, name)
            and any(_carries(v, name) for v in value.values())
        ):
            return True
        if _carries(value, name):
            return True
    return False


def _core(module: str) -> bool:
    return module.split(".", 1)[0] in CORE


class Walk:
    def __init__(self, name: str, core_whole: bool, edges: bool = False) -> None:
        self.name = name
        self.core_whole = core_whole
        self.edges = edges
        self.stack: list[tuple[int, str, str]] = []  # (frame id, module, function)
        self.positions: list[tuple[str, str]] = []
        self._edge: int | None = None  # the frame of the edge being run

    def _at(self, module: str, function: str) -> None:
        self.positions.append((module, function))

    def profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if self._edge is not None:
            if event == "return" and id(frame) == self._edge:
                self._edge = None
            return
        if event == "call":
            if not _ours(frame):
                return
            module = _module(frame)
            if self.edges and module in EDGES:
                self._edge = id(frame)
                return
            inside_core = bool(self.stack) and _core(self.stack[-1][1])
            if self.core_whole and inside_core and _core(module):
                return  # the core's own business
            if not _on_walk(frame, self.name):
                return
            self.stack.append((id(frame), module, frame.f_code.co_name))
            self._at(module, frame.f_code.co_name)
        elif event == "return" and self.stack and self.stack[-1][0] == id(frame):
            self.stack.pop()
            if self.stack:
                self._at(self.stack[-1][1], self.stack[-1][2])

    def stops(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for module, function in self.positions:
            if out and out[-1][0] == module:
                continue
            out.append((module, function))
        return out

    def counts(self) -> dict[str, int]:
        stops = self.stops()
        seen: set[str] = set()
        returns = climbs = 0
        previous: str | None = None
        for module, _ in stops:
            if module in seen:
                returns += 1
            seen.add(module)
            if previous is not None and _core(previous) and not _core(module):
                climbs += 1
            previous = module
        return {"stops": len(stops), "modules": len(seen), "returns": returns, "climbs": climbs}


def walk(which: str, core_whole: bool, edges: bool = False) -> Walk:
    op, _ = scenario(which)
    tracer = Walk(NAME, core_whole, edges)

    async def one_pass() -> None:
        sys.setprofile(tracer.profile)
        try:
            await op.node_passes.reconcile_node(NAME)
        finally:
            sys.setprofile(None)

    asyncio.run(one_pass())
    return tracer


def main(argv: list[str] | None = None, out: Callable[[str], None] = print) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    rules = (
        (False, False, "every frame"),
        (True, False, "core as one stop"),
        (True, True, "+ edges"),
    )
    for which in ("enrol", "drain"):
        for core_whole, edges, rule in rules:
            tracer = walk(which, core_whole, edges)
            out(f"{which:6} {rule:17} {tracer.counts()}")
            if args.verbose:
                mods = sorted({m for m, _ in tracer.stops()})
                out("    modules: " + ", ".join(mods))
                out("    " + " > ".join(f"{m.rsplit('.', 1)[-1]}.{f}" for m, f in tracer.stops()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
