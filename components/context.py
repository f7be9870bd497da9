"""What rendering needs beyond the policy: facts about the operator and the cluster."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

Manifest = dict[str, Any]
"""A Kubernetes object as plain JSON-able data."""


@dataclass(frozen=True)
class RenderContext:
    """Inputs that are not in the ClusterPolicy.

    `extra_labels` (e.g. the chart's labels) go on object metadata only, never into pod
    templates, so changing them never restarts operand pods.
    """

    namespace: str
    """Namespace of every namespaced operand object."""
    operator_image: str
    """Our own image: the validator, node status exporter and wait-for init containers."""
    mig_capable: bool = False
    """Some node is labelled `nvidia.com/mig.capable=true` (the MIG manager is wanted)."""
    extra_labels: Mapping[str, str] = field(default_factory=dict)
    """Labels added to every object's metadata."""
    service_monitor_crd: bool = True
    """The `monitoring.coreos.com` ServiceMonitor CRD exists (else none is rendered)."""
    operator_image_pull_policy: str = "IfNotPresent"
    """Pull policy for containers running the operator image."""
    operator_image_pull_secrets: tuple[str, ...] = ()
    """Pull secrets for the operator image, added to pods that run it."""
