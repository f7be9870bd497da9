"""The status files under ``/run/nvidia/validations/`` of each simulated node, as pure
rules: which pods write which file, which pods wait for which, and which pods kwok must
hold (not Ready) until the node-image simulator releases them.

On a real node an operand pod's init container loops until a file of the layer below
exists (docs/operations.md "Rollout order"; ``components/_k8s.py:wait_for_file``); kwok runs no
container, so without these rules every pod is Ready at once. The writers, from our
node contract (``components/driver.py``, ``components/toolkit.py``,
``components/validator.py``, ``gpuop/nodeagent/validate.py``):

- ``.driver-ctr-ready``: the driver container's startup probe, once its driver pod is
  Ready; its preStop removes it (a driver restart takes it away).
- ``driver-ready``: the driver check (the ``driver-validation`` init container of the
  toolkit or of the validator), once the driver works: with ``--driver-container``,
  once ``.driver-ctr-ready`` exists, else at once (a host driver).
- ``toolkit-ready``: the validator's ``toolkit-validation`` init container, after its
  driver check passed, once the node's toolkit pod is Ready (or there is none: a
  toolkit on the host); an init container runs once, so the file then stays.
- ``cuda-ready``, ``plugin-ready``: the validator's main container after its init
  containers: the CUDA check at once (kwok completes its workload; not rechecked), the
  plugin check while the node advertises GPUs (rechecked: a failure takes its file).
  The validator's preStop removes every ``*-ready``; a driver restart stops the
  validator (the driver manager pauses it), which is what takes the chain away.

Readiness: a held pod is released once every file its init containers wait for (or
its readiness probe tests) exists; the validator's probe tests ``plugin-ready``.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping
from typing import Any

RELEASED_ANNOTATION = "sim.gpuop.io/released"
"""Set by the simulator on a held pod; kwok's ``pod-ready`` stage then plays it. The
value says who released it (``driver-manager`` or ``status-files``)."""
COMPONENT_LABEL = "app.kubernetes.io/component"
DRIVER_COMPONENTS = ("nvidia-driver", "nvidia-vgpu-host-manager")
"""Driver pods (ClusterPolicy, precompiled and NVIDIADriver) by their component label:
held until the driver manager's steps are done."""
VALIDATOR_APP = "nvidia-operator-validator"
TOOLKIT_APP = "nvidia-container-toolkit-daemonset"
HELD_APPS = (
    TOOLKIT_APP,
    VALIDATOR_APP,
    "nvidia-device-plugin-daemonset",
    "nvidia-device-plugin-mps-control-daemon",
    "nvidia-dcgm",
    "nvidia-dcgm-exporter",
    "gpu-feature-discovery",
    "nvidia-mig-manager",
)
"""Operand pods (by ``app`` label) whose init containers wait for a status file, or
whose readiness probe tests one: held until the files exist. Pods of these apps that
wait for nothing are released at once, so holding by label never strands a pod."""

VALIDATIONS_DIR = "/run/nvidia/validations"
DRIVER_CTR_READY = ".driver-ctr-ready"
DRIVER_DAEMONS_STATUS = ".driver-daemons-status"
DRIVER_READY = "driver-ready"
TOOLKIT_READY = "toolkit-ready"
CUDA_READY = "cuda-ready"
PLUGIN_READY = "plugin-ready"
DRIVER_CHECK = "node-agent validate --checks driver"
DRIVER_CONTAINER_FLAG = "--driver-container"
GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/mig-")

Pod = Mapping[str, Any]


# ----------------------------------------------------------------- which pods
def labels_of(pod: Pod) -> Mapping[str, str]:
    return pod.get("metadata", {}).get("labels") or {}


def is_driver_pod(pod: Pod) -> bool:
    return labels_of(pod).get(COMPONENT_LABEL) in DRIVER_COMPONENTS


def is_held(pod: Pod) -> bool:
    """Whether kwok holds ``pod`` until released: the same predicate as
    :func:`kwok_hold_query`, built from the same constants."""
    labels = labels_of(pod)
    held = labels.get(COMPONENT_LABEL) in DRIVER_COMPONENTS or labels.get("app") in HELD_APPS
    return held and not is_released(pod)


def is_released(pod: Pod) -> bool:
    return RELEASED_ANNOTATION in (pod.get("metadata", {}).get("annotations") or {})


def _jq_set(values: Iterable[str]) -> str:
    return "{" + ",".join(f'"{v}":true' for v in values) + "}"


def kwok_hold_query() -> str:
    """A kwok selector key (a jq query, run by gojq) that is ``true`` for a pod kwok
    must not make Ready yet. Keys with dots and slashes are indexed as
    ``.metadata.labels["app.kubernetes.io/component"]``; a missing one is null."""
    return (
        f'(({_jq_set(DRIVER_COMPONENTS)}[.metadata.labels["{COMPONENT_LABEL}"] // ""] // false)'
        f' or ({_jq_set(HELD_APPS)}[.metadata.labels.app // ""] // false))'
        f' and (.metadata.annotations["{RELEASED_ANNOTATION}"] == null)'
    )


def hold_expression() -> dict[str, Any]:
    """The matchExpression added to kwok's ``pod-ready`` stage."""
    return {"key": kwok_hold_query(), "operator": "NotIn", "values": ["true"]}


# ----------------------------------------------------------------- what a pod waits for
_WAIT_LOOP = re.compile(r"until ((?:\[ -f \S+ \](?: \|\| )?)+); do [^;]*(?:; [^;]*)*?; done")
_TEST_FILE = re.compile(r"\[ -f (\S+) \]")


def _name_in_validations(path: str) -> str | None:
    head, _, name = path.rpartition("/")
    return name if head == VALIDATIONS_DIR and name else None


