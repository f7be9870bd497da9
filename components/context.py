"""What rendering needs beyond the policy: facts about the operator and the cluster."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

Manifest = dict[str, Any]
"""A Kubernetes object as plain JSON-able data."""

OS_ID_LABEL = "feature.node.kubernetes.io/system-os_release.ID"
OS_VERSION_LABEL = "feature.node.kubernetes.io/system-os_release.VERSION_ID"
KERNEL_LABEL = "feature.node.kubernetes.io/kernel-version.full"
"""NFD's labels for a node's OS and kernel: upstream's source for driver image tags."""

CONTAINERD, DOCKER, CRIO = "containerd", "docker", "crio"
_RUNTIME_PREFIXES = (("docker", DOCKER), ("containerd", CONTAINERD), ("cri-o", CRIO))
_MAJOR_ONLY_OS = frozenset({"rhel", "rocky", "ol"})
"""Distributions whose driver images are tagged by major version only (`rhel9`)."""


@dataclass(frozen=True)
class NodeFacts:
    """What one GPU node tells rendering: its OS, kernel and container runtime."""

    os_id: str | None = None
    os_version: str | None = None
    kernel: str | None = None
    runtime: str | None = None
    """`containerd`, `docker` or `crio`, from `status.nodeInfo.containerRuntimeVersion`."""

    @property
    def os_tag(self) -> str | None:
        """The driver image's OS suffix, e.g. `ubuntu22.04` or `rhel9`."""
        if not self.os_id or not self.os_version:
            return None
        version = self.os_version
        if self.os_id in _MAJOR_ONLY_OS:
            version = version.split(".")[0]
        return f"{self.os_id}{version}"


def runtime_name(runtime_version: str | None) -> str | None:
    """`containerd://1.7.22` -> `containerd`; None for a runtime we do not know."""
    for prefix, name in _RUNTIME_PREFIXES:
        if runtime_version and runtime_version.startswith(prefix):
            return name
    return None


def node_facts(node: Mapping[str, Any]) -> NodeFacts:
    """The facts of one Node object (full or as the controller's cache trims it)."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    info = (node.get("status") or {}).get("nodeInfo") or {}
    return _facts(
        labels.get(OS_ID_LABEL),
        labels.get(OS_VERSION_LABEL),
        labels.get(KERNEL_LABEL),
        runtime_name(info.get("containerRuntimeVersion")),
    )


@lru_cache(maxsize=1024)
def _facts(
    os_id: str | None, os_version: str | None, kernel: str | None, runtime: str | None
) -> NodeFacts:
    """One instance per distinct set of facts: a fleet has a handful (one per OS image
    and runtime), and the controller keeps each GPU node's."""
    return NodeFacts(os_id=os_id, os_version=os_version, kernel=kernel, runtime=runtime)


@dataclass(frozen=True)
class RenderContext:
    """Inputs that are not in the ClusterPolicy.

    `extra_labels` (e.g. the chart's labels) go on object metadata only, never into pod
    templates, so changing them never restarts operand pods.
    """

    namespace: str
    """Namespace of every namespaced operand object."""
    operator_image: str
    """Our own image: the validator, node status exporter and wait-for init containers.
    How it is pulled: `components._k8s.operator_image_pulls`."""
    mig_capable: bool = False
    """Some node is labelled `nvidia.com/mig.capable=true` (the MIG manager is wanted)."""
    extra_labels: Mapping[str, str] = field(default_factory=dict)
    """Labels added to every object's metadata."""
    service_monitor_crd: bool = True
    """The `monitoring.coreos.com` ServiceMonitor CRD exists (else none is rendered)."""
    prometheus_rule_crd: bool = True
    """The `monitoring.coreos.com` PrometheusRule CRD exists (else no alert rules)."""
    operator_image_pull_policy: str | None = None
    """The operator's own `imagePullPolicy` (the chart's `operator.imagePullPolicy`; the
    ClusterPolicy has no such field): every container running the operator image gets
    it, or the replaced section's where that is more eager; None: the section's alone."""
    operator_image_pull_secrets: tuple[str, ...] = ()
    """The operator's own pull secrets (the chart's `operator.imagePullSecrets`), added
    after the policy's to every pod that runs the operator image."""
    gpu_nodes: tuple[NodeFacts, ...] = ()
    """Facts of every GPU node, in the controller's (name) order."""
    config_map_keys: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """The data keys of the ConfigMaps the policy names for the driver's site
    configuration (`components.driver_config.referenced_config_maps`), by name; a name
    that is absent is a ConfigMap that does not exist."""

    @property
    def container_runtime(self) -> str:
        """The runtime the toolkit configures, as upstream picks it: containerd when any
        GPU node runs it, else the last GPU node's known runtime, else containerd."""
        known = [n.runtime for n in self.gpu_nodes if n.runtime]
        if not known or CONTAINERD in known:
            return CONTAINERD
        return known[-1]

    @property
    def os_tag(self) -> str | None:
        """The GPU nodes' OS tag for the driver image: the most common one (ties go to
        the first node's). Upstream reads only the first GPU node's labels."""
        tags = [n.os_tag for n in self.gpu_nodes if n.os_tag]
        if not tags:
            return None
        counts = Counter(tags)
        best = max(counts.values())
        return next(t for t in tags if counts[t] == best)

    @property
    def os_id(self) -> str | None:
        """The OS (NFD's `os_release.ID`) of the nodes whose tag is :attr:`os_tag`: where
        the driver's repository and certificate files go."""
        tag = self.os_tag
        return next((n.os_id for n in self.gpu_nodes if tag and n.os_tag == tag), None)

    @property
    def kernels(self) -> dict[str, str]:
        """Kernel version -> OS tag of the GPU nodes (precompiled drivers: one DaemonSet
        per kernel)."""
        return {n.kernel: n.os_tag or "" for n in self.gpu_nodes if n.kernel}
