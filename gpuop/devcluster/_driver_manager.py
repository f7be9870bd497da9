"""What NVIDIA's driver manager (the ``k8s-driver-manager`` init container of every
driver pod) does through the API, as pure rules: from the container's env, the node's
labels and annotations and whether a driver is loaded (and with which digest), the
ordered steps it takes, with what it does when one fails. No I/O: the node-image
simulator (``node_images``) plays the steps against the local cluster.

Source: NVIDIA/k8s-driver-manager, ``cmd/driver-manager/main.go`` (cited per rule as
``main.go:<function>``), ``internal/kubernetes/client.go`` (``client.go:<function>``)
and the kubectl drain helper it vendors (``vendor/k8s.io/kubectl/pkg/drain/
filters.go`` and ``drain.go``). Read, not copied: each rule below is restated.

Not played (nothing of it reaches the API): the host-driver probe (``isHostDriver``:
simulated nodes have none), nouveau, unmounting the driver root, the PID file, vfio-pci
unbinding and the MOFED wait (simulated nodes have no Mellanox devices).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

PAUSED = "paused-for-driver-upgrade"
"""``main.go:pausedStr``: the value a paused deploy label carries (or ends with)."""
UPGRADE_ENABLED_ANNOTATION = "nvidia.com/gpu-driver-upgrade-enabled"
"""``main.go:fetchAutoUpgradeAnnotation``: "true" when the operator's upgrade
controller owns cordon and drain (the manager then leaves both alone)."""
DEFAULT_NAMESPACE = "gpu-operator"
WAIT_TIMEOUT_S = 300.0
"""``main.go:defaultGracePeriod``: how long each operand is given to go."""
GPU_RESOURCE_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-")
"""``client.go:podUsesGPU``: a request or limit named so makes a GPU pod."""
DRA_DRIVER = "gpu.nvidia.com"
"""``client.go:isAllocatedNvidiaGPUClaim``: claims allocated by this driver are GPUs."""
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"

_D = "nvidia.com/gpu.deploy."
VALIDATOR = _D + "operator-validator"
TOOLKIT = _D + "container-toolkit"
DEVICE_PLUGIN = _D + "device-plugin"
GFD = _D + "gpu-feature-discovery"
DCGM_EXPORTER = _D + "dcgm-exporter"
DCGM = _D + "dcgm"
MIG_MANAGER = _D + "mig-manager"
NVSM = _D + "nvsm"
SANDBOX_VALIDATOR = _D + "sandbox-validator"
SANDBOX_PLUGIN = _D + "sandbox-device-plugin"
VGPU_DEVICE_MANAGER = _D + "vgpu-device-manager"
GPU_CLIENT = _D + "client"
DRA_DRIVER_LABEL = _D + "dra-driver"
DRA_VALIDATOR = _D + "dra-validator"
DRA_DCGM = _D + "dcgm-dra"
DRA_DCGM_EXPORTER = _D + "dcgm-exporter-dra"

FETCHED = (
    VALIDATOR,
    TOOLKIT,
    DEVICE_PLUGIN,
    GFD,
    DCGM_EXPORTER,
    DCGM,
    MIG_MANAGER,
    NVSM,
    SANDBOX_VALIDATOR,
    SANDBOX_PLUGIN,
    VGPU_DEVICE_MANAGER,
    GPU_CLIENT,
    DRA_DRIVER_LABEL,
    DRA_VALIDATOR,
    DRA_DCGM,
    DRA_DCGM_EXPORTER,
)
"""``main.go:fetchCurrentLabels``: the deploy labels read once, at the start."""
_PAUSED_ALWAYS = (
    VALIDATOR,
    TOOLKIT,
    DEVICE_PLUGIN,
    GFD,
    DCGM_EXPORTER,
    DCGM,
    NVSM,
    SANDBOX_VALIDATOR,
    SANDBOX_PLUGIN,
    VGPU_DEVICE_MANAGER,
    DRA_VALIDATOR,
    DRA_DCGM,
    DRA_DCGM_EXPORTER,
)
"""``main.go:evictAllGPUOperatorComponents``: written whatever their value, absent ones
as "" (the patch is a plain map, so upstream gives the node empty-valued labels)."""
_RESCHEDULED_ALWAYS = (*_PAUSED_ALWAYS, DRA_DRIVER_LABEL)
"""``main.go:rescheduleGPUOperatorComponents``: the same set plus the DRA driver's
(paused on its own, by ``evictKubeletPlugin``)."""
_WAIT_ALWAYS = (
    "nvidia-operator-validator",
    "nvidia-container-toolkit-daemonset",
    "nvidia-device-plugin-daemonset",
    "gpu-feature-discovery",
    "nvidia-dcgm-exporter",
    "nvidia-dcgm",
    "nvidia-dcgm-exporter-dra",
    "nvidia-dcgm-dra",
)
"""``main.go:waitForPodsToTerminate``: these ``app`` labels are waited for in order."""
_WAIT_IF_SET = (
    (MIG_MANAGER, "nvidia-mig-manager"),
    (SANDBOX_VALIDATOR, "nvidia-sandbox-validator"),
    (SANDBOX_PLUGIN, "nvidia-sandbox-device-plugin-daemonset"),
    (VGPU_DEVICE_MANAGER, "nvidia-vgpu-device-manager"),
)
"""``main.go:waitForPodsToTerminate``: waited for only when the label had a value."""
KUBELET_PLUGIN_APP = "nvidia-dra-driver-kubelet-plugin"


# ----------------------------------------------------------------- label values
def maybe_set_paused(value: str) -> str:
    """``main.go:maybeSetPaused``: "" and "false" stay, "true" pauses, a value already
    paused stays, any other value gets ``_paused-for-driver-upgrade`` appended."""
    if value in ("", "false"):
        return value
    if value == "true":
        return PAUSED
    if PAUSED in value:
        return value
    return f"{value}_{PAUSED}"


_PAUSED_RE = re.compile(PAUSED + "_?")


def maybe_set_true(value: str) -> str:
    """``main.go:maybeSetTrue``: "false" stays, the bare paused value becomes "true",
    anything else loses every paused marker (and the underscores around it)."""
    if value == "false":
        return "false"
    if value == PAUSED:
        return "true"
    return _PAUSED_RE.sub("", value).strip("_")


# ----------------------------------------------------------------- configuration
class ConfigError(ValueError):
    """An env value the manager's CLI refuses: the container exits before any step."""


