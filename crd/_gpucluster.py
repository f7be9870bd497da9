"""The GPUCluster resource (`nvidia.com/v1alpha1`): the DRA software stack.

Upstream v26.7's second, experimental API. Where a ClusterPolicy deploys the
device-plugin stack, a GPUCluster deploys the NVIDIA DRA driver (kubelet plugin and
compute-domain controller), its DeviceClasses, a DRA validator and a standalone
DCGM/exporter that read GPUs through admin-access ResourceClaims. It manages no driver
(that is the host's or an NVIDIADriver's) and cannot exist beside a ClusterPolicy.
Field names, defaults and CEL rules are upstream's, so its manifests apply unchanged;
the CRD is generated from these models like the ClusterPolicy's.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import yaml
from pydantic import ConfigDict, Field

from crd._common import (
    EnvVar,
    IntOrCountOrPercent,
    JsonObject,
    K8sModel,
    PodSecurityContext,
    ResourceRequirements,
    Toleration,
)
from crd._components import DCGMExporterSpec, DCGMSpec
from crd._schema import Schema, model_schema
from crd._status import Conditions

GC_GROUP = "nvidia.com"
GC_VERSION = "v1alpha1"
GC_API_VERSION: Literal["nvidia.com/v1alpha1"] = "nvidia.com/v1alpha1"
GC_KIND: Literal["GPUCluster"] = "GPUCluster"
GC_PLURAL = "gpuclusters"
GC_SINGULAR = "gpucluster"
GC_SHORT_NAMES = ("gc",)
GC_CRD_NAME = f"{GC_PLURAL}.{GC_GROUP}"
GC_NAME = "gpu-cluster"
"""The only name a GPUCluster may have (a singleton, by the CRD's own rule)."""

GC_CRD_FILE = "crd/nvidia.com_gpuclusters.yaml"
GC_CHART_CRD_FILES = (
    "deploy/crds/nvidia.com_gpuclusters.yaml",
    "deploy/helm/gpu-operator/crds/nvidia.com_gpuclusters.yaml",
)

GCState = Literal["ready", "notReady", "disabled"]
REASON_PREREQUISITE_NOT_MET = "PrerequisiteNotMet"
"""Upstream's Error reason while a ClusterPolicy exists beside the GPUCluster."""

DEFAULT_GPUS_HEALTHCHECK_PORT = 51516
DEFAULT_COMPUTE_DOMAINS_HEALTHCHECK_PORT = 51515


class DRADriverHealthcheckSpec(K8sModel):
    """The gRPC health service of a kubelet-plugin container, which its probes check."""

    enabled: bool = True
    """Serve it and probe it."""
    port: Annotated[int, Field(ge=1, le=65535)] | None = None
    """Its port (51516 for the gpus container, 51515 for computeDomains when unset)."""


class DRADriverKubeletPluginSpec(K8sModel):
    """One container of the kubelet-plugin DaemonSet (scheduling is not configurable)."""

    env: list[EnvVar] | None = None
    """Extra environment of the container."""
    resources: ResourceRequirements | None = None
    """Compute resources of the container."""
    healthcheck: DRADriverHealthcheckSpec | None = None
    """Its gRPC health service and the probes on it."""


class DRADriverControllerSpec(K8sModel):
    """The compute-domain controller Deployment (scheduling is not configurable)."""

    env: list[EnvVar] | None = None
    """Extra environment of the controller container."""
    resources: ResourceRequirements | None = None
    """Compute resources of the controller container."""


class DRADriverGPUsSpec(K8sModel):
    """The gpu.nvidia.com capability: always deployed."""

    kubelet_plugin: DRADriverKubeletPluginSpec = Field(default_factory=DRADriverKubeletPluginSpec)
    """The kubelet plugin's `gpus` container."""


class DRADriverComputeDomainsSpec(K8sModel):
    """The compute-domain (multi-node NVLink) capability."""

    enabled: bool = True
    """Deploy the compute-domain controller and kubelet-plugin container."""
    controller: DRADriverControllerSpec = Field(default_factory=DRADriverControllerSpec)
    """The compute-domain controller Deployment."""
    kubelet_plugin: DRADriverKubeletPluginSpec = Field(default_factory=DRADriverKubeletPluginSpec)
    """The kubelet plugin's `compute-domains` container."""


class DRADriverSpec(K8sModel):
    """The NVIDIA DRA driver (no on/off switch: the gpus capability always runs)."""

    repository: str | None = None
    """Registry and path of the DRA driver image."""
    image: Annotated[str, Field(pattern=r"^[a-zA-Z0-9\-]+$")] | None = None
    """DRA driver image name."""
    version: str | None = None
    """DRA driver image tag."""
    image_pull_policy: str | None = None
    """When the kubelet pulls the image (unset: the API server's default)."""
    image_pull_secrets: list[str] | None = None
    """Secrets in the operator namespace used to pull the image."""
    feature_gates: dict[str, bool] | None = None
    """Driver feature gates, passed to its containers as FEATURE_GATES."""
    gpus: DRADriverGPUsSpec = Field(default_factory=DRADriverGPUsSpec)
    """The gpu.nvidia.com capability."""
    compute_domains: DRADriverComputeDomainsSpec = Field(
        default_factory=DRADriverComputeDomainsSpec
    )
    """The compute-domain capability."""


class GPUClusterHostPathsSpec(K8sModel):
    """Host paths the DRA stack mounts (no rootFS: the host root is `/` for it)."""

    driver_install_dir: str | None = None
    """Where the driver's files are on the host (/run/nvidia/driver when unset)."""
    kubelet_root_dir: str = "/var/lib/kubelet"
    """The kubelet's root directory (plugin registry, plugins and pod-resources)."""


class GPUClusterRollingUpdateSpec(K8sModel):
    """Rolling update of the stack's DaemonSets."""

    max_unavailable: IntOrCountOrPercent | None = None
    """Nodes (or percentage) whose pod may be down at once during an update."""


class GPUClusterDaemonsetsSpec(K8sModel):
    """Settings for every DaemonSet of the stack. Unlike a ClusterPolicy's, nothing but
    the update strategy has a default: unset tolerations mean none, as upstream."""

    labels: dict[str, str] | None = None
    """Extra labels on the stack's objects and pods."""
    annotations: dict[str, str] | None = None
    """Extra annotations on the stack's objects and pods."""
    tolerations: list[Toleration] | None = None
    """Tolerations of the stack's pods."""
    priority_class_name: str | None = None
    """PriorityClass of the kubelet plugin and controller (system-node-critical unset)."""
    update_strategy: Literal["RollingUpdate", "OnDelete"] = "RollingUpdate"
    """Accepted as upstream's; its DRA manifests fix each DaemonSet's strategy."""
    rolling_update: GPUClusterRollingUpdateSpec | None = None
    """Accepted as upstream's; its DRA manifests fix each DaemonSet's strategy."""
    pod_security_context: PodSecurityContext | None = None
    """Accepted as upstream's; its DRA manifests set no pod security context."""


class GPUClusterSpec(K8sModel):
    """Desired DRA stack. The driver itself is installed separately."""

    dra_driver: DRADriverSpec = Field(alias="draDriver")
    """The NVIDIA DRA driver."""
    dcgm: DCGMSpec | None = None
    """Standalone DCGM host engine (off unless enabled)."""
    dcgm_exporter: DCGMExporterSpec | None = None
    """DCGM exporter reading GPUs through an admin-access claim (deployed when the
    section is present and not disabled, as upstream)."""
    host_paths: GPUClusterHostPathsSpec = Field(default_factory=GPUClusterHostPathsSpec)
    """Host paths the stack mounts."""
    daemonsets: GPUClusterDaemonsetsSpec = Field(default_factory=GPUClusterDaemonsetsSpec)
    """Settings for every DaemonSet of the stack."""

    @property
    def dcgm_enabled(self) -> bool:
        return self.dcgm is not None and self.dcgm.enabled

    @property
    def exporter_enabled(self) -> bool:
        return self.dcgm_exporter is not None and self.dcgm_exporter.enabled


class GPUClusterStatus(K8sModel):
    """Observed state of the GPUCluster."""

    state: GCState | None = None
    """ready, notReady or disabled."""
    namespace: str | None = None
    """Namespace of the stack's operands."""
    conditions: Conditions | None = None
    """Ready and Error conditions."""


class GPUCluster(K8sModel):
    """A whole GPUCluster object as the API server returns it."""

    model_config = ConfigDict(extra="ignore")

    api_version: Literal["nvidia.com/v1alpha1"] = GC_API_VERSION
    kind: Literal["GPUCluster"] = GC_KIND
    metadata: JsonObject = Field(default_factory=dict)
    spec: GPUClusterSpec
    status: GPUClusterStatus | None = None

    @property
    def name(self) -> str:
        return str(self.metadata.get("name", ""))


def parse_gpucluster(raw: dict[str, Any]) -> GPUCluster:
    """Model of a stored object; raises ``pydantic.ValidationError`` when it does not fit."""
    data = {k: v for k, v in raw.items() if k in ("apiVersion", "kind", "metadata", "spec")}
    return GPUCluster.model_validate(data)


def gc_openapi_schema() -> Schema:
    spec = model_schema(GPUClusterSpec)
    return {
        "description": "GPUCluster deploys the DRA-based GPU stack (one per cluster).",
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string", "description": "Always nvidia.com/v1alpha1."},
            "kind": {"type": "string", "description": "Always GPUCluster."},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": model_schema(GPUClusterStatus),
        },
        "x-kubernetes-validations": [
            {
                "rule": f"self.metadata.name == '{GC_NAME}'",
                "message": f"GPUCluster is a singleton, metadata.name must be '{GC_NAME}'",
            }
        ],
    }


def gc_crd_manifest() -> Schema:
    """The GPUCluster CustomResourceDefinition as a plain dict."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": GC_CRD_NAME},
        "spec": {
            "group": GC_GROUP,
            "names": {
                "kind": GC_KIND,
                "listKind": f"{GC_KIND}List",
                "plural": GC_PLURAL,
                "singular": GC_SINGULAR,
                "shortNames": list(GC_SHORT_NAMES),
            },
            "scope": "Cluster",
            "versions": [
                {
                    "name": GC_VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": "Status", "type": "string", "jsonPath": ".status.state"},
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                    "schema": {"openAPIV3Schema": gc_openapi_schema()},
                }
            ],
        },
    }


_HEADER = (
    "# Generated from the models in crd/_gpucluster.py -- do not edit.\n"
    "# Regenerate: gpuop crd gpuclusters > crd/nvidia.com_gpuclusters.yaml"
    " (and copy it to deploy/crds/ and the chart's crds/)\n"
)


def render_gc_crd_yaml() -> str:
    """The GPUCluster CRD as YAML, byte-for-byte deterministic."""
    return _HEADER + yaml.safe_dump(gc_crd_manifest(), sort_keys=False, default_flow_style=False)
