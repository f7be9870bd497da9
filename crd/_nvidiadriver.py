"""The NVIDIADriver resource (`nvidia.com/v1alpha1`): one driver configuration per node pool.

A fleet that mixes GPU generations, kernels and OSes needs more than the ClusterPolicy's
single driver section. Each NVIDIADriver selects GPU nodes (`nodeSelector`); the
`default` one takes the GPU nodes no other selects. The field names, defaults and CEL
rules are upstream's, so existing NVIDIADriver manifests apply unchanged. The CRD is
generated from these models like the ClusterPolicy's.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import yaml
from pydantic import ConfigDict, Field

from crd._common import (
    EnvVar,
    ImagePullPolicy,
    JsonObject,
    K8sModel,
    ResourceRequirements,
    Toleration,
)
from crd._components import GDRCopySpec, GPUDirectStorageSpec
from crd._driver_spec import (
    ContainerProbeSpec,
    DriverCertConfigSpec,
    DriverManagerSpec,
    GPUDirectRDMASpec,
    KernelModuleConfigSpec,
)
from crd._schema import Schema, model_schema
from crd._status import Conditions
from crd._upgrade import ClusterDriverUpgradePolicySpec

NVD_GROUP = "nvidia.com"
NVD_VERSION = "v1alpha1"
NVD_API_VERSION: Literal["nvidia.com/v1alpha1"] = "nvidia.com/v1alpha1"
NVD_KIND: Literal["NVIDIADriver"] = "NVIDIADriver"
NVD_PLURAL = "nvidiadrivers"
NVD_SINGULAR = "nvidiadriver"
NVD_SHORT_NAMES = ("nvd", "nvdriver", "nvdrivers")
NVD_CRD_NAME = f"{NVD_PLURAL}.{NVD_GROUP}"
DEFAULT_NVD_NAME = "default"
"""The name the chart gives its default NVIDIADriver."""

OWNER_LABEL = "nvidia.com/gpu-operator.driver.owner"
"""Node label naming the NVIDIADriver that owns the node's driver (operator-managed)."""

NVD_CRD_FILE = "crd/nvidia.com_nvidiadrivers.yaml"
NVD_CHART_CRD_FILES = (
    "deploy/crds/nvidia.com_nvidiadrivers.yaml",
    "deploy/helm/gpu-operator/crds/nvidia.com_nvidiadrivers.yaml",
)

NVDState = Literal["ignored", "ready", "notReady", "disabled"]
REASON_CONFLICTING_NODE_SELECTOR = "ConflictingNodeSelector"
REASON_DRIVER_NOT_READY = "DriverNotReady"

_IMMUTABLE = "is an immutable field. Please create a new NvidiaDriver resource instead when"


def _immutable(field: str) -> dict[str, Any]:
    return {
        "x-kubernetes-validations": [
            {
                "rule": "self == oldSelf",
                "message": f"{field} {_IMMUTABLE} you want to change this setting.",
            }
        ]
    }


class NVDRepoConfigSpec(K8sModel):
    """Custom package repositories for driver builds."""

    name: str | None = None
    """ConfigMap holding repository files."""


class NVDLicensingConfigSpec(K8sModel):
    """vGPU guest driver licensing."""

    name: str | None = None
    """ConfigMap holding gridd.conf (deprecated: use secretName)."""
    secret_name: str | None = None
    """Secret holding gridd.conf and the client configuration token."""
    nls_enabled: bool | None = None
    """Use NVIDIA License System (the default when unset)."""


class NVDVirtualTopologyConfigSpec(K8sModel):
    """Virtual topology daemon configuration."""

    name: str | None = None
    """ConfigMap holding the topology file."""


