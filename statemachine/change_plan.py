"""What a policy change rolls, before it is applied (`gpuop plan -f`).

The operator renders every component's objects from the policy
(:func:`components.registry.desired_objects`) and writes what differs; a DaemonSet whose
pod template changed replaces its pods. So the preview renders the live policy and the
proposed one with the same context and compares, per DaemonSet, the pod templates the
operator would write: the same computation, so it cannot disagree with it.

What a changed template means on a node differs per operand, and is said so:

* the driver DaemonSet (updated only by the upgrade machine) either restarts its pod
  with the node left as it is, when the install digest (`DRIVER_CONFIG_DIGEST`) on the
  node equals the new one, or reinstalls the driver: cordon, GPU pods removed (and,
  with drain on, every pod drain takes), restart, validation, uncordon — in the
  waves of :func:`statemachine.fleet_plan.plan_upgrade` under the upgrade budget;
* the container toolkit's pods restart the node's container runtime (containerd or
  CRI-O) when they start, which every running container survives but no new one
  starts meanwhile;
* every other DaemonSet rolls under its own update strategy, ``maxUnavailable`` nodes
  at a time (``daemonsets.rollingUpdate.maxUnavailable``), with no cordon.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from statemachine.eviction import uses_gpu
from statemachine.fleet_plan import UpgradePlan
from statemachine.fleet_report import selector_matches
from statemachine.max_unavailable import resolve_max_unavailable

Obj = dict[str, Any]

DRIVER_COMPONENT = "driver"
TOOLKIT_COMPONENT = "container-toolkit"
DIGEST_ENV = "DRIVER_CONFIG_DIGEST"


@dataclass(frozen=True)
class OperandChange:
    """One DaemonSet of one component, and what the change does to its nodes."""

    component: str
    daemonset: str
    action: str
    """``nothing``, ``install`` (new), ``remove``, ``restart`` (rolling pod
    replacement), or for the driver ``upgrade`` (see ``restart_only``/``reinstall``)."""
    nodes: tuple[str, ...] = ()
    """The nodes it runs on (or will run on), in name order."""
    restart_only: tuple[str, ...] = ()
    """Driver: nodes whose installed driver stays (the digest is unchanged)."""
    reinstall: tuple[str, ...] = ()
    """Driver: nodes cordoned and emptied for a new driver install."""
    gpu_pods: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Driver: per reinstalled node, the GPU pods (namespace/name) removed from it."""
    runtime_restart: bool = False
    """The toolkit's pods restart the container runtime on each of ``nodes``."""
    steps: int = 0
    """Rolling steps under ``maxUnavailable`` (driver: the upgrade plan's waves)."""


@dataclass(frozen=True)
class ChangePlan:
    operands: tuple[OperandChange, ...]
    """Every DaemonSet either render has, in rollout order."""
    objects: tuple[str, ...]
    """Other objects (ConfigMaps, RBAC, ...) the change creates, changes or deletes."""
    driver: UpgradePlan | None
    """The driver waves and time bound, when the driver changes."""
    max_unavailable: int

    @property
    def rolling(self) -> tuple[OperandChange, ...]:
        return tuple(o for o in self.operands if o.action != "nothing")


def _template(ds: Obj) -> Obj:
    return dict(ds["spec"]["template"])


def _selector(ds: Obj) -> Obj:
    return dict(ds["spec"]["template"]["spec"].get("nodeSelector") or {})


def _key(obj: Obj) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


def driver_digest(ds: Obj) -> str:
    """The install digest a driver DaemonSet's pods carry ("" when none)."""
    for container in _template(ds)["spec"].get("containers") or []:
        for env in container.get("env") or []:
            if env.get("name") == DIGEST_ENV:
                return str(env.get("value") or "")
    return ""


