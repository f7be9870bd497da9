"""YAML renderings checked into the repository: the CRD and the default sample policy.

Both come from pure functions so a test can prove the checked-in files are current.
"""

from __future__ import annotations

from typing import Any

import yaml

from crd._policy import API_VERSION, DEFAULT_POLICY_NAME, KIND, ClusterPolicy, ClusterPolicySpec
from crd._schema import crd_manifest

CRD_FILE = "crd/nvidia.com_clusterpolicies.yaml"
CHART_CRD_FILE = "deploy/crds/nvidia.com_clusterpolicies.yaml"
SAMPLE_POLICY_FILE = "deploy/clusterpolicy.yaml"

_CRD_HEADER = (
    "# Generated from the models in crd/ -- do not edit.\n"
    "# Regenerate: gpuop crd > crd/nvidia.com_clusterpolicies.yaml"
    " (and copy it to deploy/crds/)\n"
)
_SAMPLE_HEADER = (
    "# The ClusterPolicy the chart's defaults produce: every field at its default, but for\n"
    "# the values upstream's chart writes over its CRD defaults (crd.CHART_CHOICES).\n"
    "# Operand images are left out on purpose: unset parts fall back to the operator's\n"
    "# built-in images, so upgrading the operator upgrades operands you did not pin.\n"
    "# Generated from the models in crd/ (crd.render_sample_policy_yaml) -- do not edit.\n"
)


def _dump(document: Any) -> str:
    return yaml.safe_dump(document, sort_keys=False, default_flow_style=False)


def render_crd_yaml() -> str:
    """The ClusterPolicy CRD as YAML, byte-for-byte deterministic."""
    return _CRD_HEADER + _dump(crd_manifest())


CHART_CHOICES: dict[str, Any] = {
    "driver": {
        "startupProbe": {
            "initialDelaySeconds": 60,
            "periodSeconds": 10,
            "timeoutSeconds": 60,
            "failureThreshold": 120,
        },
        "upgradePolicy": {"autoUpgrade": True},
    },
    "dcgmExporter": {
        "service": {"internalTrafficPolicy": "Cluster"},
        "serviceMonitor": {"enabled": True, "interval": "15s", "scrapeTimeout": "10s"},
    },
    "vgpuDeviceManager": {"enabled": True},
    "vfioManager": {"enabled": True},
    "sandboxDevicePlugin": {"enabled": True},
    "kataSandboxDevicePlugin": {"enabled": True},
    "ccManager": {"enabled": True, "defaultMode": "on"},
}
"""Where upstream v26.7's chart-default policy differs from its CRD's (and our models')
defaults, apart from images: driver auto-upgrade is on, the driver has a startup probe,
the exporter gets a ServiceMonitor (created only where its CRD is served), and the sandbox
operands are switched on (inert while sandboxWorkloads is off)."""


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    result = dict(base)
    for key, value in over.items():
        old = result.get(key)
        result[key] = (
            _merged(old, value) if isinstance(old, dict) and isinstance(value, dict) else value
        )
    return result


def default_policy(name: str = DEFAULT_POLICY_NAME) -> ClusterPolicy:
    """A ClusterPolicy with every field at its model default."""
    return ClusterPolicy(metadata={"name": name}, spec=ClusterPolicySpec())


def sample_policy() -> dict[str, Any]:
    """The chart's default policy as a plain object, every defaulted field written out."""
    defaults = ClusterPolicySpec().model_dump(mode="json", by_alias=True, exclude_none=True)
    spec = ClusterPolicySpec.model_validate(_merged(defaults, CHART_CHOICES)).model_dump(
        mode="json", by_alias=True, exclude_none=True
    )
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": DEFAULT_POLICY_NAME},
        "spec": spec,
    }


def render_sample_policy_yaml() -> str:
    """deploy/clusterpolicy.yaml: the sample policy as YAML."""
    return _SAMPLE_HEADER + _dump(sample_policy())