_BOOL_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_BOOL_FALSE = {"0", "f", "F", "FALSE", "false", "False"}


def parse_bool(name: str, value: str | None, default: bool) -> bool:
    """urfave/cli v2's BoolFlag from the environment (``strconv.ParseBool``): unset or
    empty keeps the default; anything but Go's boolean spellings is an error."""
    if not value:
        return default
    if value in _BOOL_TRUE:
        return True
    if value in _BOOL_FALSE:
        return False
    raise ConfigError(f"could not parse {value!r} as bool value from env {name}")


_DURATION_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "\u00b5s": 1e-6,
    "\u03bcs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")


def parse_duration(name: str, value: str | None, default: float = 0.0) -> float:
    """urfave/cli v2's DurationFlag from the environment (Go's ``time.ParseDuration``),
    in seconds: "0" or a signed sequence of number+unit ("300s", "1m30s"); a bare
    number such as "300" is an error, as upstream (the container then fails)."""
    if not value:
        return default
    text = value
    sign = 1.0
    if text[0] in "+-":
        sign = -1.0 if text[0] == "-" else 1.0
        text = text[1:]
    if text == "0":
        return 0.0
    total, pos = 0.0, 0
    while pos < len(text):
        match = _DURATION_PART.match(text, pos)
        if match is None:
            raise ConfigError(f"could not parse {value!r} as duration value from env {name}")
        total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        pos = match.end()
    if not text:
        raise ConfigError(f"could not parse {value!r} as duration value from env {name}")
    return sign * total