def plan_change(
    before: Mapping[str, Sequence[Obj]],
    after: Mapping[str, Sequence[Obj]],
    nodes: Sequence[Obj],
    pods: Sequence[Obj],
    *,
    max_unavailable: int | str,
    driver_plan: UpgradePlan | None,
    namespace: str,
) -> ChangePlan:
    """Compare two renders (component -> objects, rollout order) over ``nodes`` and
    their ``pods``; ``driver_plan``: the upgrade waves when the driver template changed
    (the caller plans them with the operator's budget, :func:`driver_changed` says when)."""
    labels = {str(n["metadata"]["name"]): dict(n["metadata"].get("labels") or {}) for n in nodes}
    if isinstance(max_unavailable, str) and max_unavailable.isdigit():
        max_unavailable = int(max_unavailable)  # a DaemonSet count may be written "1"
    width = max(1, resolve_max_unavailable(max_unavailable, max(1, len(labels))))
    gpu_pods: dict[str, list[str]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        node = (pod.get("spec") or {}).get("nodeName")
        if node and meta.get("namespace") != namespace and uses_gpu(pod):
            gpu_pods.setdefault(node, []).append(f"{meta.get('namespace')}/{meta.get('name')}")
    operands: list[OperandChange] = []
    objects: list[str] = []
    for component in dict.fromkeys([*before, *after]):
        old = {_key(o): o for o in before.get(component, ())}
        new = {_key(o): o for o in after.get(component, ())}
        for key in dict.fromkeys([*old, *new]):
            was, will = old.get(key), new.get(key)
            if not key.startswith("DaemonSet/"):
                if was is None or will is None or was != will:
                    objects.append(key)
                continue
            ds = will if will is not None else was
            assert ds is not None
            targets = tuple(
                sorted(
                    n
                    for n, lab in labels.items()
                    if selector_matches({"matchLabels": _selector(ds)}, lab)
                )
            )
            operands.append(
                _operand(component, ds, was, will, targets, width, driver_plan, gpu_pods)
            )
    return ChangePlan(
        operands=tuple(operands),
        objects=tuple(objects),
        driver=driver_plan if any(o.action == "upgrade" for o in operands) else None,
        max_unavailable=width,
    )


def driver_changed(before: Mapping[str, Sequence[Obj]], after: Mapping[str, Sequence[Obj]]) -> bool:
    """Whether any driver DaemonSet's pod template differs between the renders."""
    old = {_key(o): o for o in before.get(DRIVER_COMPONENT, ()) if o["kind"] == "DaemonSet"}
    new = {_key(o): o for o in after.get(DRIVER_COMPONENT, ()) if o["kind"] == "DaemonSet"}
    return old.keys() != new.keys() or any(_template(old[k]) != _template(new[k]) for k in new)


def _operand(
    component: str,
    ds: Obj,
    was: Obj | None,
    will: Obj | None,
    targets: tuple[str, ...],
    width: int,
    driver_plan: UpgradePlan | None,
    gpu_pods: Mapping[str, list[str]],
) -> OperandChange:
    name = str(ds["metadata"]["name"])
    if was is not None and will is not None and _template(was) == _template(will):
        return OperandChange(component, name, "nothing", targets)
    if will is None:
        return OperandChange(component, name, "remove", targets)
    toolkit = component == TOOLKIT_COMPONENT
    if was is None:
        return OperandChange(component, name, "install", targets, runtime_restart=toolkit)
    if component == DRIVER_COMPONENT and driver_plan is not None:
        planned = [n for wave in driver_plan.waves for n in wave if n.name in targets]
        restart = tuple(sorted(n.name for n in planned if n.restart_only))
        reinstall = tuple(sorted(n.name for n in planned if not n.restart_only))
        return OperandChange(
            component,
            name,
            "upgrade",
            targets,
            restart_only=restart,
            reinstall=reinstall,
            gpu_pods={n: tuple(sorted(gpu_pods.get(n, ()))) for n in reinstall},
            steps=len(driver_plan.waves),
        )
    return OperandChange(
        component,
        name,
        "restart",
        targets,
        runtime_restart=toolkit,
        steps=math.ceil(len(targets) / width) if targets else 0,
    )