class NVIDIADriverSpec(K8sModel):
    """Desired driver of the nodes this resource selects."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.default) && self.default ? !has(self.nodeSelector)"
                    " || size(self.nodeSelector) == 0 : true",
                    "message": "default NVIDIADriver must not use nodeSelector",
                },
                {
                    "rule": f"!has(self.nodeSelector) || !('{OWNER_LABEL}' in self.nodeSelector)",
                    "message": f"nodeSelector must not use the reserved label {OWNER_LABEL}",
                },
            ]
        }
    )

    default: bool = False
    """The fallback: drives every GPU node that no other NVIDIADriver selects."""
    driver_type: Annotated[
        Literal["gpu", "vgpu", "vgpu-host-manager"],
        Field(json_schema_extra=_immutable("driverType")),
    ] = "gpu"
    """gpu (data centre driver), vgpu (guest driver) or vgpu-host-manager."""
    use_precompiled: (
        Annotated[bool, Field(json_schema_extra=_immutable("usePrecompiled"))] | None
    ) = None
    """Precompiled driver images, one per kernel (no build on the node)."""
    use_open_kernel_modules: bool | None = None
    """Deprecated: use kernelModuleType=open."""
    kernel_module_type: Literal["auto", "open", "proprietary"] = "auto"
    """Kernel module flavour; auto picks the recommended one for the branch and GPU."""
    startup_probe: ContainerProbeSpec | None = None
    """Startup probe of the driver container."""
    liveness_probe: ContainerProbeSpec | None = None
    """Liveness probe of the driver container."""
    readiness_probe: ContainerProbeSpec | None = None
    """Readiness probe of the driver container."""
    rdma: GPUDirectRDMASpec | None = None
    """GPUDirect RDMA (nvidia-peermem)."""
    gds: GPUDirectStorageSpec | None = None
    """GPUDirect Storage (nvidia-fs sidecar)."""
    gdrcopy: GDRCopySpec | None = None
    """GDRCopy (gdrdrv sidecar)."""
    repository: str | None = None
    """Registry and path of the driver image."""
    image: str | None = None
    """Driver image name, or a full reference (the operator's default when unset)."""
    version: str | None = None
    """Driver version (the branch, e.g. `595`, for precompiled images)."""
    image_pull_policy: ImagePullPolicy | None = None
    """When the kubelet pulls the image."""
    image_pull_secrets: list[str] | None = None
    """Secrets in the operator namespace used to pull the image."""
    manager: DriverManagerSpec | None = None
    """The k8s-driver-manager init container."""
    resources: ResourceRequirements | None = None
    """Compute resources of the driver container."""
    args: list[str] | None = None
    """Extra arguments for the driver container."""
    env: list[EnvVar] | None = None
    """Extra environment of the driver container."""
    repo_config: NVDRepoConfigSpec | None = None
    """Custom package repositories."""
    cert_config: DriverCertConfigSpec | None = None
    """Custom CA certificates."""
    licensing_config: NVDLicensingConfigSpec | None = None
    """vGPU licensing."""
    virtual_topology_config: NVDVirtualTopologyConfigSpec | None = None
    """Virtual topology configuration."""
    kernel_module_config: KernelModuleConfigSpec | None = None
    """Kernel module parameters."""
    secret_env: Annotated[str, Field(pattern=r"^[a-zA-Z0-9\-]+$")] | None = None
    """Secret whose keys become environment variables of the driver container."""
    upgrade_policy: ClusterDriverUpgradePolicySpec | None = None
    """How this resource's driver upgrades roll across its nodes (upstream defaults)."""
    node_selector: dict[str, str] | None = None
    """Labels a node must carry to be driven by this resource (not for the default)."""
    node_affinity: JsonObject | None = None
    """core/v1 NodeAffinity of the driver pods."""
    labels: dict[str, str] | None = None
    """Labels added to the driver DaemonSets and pods."""
    annotations: dict[str, str] | None = None
    """Annotations added to the driver DaemonSets and pods."""
    tolerations: list[Toleration] | None = None
    """Tolerations of the driver pods, besides nvidia.com/gpu."""
    priority_class_name: str | None = None
    """Priority class of the driver pods (system-node-critical when unset)."""
    pod_security_context: JsonObject | None = None
    """core/v1 PodSecurityContext of the driver pods."""
    host_network: bool | None = None
    """Run the driver pods in the host network namespace."""

    @property
    def precompiled(self) -> bool:
        return bool(self.use_precompiled)

    def upgrade_policy_with_defaults(self) -> ClusterDriverUpgradePolicySpec:
        return self.upgrade_policy or ClusterDriverUpgradePolicySpec()


class NVIDIADriverStatus(K8sModel):
    """Observed state of one NVIDIADriver."""

    state: NVDState | None = None
    """ready, notReady, disabled (the ClusterPolicy does not use NVIDIADrivers) or ignored."""
    namespace: str | None = None
    """Namespace of the driver DaemonSets."""
    conditions: Conditions | None = None
    """Ready and Error conditions."""


class NVIDIADriver(K8sModel):
    """A whole NVIDIADriver object as the API server returns it."""

    model_config = ConfigDict(extra="ignore")

    api_version: Literal["nvidia.com/v1alpha1"] = NVD_API_VERSION
    kind: Literal["NVIDIADriver"] = NVD_KIND
    metadata: JsonObject = Field(default_factory=dict)
    spec: NVIDIADriverSpec = Field(default_factory=NVIDIADriverSpec)
    status: NVIDIADriverStatus | None = None

    @property
    def name(self) -> str:
        return str(self.metadata.get("name", ""))

    @property
    def deleting(self) -> bool:
        return bool(self.metadata.get("deletionTimestamp"))


def parse_nvidiadriver(raw: dict[str, Any]) -> NVIDIADriver:
    """Model of a stored object; raises ``pydantic.ValidationError`` when it does not fit."""
    data = {k: v for k, v in raw.items() if k in ("apiVersion", "kind", "metadata", "spec")}
    return NVIDIADriver.model_validate(data)


def nvd_openapi_schema() -> Schema:
    return {
        "description": "NVIDIADriver configures the NVIDIA driver of the GPU nodes it selects.",
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string", "description": "Always nvidia.com/v1alpha1."},
            "kind": {"type": "string", "description": "Always NVIDIADriver."},
            "metadata": {"type": "object"},
            "spec": model_schema(NVIDIADriverSpec),
            "status": model_schema(NVIDIADriverStatus),
        },
    }


def nvd_crd_manifest() -> Schema:
    """The NVIDIADriver CustomResourceDefinition as a plain dict."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": NVD_CRD_NAME},
        "spec": {
            "group": NVD_GROUP,
            "names": {
                "kind": NVD_KIND,
                "listKind": f"{NVD_KIND}List",
                "plural": NVD_PLURAL,
                "singular": NVD_SINGULAR,
                "shortNames": list(NVD_SHORT_NAMES),
            },
            "scope": "Cluster",
            "versions": [
                {
                    "name": NVD_VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": "Status", "type": "string", "jsonPath": ".status.state"},
                        {"name": "Default", "type": "boolean", "jsonPath": ".spec.default"},
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                    "schema": {"openAPIV3Schema": nvd_openapi_schema()},
                }
            ],
        },
    }


_HEADER = (
    "# Generated from the models in crd/_nvidiadriver.py -- do not edit.\n"
    "# Regenerate: gpuop crd nvidiadrivers > crd/nvidia.com_nvidiadrivers.yaml"
    " (and copy it to deploy/crds/ and the chart's crds/)\n"
)


def render_nvd_crd_yaml() -> str:
    """The NVIDIADriver CRD as YAML, byte-for-byte deterministic."""
    return _HEADER + yaml.safe_dump(nvd_crd_manifest(), sort_keys=False, default_flow_style=False)