@dataclass(frozen=True)
class DrainOptions:
    """``client.go:DrainOptions``. ``timeout_s`` 0 means no limit (``drain.go``)."""

    force: bool = False
    delete_emptydir_data: bool = False
    timeout_s: float = 0.0
    pod_selector: str = ""


@dataclass(frozen=True)
class Config:
    """``main.go:main``'s flags, read from the environment, with upstream's defaults."""

    node_name: str
    operator_namespace: str = DEFAULT_NAMESPACE
    enable_auto_drain: bool = True
    enable_gpu_pod_eviction: bool = True
    drain: DrainOptions = field(default_factory=DrainOptions)
    node_label_for_gpu_pod_eviction: str = ""
    force_reinstall: bool = False
    digest: str = ""
    """DRIVER_CONFIG_DIGEST (read directly from the env in ``shouldUpdateDriverConfig``)."""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Config:
        """Raises :class:`ConfigError` where the CLI would refuse to start."""
        node = env.get("NODE_NAME", "")
        if not node:
            raise ConfigError('Required flag "node-name" not set')
        return cls(
            node_name=node,
            operator_namespace=env.get("OPERATOR_NAMESPACE") or DEFAULT_NAMESPACE,
            enable_auto_drain=parse_bool("ENABLE_AUTO_DRAIN", env.get("ENABLE_AUTO_DRAIN"), True),
            enable_gpu_pod_eviction=parse_bool(
                "ENABLE_GPU_POD_EVICTION", env.get("ENABLE_GPU_POD_EVICTION"), True
            ),
            drain=DrainOptions(
                force=parse_bool("DRAIN_USE_FORCE", env.get("DRAIN_USE_FORCE"), False),
                delete_emptydir_data=parse_bool(
                    "DRAIN_DELETE_EMPTYDIR_DATA", env.get("DRAIN_DELETE_EMPTYDIR_DATA"), False
                ),
                timeout_s=parse_duration("DRAIN_TIMEOUT_SECONDS", env.get("DRAIN_TIMEOUT_SECONDS")),
                pod_selector=env.get("DRAIN_POD_SELECTOR_LABEL", ""),
            ),
            node_label_for_gpu_pod_eviction=env.get("NODE_LABEL_FOR_GPU_POD_EVICTION", ""),
            force_reinstall=parse_bool("FORCE_REINSTALL", env.get("FORCE_REINSTALL"), False),
            digest=env.get("DRIVER_CONFIG_DIGEST", ""),
        )


_FIELD_PATHS: dict[str, Callable[[Mapping[str, Any]], Any]] = {
    "metadata.namespace": lambda p: p.get("metadata", {}).get("namespace"),
    "metadata.name": lambda p: p.get("metadata", {}).get("name"),
    "metadata.uid": lambda p: p.get("metadata", {}).get("uid"),
    "spec.nodeName": lambda p: p.get("spec", {}).get("nodeName"),
    "spec.serviceAccountName": lambda p: p.get("spec", {}).get("serviceAccountName"),
}


def container_env(pod: Mapping[str, Any], container: Mapping[str, Any]) -> dict[str, str]:
    """A container's environment as the kubelet gives it: literal values and the pod
    field references the driver manager uses (NODE_NAME, OPERATOR_NAMESPACE); a later
    entry of the same name wins. Other sources (ConfigMaps, Secrets) are left unset."""
    result: dict[str, str] = {}
    for var in container.get("env") or ():
        name = var.get("name")
        if not name:
            continue
        source = var.get("valueFrom")
        if source is None:
            result[name] = str(var.get("value") or "")
            continue
        path = (source.get("fieldRef") or {}).get("fieldPath")
        getter = _FIELD_PATHS.get(path or "")
        value = getter(pod) if getter else None
        if value is not None:
            result[name] = str(value)
    return result


MANAGER_CONTAINER = "k8s-driver-manager"