def _script(container: Mapping[str, Any]) -> str:
    """The shell script of a ``sh -c`` container (command or args), else ""."""
    argv = [*(container.get("command") or ()), *(container.get("args") or ())]
    if len(argv) >= 3 and argv[0] in ("sh", "/bin/sh") and argv[1] == "-c":
        return str(argv[2])
    return ""


def file_wait(container: Mapping[str, Any]) -> frozenset[str] | None:
    """The files (any one will do) a ``wait_for_file``-style init container loops on:
    its whole script is ``until [ -f A ] || [ -f B ]; do ...; done``. Scripts that do
    more after the loop (the sandbox checks) are not played."""
    match = _WAIT_LOOP.fullmatch(_script(container).strip())
    if match is None:
        return None
    names = {_name_in_validations(p) for p in _TEST_FILE.findall(match.group(1))}
    if None in names or not names:
        return None
    return frozenset(n for n in names if n)


def driver_check(container: Mapping[str, Any]) -> bool | None:
    """For a container running our driver check (``node-agent validate --checks driver``):
    whether it needs the driver container (``--driver-container``); else None."""
    script = _script(container) or " ".join(
        [*(container.get("command") or ()), *(container.get("args") or ())]
    )
    if DRIVER_CHECK not in script:
        return None
    return DRIVER_CONTAINER_FLAG in script


def probe_file(container: Mapping[str, Any]) -> str | None:
    """The status file a readiness probe ``test -f <file>`` tests."""
    probe = (container.get("readinessProbe") or {}).get("exec") or {}
    command: list[Any] = list(probe.get("command") or ())
    if len(command) == 3 and command[0] == "test" and command[1] == "-f":
        return _name_in_validations(str(command[2]))
    return None


def needs(pod: Pod) -> list[frozenset[str]]:
    """What ``pod`` waits for before it is Ready: for each init container that waits
    on files (or runs the driver check) and each container whose readiness probe
    tests a file, the files of which one must exist."""
    spec = pod.get("spec", {})
    result: list[frozenset[str]] = []
    for container in spec.get("initContainers") or ():
        files = file_wait(container)
        if files is not None:
            result.append(files)
        elif driver_check(container):
            result.append(frozenset({DRIVER_CTR_READY}))
    for container in spec.get("containers") or ():
        name = probe_file(container)
        if name is not None:
            result.append(frozenset({name}))
    return result


def releasable(pod: Pod, files: Iterable[str]) -> bool:
    present = set(files)
    return all(need & present for need in needs(pod))


# ----------------------------------------------------------------- who writes what
def _validator_driver_container(pod: Pod) -> bool:
    """Whether the validator checks a driver container (its driver check has the flag)."""
    spec = pod.get("spec", {})
    for container in (*(spec.get("initContainers") or ()), *(spec.get("containers") or ())):
        argv = [*(container.get("command") or ()), *(container.get("args") or ())]
        text = " ".join(shlex.quote(str(a)) for a in argv)
        if DRIVER_CONTAINER_FLAG in text:
            return True
    return False


def _deleting(pod: Pod) -> bool:
    return bool(pod.get("metadata", {}).get("deletionTimestamp"))


def _ready(pod: Pod) -> bool:
    conditions = pod.get("status", {}).get("conditions") or ()
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _app(pod: Pod) -> str | None:
    return labels_of(pod).get("app")


def gpus_advertised(node: Mapping[str, Any]) -> bool:
    """The plugin check (``gpuop/nodeagent/plugin.py``): GPUs in allocatable."""
    allocatable = node.get("status", {}).get("allocatable") or {}
    for name, value in allocatable.items():
        if str(name).startswith(GPU_RESOURCES) and str(value) not in ("0", ""):
            return True
    return False


def on_stopping(files: Iterable[str], pod: Pod) -> set[str]:
    """What a pod's preStop hook removes once it is being deleted: a driver pod its
    ``.driver-ctr-ready`` (``components/driver.py``), the validator every ``*-ready``
    (``components/validator.py``: ``rm -f *-ready``, which spares dotfiles)."""
    result = set(files)
    if is_driver_pod(pod):
        result -= {DRIVER_CTR_READY, DRIVER_DAEMONS_STATUS}
    if _app(pod) == VALIDATOR_APP:
        result = {f for f in result if f.startswith(".") or not f.endswith("-ready")}
    return result


def advance(files: Iterable[str], pods: Iterable[Pod], gpus: bool) -> set[str]:
    """The node's files once every live writer on it has done what it can: ``pods``
    are the node's pods, ``gpus`` whether the node advertises GPUs."""
    result = set(files)
    live = [p for p in pods if not _deleting(p)]
    if any(is_driver_pod(p) and _ready(p) for p in live):
        result.add(DRIVER_CTR_READY)

    def driver_ok(needs_container: bool) -> bool:
        return not needs_container or DRIVER_CTR_READY in result

    for pod in live:
        for container in pod.get("spec", {}).get("initContainers") or ():
            check = driver_check(container)
            if check is not None and driver_ok(check):
                result.add(DRIVER_READY)
    toolkits = [p for p in live if _app(p) == TOOLKIT_APP]
    toolkit_ok = all(_ready(p) for p in toolkits)
    for validator in (p for p in live if _app(p) == VALIDATOR_APP):
        # its init containers: the driver check, then the toolkit check, once each
        if TOOLKIT_READY not in result:
            if not (driver_ok(_validator_driver_container(validator)) and toolkit_ok):
                continue
            result.add(TOOLKIT_READY)
        result.add(CUDA_READY)  # the CUDA workload: kwok completes it
        if gpus:
            result.add(PLUGIN_READY)
        else:
            result.discard(PLUGIN_READY)
    return result
