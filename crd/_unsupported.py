"""Fields a ClusterPolicy may set that this operator accepts but does not act on.

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
from crd._policy import ClusterPolicySpec

_DEFAULT_KUBELET_ROOT = "/var/lib/kubelet"


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
    (
        "sandboxWorkloads.enabled",
        lambda s: s.sandbox_workloads.enabled,
        "VM workloads are not implemented: no vGPU, VFIO, sandbox or Kata operands are"
        " deployed and nvidia.com/gpu.workload.config labels are not honoured",
    ),
    ("kataManager.enabled", lambda s: s.kata_manager.enabled, "deprecated; upstream ignores it"),
    ("psp.enabled", lambda s: s.psp is not None and s.psp.enabled, "PodSecurityPolicy is gone"),
    ("psa.enabled", lambda s: s.psa.enabled, "the namespace gets no Pod Security labels"),
    ("cdi.default", lambda s: s.cdi.default, "no effect (upstream v26.7 ignores it too)"),
    ("cdi.nriPluginEnabled", lambda s: s.cdi.nri_plugin_enabled, "no NRI plugin is deployed"),
    (
        "hostPaths.kubeletRootDir",
        lambda s: s.host_paths.kubelet_root_dir != _DEFAULT_KUBELET_ROOT,
        f"operands mount the kubelet's sockets from {_DEFAULT_KUBELET_ROOT}",
    ),
    (
        "operator.use_ocp_driver_toolkit",
        lambda s: s.operator.use_ocp_driver_toolkit,
        "OpenShift Driver Toolkit builds are not implemented",
    ),
    ("operator.labels", lambda s: bool(s.operator.labels), "not applied"),
    ("operator.annotations", lambda s: bool(s.operator.annotations), "not applied"),
    (
        "daemonsets.podSecurityContext",
        lambda s: bool(
            s.daemonsets.pod_security_context
            and s.daemonsets.pod_security_context.model_dump(exclude_none=True)
        ),
        "operand pods keep their own security context",
    ),
    (
        "driver.usePrecompiled",
        lambda s: s.driver.use_precompiled,
        "precompiled driver DaemonSets are rendered per kernel, but driver upgrades are"
        " managed only for nvidia-driver-daemonset",
    ),
    (
        "driver.repoConfig.configMapName",
        lambda s: bool(s.driver.repo_config and s.driver.repo_config.config_map_name),
        "custom package repositories are not mounted",
    ),
    (
        "driver.certConfig.name",
        lambda s: bool(s.driver.cert_config and s.driver.cert_config.name),
        "custom certificates are not mounted",
    ),
    (
        "driver.licensingConfig",
        lambda s: bool(
            s.driver.licensing_config
            and (s.driver.licensing_config.config_map_name or s.driver.licensing_config.secret_name)
        ),
        "vGPU guest licensing is not mounted",
    ),
    (
        "driver.virtualTopology.config",
        lambda s: bool(s.driver.virtual_topology and s.driver.virtual_topology.config),
        "the topology file is not mounted",
    ),
    (
        "driver.kernelModuleConfig.name",
        lambda s: bool(s.driver.kernel_module_config and s.driver.kernel_module_config.name),
        "module parameters are not mounted",
    ),
    ("driver.secretEnv", lambda s: bool(s.driver.secret_env), "not passed to the driver"),
    ("dcgmExporter.hostPID", lambda s: bool(s.dcgm_exporter.host_pid), "not applied"),
    ("dcgmExporter.annotations", lambda s: bool(s.dcgm_exporter.annotations), "not applied"),
    (
        "dcgmExporter.enablePodLabels",
        lambda s: bool(s.dcgm_exporter.enable_pod_labels),
        "metrics carry no pod labels",
    ),
    (
        "dcgmExporter.enablePodUID",
        lambda s: bool(s.dcgm_exporter.enable_pod_uid),
        "metrics carry no pod UID",
    ),
    (
        "dcgmExporter.podLabelAllowlistRegex",
        lambda s: bool(s.dcgm_exporter.pod_label_allowlist_regex),
        "metrics carry no pod labels",
    ),
    (
        "dcgmExporter.hpcJobMapping.enabled",
        lambda s: bool(s.dcgm_exporter.hpc_job_mapping and s.dcgm_exporter.hpc_job_mapping.enabled),
        "HPC job mapping is not configured",
    ),
)


def _host_network(spec: ClusterPolicySpec) -> Iterator[UnsupportedField]:
    for name, info in type(spec).model_fields.items():
        section = getattr(spec, name)
        if isinstance(section, ComponentSpec) and section.host_network:
            yield UnsupportedField(
                f"spec.{info.alias or name}.hostNetwork", "pods stay in the pod network"
            )


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
    if spec.dcgm.host_port != spec.dcgm.host_port_as_written:
        yield UnsupportedField("spec.dcgm.hostPort", "not a port: 5555 used")
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