def manager_container(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The pod's ``k8s-driver-manager`` init container, if it has one."""
    for container in pod.get("spec", {}).get("initContainers") or ():
        if container.get("name") == MANAGER_CONTAINER:
            return dict(container)
    return None


def manager_env(pod: Mapping[str, Any]) -> dict[str, str] | None:
    container = manager_container(pod)
    return None if container is None else container_env(pod, container)


def pod_digest(pod: Mapping[str, Any]) -> str:
    """The DRIVER_CONFIG_DIGEST a driver pod installs with (what the driver container
    stores once loaded and the next manager compares with)."""
    return (manager_env(pod) or {}).get("DRIVER_CONFIG_DIGEST", "")


# ----------------------------------------------------------------- steps
StepKind = Literal[
    "pause-labels",
    "wait-pods-gone",
    "wait-gpu-clients-gone",
    "cordon",
    "evict-gpu-pods",
    "check-claim-holders",
    "drain",
    "unload",
    "uncordon",
    "reschedule-labels",
    "fail",
]


@dataclass(frozen=True)
class Step:
    """One thing the manager does. When it fails: a ``best_effort`` step is only
    logged; otherwise ``on_failure`` is played instead (a fallback that, if it
    succeeds, lets the rest go on; ``cleanup`` ends in ``fail``); with no
    ``on_failure`` the attempt fails at once, as a bare ``return err`` upstream."""

    kind: StepKind
    labels: Mapping[str, str] = field(default_factory=dict)
    app: str = ""
    namespace: str = ""
    timeout_s: float = 0.0
    drain: DrainOptions | None = None
    node_selector_key: str = ""
    reason: str = ""
    best_effort: bool = False
    on_failure: tuple[Step, ...] = ()
    source: str = ""
    """The upstream function this step plays."""

    def fields(self) -> dict[str, str]:
        """What the simulator's log says of this step (key=value)."""
        result: dict[str, str] = {"step": self.kind}
        if self.labels:
            result["labels"] = ",".join(f"{k}={v}" for k, v in self.labels.items())
        if self.app:
            result["app"] = self.app
        if self.node_selector_key:
            result["node_selector_key"] = self.node_selector_key
        if self.reason:
            result["reason"] = self.reason
        if self.source:
            result["source"] = self.source
        return result


@dataclass(frozen=True)
class NodeView:
    """What the manager reads of its node (``fetchCurrentLabels``,
    ``fetchAutoUpgradeAnnotation``)."""

    labels: Mapping[str, str]
    annotations: Mapping[str, str]

    @classmethod
    def of(cls, node: Mapping[str, Any]) -> NodeView:
        meta = node.get("metadata", {})
        return cls(dict(meta.get("labels") or {}), dict(meta.get("annotations") or {}))


@dataclass(frozen=True)
class DriverState:
    """The node's kernel, as far as the manager looks: ``/sys/module/nvidia/refcnt``
    (``main.go:isDriverLoaded``) and the digest in the state file
    (``main.go:readStoredDigest``; None when there is none)."""

    loaded: bool = False
    stored_digest: str | None = None


def _fetched(node: NodeView, cfg: Config) -> dict[str, str]:
    values = {label: node.labels.get(label, "") for label in FETCHED}
    custom = cfg.node_label_for_gpu_pod_eviction
    if custom:
        values[custom] = node.labels.get(custom, "")
    return values


def _label_patch(
    node: NodeView, cfg: Config, always: tuple[str, ...], rule: Callable[[str], str]
) -> dict[str, str]:
    """Both label patches: ``rule`` on every label of ``always`` (absent ones as ""),
    and on the MIG manager's, the custom operand label and the GPU clients' only where
    the node had a value."""
    values = _fetched(node, cfg)
    patch = {label: rule(values[label]) for label in always}
    for label in (MIG_MANAGER, cfg.node_label_for_gpu_pod_eviction, GPU_CLIENT):
        if label and values.get(label):
            patch[label] = rule(values[label])
    return patch


def pause_labels(node: NodeView, cfg: Config) -> dict[str, str]:
    """``main.go:evictAllGPUOperatorComponents``'s label patch."""
    return _label_patch(node, cfg, _PAUSED_ALWAYS, maybe_set_paused)


def reschedule_labels(node: NodeView, cfg: Config) -> dict[str, str]:
    """``main.go:rescheduleGPUOperatorComponents``'s label patch: from the values read
    at the start, not the paused ones written since."""
    return _label_patch(node, cfg, _RESCHEDULED_ALWAYS, maybe_set_true)


def upgrade_policy_enabled(node: NodeView) -> bool:
    """``main.go:isDriverAutoUpgradePolicyEnabled``: exactly "true"."""
    return node.annotations.get(UPGRADE_ENABLED_ANNOTATION) == "true"


def gpu_pod_eviction_enabled(node: NodeView, cfg: Config) -> bool:
    """``main.go:isGPUPodEvictionEnabled``: never while the upgrade policy owns it."""
    return not upgrade_policy_enabled(node) and cfg.enable_gpu_pod_eviction


def auto_drain_enabled(node: NodeView, cfg: Config) -> bool:
    """``main.go:isAutoDrainEnabled``: never while the upgrade policy owns it."""
    return not upgrade_policy_enabled(node) and cfg.enable_auto_drain


def should_skip_uninstall(cfg: Config, driver: DriverState) -> bool:
    """``main.go:shouldSkipUninstall`` / ``shouldUpdateDriverConfig``: a loaded driver
    whose stored digest equals DRIVER_CONFIG_DIGEST stays, unless FORCE_REINSTALL; an
    empty digest or none stored counts as changed."""
    if cfg.force_reinstall or not driver.loaded or not cfg.digest:
        return False
    return driver.stored_digest is not None and driver.stored_digest == cfg.digest


def cleanup(node: NodeView, cfg: Config, reason: str) -> tuple[Step, ...]:
    """``main.go:cleanupOnFailure``, then the error: uncordon only when the manager
    could evict (no upgrade policy, and eviction or auto drain on), always reschedule;
    neither failing stops it."""
    can_evict = not upgrade_policy_enabled(node) and (
        cfg.enable_gpu_pod_eviction or cfg.enable_auto_drain
    )
    steps: list[Step] = []
    if can_evict:
        steps.append(Step("uncordon", best_effort=True, source="main.go:cleanupOnFailure"))
    steps.append(
        Step(
            "reschedule-labels",
            labels=reschedule_labels(node, cfg),
            best_effort=True,
            source="main.go:cleanupOnFailure",
        )
    )
    steps.append(Step("fail", reason=reason, source="main.go:uninstallDriver"))
    return tuple(steps)


def _evict_all(node: NodeView, cfg: Config) -> list[Step]:
    """``main.go:evictAllGPUOperatorComponents`` (label patch, then
    ``waitForPodsToTerminate``); any failure cleans up."""
    on_failure = cleanup(node, cfg, "failed to evict GPU operator components")
    values = _fetched(node, cfg)
    src = "main.go:evictAllGPUOperatorComponents"
    steps = [
        Step("pause-labels", labels=pause_labels(node, cfg), on_failure=on_failure, source=src)
    ]
    apps = list(_WAIT_ALWAYS) + [app for label, app in _WAIT_IF_SET if values.get(label)]
    src = "main.go:waitForPodsToTerminate"
    ns = cfg.operator_namespace
    for app in apps:
        steps.append(
            Step(
                "wait-pods-gone",
                app=app,
                namespace=ns,
                timeout_s=WAIT_TIMEOUT_S,
                on_failure=on_failure,
                source=src,
            )
        )
    if values.get(GPU_CLIENT):
        steps.append(
            Step(
                "wait-gpu-clients-gone",
                node_selector_key=GPU_CLIENT,
                timeout_s=WAIT_TIMEOUT_S,
                on_failure=on_failure,
                source="client.go:WaitForPodsWithNodeSelector",
            )
        )
    return steps


def _kubelet_plugin(node: NodeView, cfg: Config, on_failure: tuple[Step, ...]) -> list[Step]:
    """``main.go:evictKubeletPlugin``: only with the DRA driver's label set."""
    value = _fetched(node, cfg)[DRA_DRIVER_LABEL]
    if not value:
        return []
    src = "main.go:evictKubeletPlugin"
    return [
        Step(
            "pause-labels",
            labels={DRA_DRIVER_LABEL: maybe_set_paused(value)},
            on_failure=on_failure,
            source=src,
        ),
        Step(
            "wait-pods-gone",
            app=KUBELET_PLUGIN_APP,
            namespace=cfg.operator_namespace,
            timeout_s=WAIT_TIMEOUT_S,
            on_failure=on_failure,
            source=src,
        ),
    ]


def plan(env: Mapping[str, str], node: NodeView, driver: DriverState) -> tuple[Step, ...]:
    """``main.go:uninstallDriver``: the steps of one run of the init container."""
    try:
        cfg = Config.from_env(env)
    except ConfigError as err:
        return (Step("fail", reason=str(err), source="main.go:main"),)
    eviction = gpu_pod_eviction_enabled(node, cfg)
    auto_drain = auto_drain_enabled(node, cfg)
    src = "main.go:uninstallDriver"
    reschedule = Step(
        "reschedule-labels",
        labels=reschedule_labels(node, cfg),
        source="main.go:rescheduleGPUOperatorComponents",
    )
    uncordon = Step("uncordon", best_effort=True, source=src)
    dra = bool(_fetched(node, cfg)[DRA_DRIVER_LABEL])
    if not driver.loaded:
        # Nothing holds a driver: no eviction; errors of the kubelet plugin's drain
        # return at once (no cleanup).
        steps = _kubelet_plugin(node, cfg, ())
        if eviction or auto_drain:
            steps.append(uncordon)
        return (*steps, reschedule)
    steps = _evict_all(node, cfg)
    if should_skip_uninstall(cfg, driver):
        steps += _kubelet_plugin(
            node, cfg, cleanup(node, cfg, "failed to evict DRA kubelet-plugin")
        )
        return (*steps, reschedule)
    opts = cfg.drain
    drain_failed = cleanup(node, cfg, "failed to drain node")
    drain = Step("drain", drain=opts, on_failure=drain_failed, source="client.go:DrainNode")
    if eviction or (dra and auto_drain):
        steps.append(Step("cordon", source=src))
        not_drained = cleanup(node, cfg, "cannot proceed until all GPU pods are drained")
        steps.append(
            Step(
                "evict-gpu-pods",
                drain=opts,
                on_failure=(drain,) if auto_drain else not_drained,
                source="main.go:nvDrainNode",
            )
        )
    if dra:
        steps.append(
            Step(
                "check-claim-holders",
                on_failure=cleanup(node, cfg, "pods still hold GPU resource claims"),
                source=src,
            )
        )
    steps += _kubelet_plugin(node, cfg, cleanup(node, cfg, "failed to evict DRA kubelet-plugin"))
    unload_failed = cleanup(node, cfg, "failed to uninstall nvidia driver components")
    retry = (drain, Step("unload", on_failure=unload_failed, source="main.go:cleanupDriver"))
    steps.append(
        Step(
            "unload",
            on_failure=retry if auto_drain else unload_failed,
            source="main.go:cleanupDriver",
        )
    )
    if eviction or auto_drain:
        steps.append(uncordon)
    return (*steps, reschedule)


@dataclass(frozen=True)
class Outcome:
    ok: bool
    reason: str = ""


async def play(steps: Sequence[Step], act: Callable[[Step], Awaitable[bool]]) -> Outcome:
    """Walk ``steps``: ``act`` does one (True when it worked); failures follow each
    step's ``best_effort`` / ``on_failure`` rules (see :class:`Step`)."""
    for step in steps:
        if step.kind == "fail":
            return Outcome(False, step.reason)
        if await act(step) or step.best_effort:
            continue
        if not step.on_failure:
            return Outcome(False, f"{step.kind} failed")
        fallback = await play(step.on_failure, act)
        if not fallback.ok:
            return fallback
    return Outcome(True)


# ----------------------------------------------------------------- drain rules
DeleteVerdict = Literal["delete", "skip", "error"]


def _finished(pod: Mapping[str, Any]) -> bool:
    return pod.get("status", {}).get("phase") in ("Succeeded", "Failed")


def controller_of(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for ref in pod.get("metadata", {}).get("ownerReferences") or ():
        if ref.get("controller"):
            return dict(ref)
    return None


def daemonset_owner(pod: Mapping[str, Any]) -> str | None:
    """The name of the DaemonSet controlling ``pod`` (``filters.go:
    isControllerRefDaemonSet``: kind DaemonSet of apps/v1)."""
    ref = controller_of(pod)
    if ref and ref.get("kind") == "DaemonSet" and ref.get("apiVersion") == "apps/v1":
        return str(ref.get("name", ""))
    return None


def delete_verdict(
    pod: Mapping[str, Any],
    opts: DrainOptions,
    *,
    ignore_daemonsets: bool,
    daemonset_exists: bool = True,
) -> tuple[DeleteVerdict, str]:
    """kubectl drain's filters in their order (``filters.go:makeFilters``), the first
    that does not say delete wins: DaemonSet pods are never deleted (an error unless
    ignored; an orphan goes with force), mirror pods are skipped, pods with emptyDir
    need delete-emptydir-data, pods no controller manages need force; finished pods
    always go. ``daemonset_exists`` is whether the owning DaemonSet is still there."""
    finished = _finished(pod)
    ds = daemonset_owner(pod)
    if ds is not None and not finished:
        if not daemonset_exists:
            if opts.force:
                return "delete", "orphaned DaemonSet pod"
            return "error", f"daemonset {ds} not found"
        if not ignore_daemonsets:
            return "error", "cannot delete DaemonSet-managed Pods"
        return "skip", "ignoring DaemonSet-managed Pods"
    if MIRROR_ANNOTATION in (pod.get("metadata", {}).get("annotations") or {}):
        return "skip", "mirror pod"
    volumes = pod.get("spec", {}).get("volumes") or ()
    local = any(v.get("emptyDir") is not None for v in volumes)
    if local and not finished and not opts.delete_emptydir_data:
        return "error", "cannot delete Pods with local storage"
    if not finished and controller_of(pod) is None and not opts.force:
        return "error", "cannot delete Pods that declare no controller"
    return "delete", ""


def claim_names(pod: Mapping[str, Any]) -> list[str]:
    """``client.go:resolveResourceClaimName`` for each of the pod's claims."""
    statuses = {
        s.get("name"): s.get("resourceClaimName")
        for s in pod.get("status", {}).get("resourceClaimStatuses") or ()
    }
    names: list[str] = []
    for ref in pod.get("spec", {}).get("resourceClaims") or ():
        name = ref.get("resourceClaimName") or statuses.get(ref.get("name"))
        if name:
            names.append(str(name))
    return names


def claim_is_gpu(claim: Mapping[str, Any]) -> bool:
    """``client.go:isAllocatedNvidiaGPUClaim``."""
    allocation = claim.get("status", {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or ()
    return any(r.get("driver") == DRA_DRIVER for r in results)


def requests_gpu(pod: Mapping[str, Any]) -> bool:
    """``client.go:podUsesGPU``'s resource half: a regular container asking for
    ``nvidia.com/gpu*`` or ``nvidia.com/mig-*`` (requests or limits)."""
    for container in pod.get("spec", {}).get("containers") or ():
        resources = container.get("resources") or {}
        for section in ("limits", "requests"):
            for name in resources.get(section) or {}:
                if str(name).startswith(GPU_RESOURCE_PREFIXES):
                    return True
    return False


def uses_gpu(pod: Mapping[str, Any], gpu_claims: Iterable[str] = ()) -> bool:
    """``client.go:podUsesGPU``: a GPU request, or a claim of the pod's namespace
    among ``gpu_claims`` (those allocated by the NVIDIA GPU DRA driver)."""
    if requests_gpu(pod):
        return True
    held = set(gpu_claims)
    return any(name in held for name in claim_names(pod))
