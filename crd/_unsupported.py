"""Fields a ClusterPolicy (or an NVIDIADriver, a GPUCluster) may set that this operator
accepts but does not act on.

The CRD takes every field upstream's does, so policies migrate unchanged; a field that
then has no effect must be *said* to have none (a Warning condition and Event name it),
never dropped in silence. Each entry below is one such field, the test of whether a spec
actually asks for it (set to a value that would change something upstream), and why it
is inert here. Implementing a field means deleting its entry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from pydantic import BaseModel

from crd._common import PULL_POLICIES, RUNTIMES
from crd._components import ComponentSpec, ImageSpec
from crd._gpucluster import GPUClusterSpec
from crd._nvidiadriver import NVIDIADriverSpec
from crd._policy import ClusterPolicySpec


@dataclass(frozen=True)
class UnsupportedField:
    """A set field the operator ignores, with why."""

    path: str
    """Wire path, e.g. `spec.sandboxWorkloads.enabled`."""
    reason: str
    """What is not done, for the admin reading the Event."""

    def __str__(self) -> str:
        return f"{self.path} ({self.reason})"


_Check = Callable[[ClusterPolicySpec], bool]

_FIELDS: tuple[tuple[str, _Check, str], ...] = (
    ("kataManager.enabled", lambda s: s.kata_manager.enabled, "deprecated; upstream ignores it"),
    ("psp.enabled", lambda s: s.psp is not None and s.psp.enabled, "PodSecurityPolicy is gone"),
    ("cdi.default", lambda s: s.cdi.default, "no effect (upstream v26.7 ignores it too)"),
    (
        "operator.use_ocp_driver_toolkit",
        lambda s: s.operator.use_ocp_driver_toolkit,
        "OpenShift Driver Toolkit builds are not implemented",
    ),
)


def _host_network(spec: ClusterPolicySpec) -> Iterator[UnsupportedField]:
    """A set `hostNetwork` on a section whose model says its operand does not honour it
    (`ComponentSpec.honours_host_network`: the driver sidecars' and the Kata manager's;
    the MPS control daemon follows `devicePlugin`'s, the sandbox validator `validator`'s,
    as upstream's transforms do)."""
    for name, info in type(spec).model_fields.items():
        section = getattr(spec, name)
        if (
            isinstance(section, ComponentSpec)
            and section.host_network
            and not section.honours_host_network
        ):
            reason = "no effect (upstream v26.7 ignores it too)"
            yield UnsupportedField(f"spec.{info.alias or name}.hostNetwork", reason)


def _image_specs(model: BaseModel, path: str) -> Iterator[tuple[str, ImageSpec]]:
    if isinstance(model, ImageSpec):
        yield path, model
    for name, info in type(model).model_fields.items():
        child = getattr(model, name)
        if isinstance(child, BaseModel):
            yield from _image_specs(child, f"{path}.{info.alias or name}")


def _unknown_values(spec: ClusterPolicySpec) -> Iterator[UnsupportedField]:
    for path, section in _image_specs(spec, "spec"):
        if section.pull_policy_as_written not in PULL_POLICIES:
            yield UnsupportedField(f"{path}.imagePullPolicy", "unknown policy: IfNotPresent used")
    if spec.operator.runtime_as_written not in RUNTIMES:
        yield UnsupportedField("spec.operator.defaultRuntime", "unknown runtime: docker assumed")


def unsupported_fields(spec: ClusterPolicySpec) -> list[UnsupportedField]:
    """The fields of `spec` that ask for something this operator does not do, in a
    stable order; empty when the operator honours the whole spec."""
    found = [
        UnsupportedField(f"spec.{path}", reason) for path, check, reason in _FIELDS if check(spec)
    ]
    found.extend(_host_network(spec))
    found.extend(_unknown_values(spec))
    return found


def nvidiadriver_unsupported_fields(spec: NVIDIADriverSpec) -> list[UnsupportedField]:
    """The fields of an NVIDIADriver's `spec` that ask for something this operator does
    not do, in a stable order. Every other field reaches the driver DaemonSets through
    `components.nvidiadriver.policy_for` and `render_pool` (the manager's, GDS's and
    GDRCopy's `imagePullSecrets` too: `components.driver.driver_pull_secrets`), or the
    upgrade policy; `driverType: vgpu-host-manager` renders the vGPU manager's pod as
    upstream's NVIDIADriver template does (`components.nvidiadriver`)."""
    found = []
    for path, section in _image_specs(spec, "spec"):
        if section.pull_policy_as_written not in PULL_POLICIES:
            found.append(
                UnsupportedField(f"{path}.imagePullPolicy", "unknown policy: IfNotPresent used")
            )
    return found


_DRA_STRATEGY = (
    "no effect: upstream's DRA DaemonSets keep their own update strategy (RollingUpdate;"
    " the kubelet plugin and the validator at maxUnavailable 100%, the others 1);"
    " upstream v26.7 ignores it too"
)


def gpucluster_unsupported_fields(spec: GPUClusterSpec) -> list[UnsupportedField]:
    """The fields of a GPUCluster's `spec` that ask for something this operator does not
    do, in a stable order: the `daemonsets` settings upstream's DRA manifests never read,
    where they ask for something other than what those manifests do (upstream's sample
    writes `updateStrategy: RollingUpdate` and `maxUnavailable: '1'`: not named). Every
    other field reaches the DRA stack's objects through `components.dra.render` (the
    sweep in tests/unit/test_crd_sweep.py holds every field of upstream's schema to
    that). An unknown `imagePullPolicy` is not named: it is rendered as written, as
    upstream's manifests do, and the API server refuses the DaemonSet (the status says
    so)."""
    found = []
    ds = spec.daemonsets
    if ds.update_strategy != "RollingUpdate":
        found.append(UnsupportedField("spec.daemonsets.updateStrategy", _DRA_STRATEGY))
    if ds.rolling_update and ds.rolling_update.max_unavailable not in (None, 1, "1"):
        path = "spec.daemonsets.rollingUpdate.maxUnavailable"
        found.append(UnsupportedField(path, _DRA_STRATEGY))
    if ds.pod_security_context and ds.pod_security_context.model_dump(exclude_none=True):
        found.append(
            UnsupportedField(
                "spec.daemonsets.podSecurityContext",
                "no effect on the DRA stack's pods (upstream v26.7 ignores it too)",
            )
        )
    return found
