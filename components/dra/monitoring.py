"""States `state-dcgm`, `state-dcgm-exporter` and `state-dra-validation` of a GPUCluster.

All three reach GPUs the DRA way: through an admin-access ResourceClaimTemplate (every
GPU of the node for DCGM and its exporter, one for the validator), which lets them see
devices without consuming them. A pod holding such a claim needs the kubelet plugin to
unprepare it, which is why the controller removes these DaemonSets first on delete.
"""

from __future__ import annotations

from typing import Any

from components._host_paths import host_path, mount
from components._k8s import dump_env, dump_model, env, field_env, operator_image_pulls
from components.context import Manifest, RenderContext
from components.dra._common import (
    DCGM,
    DCGM_EXPORTER,
    DRA_VALIDATION,
    PRIORITY_CLASS,
    admin_claim_template,
    binding,
    meta,
    pull_policy,
    pull_secrets,
    role,
    rule,
    service_account,
    template_meta,
    tolerations,
    workload_meta,
)
from components.monitoring import endpoint
from crd import DEFAULT_IMAGES, DCGMExporterSpec, DCGMSpec, GPUClusterSpec, image_ref

EXPORTER = "nvidia-dcgm-exporter-dra"
EXPORTER_CLAIM = "nvidia-dcgm-exporter-admin"
DCGM_NAME = "nvidia-dcgm-dra"
DCGM_CLAIM = "nvidia-dcgm-admin"
VALIDATOR = "nvidia-dra-validator"
VALIDATOR_CLAIM = "nvidia-dra-validator-gpu"
REMOTE_ENGINE = f"{DCGM_NAME}:5555"
READ = ["get", "list", "watch"]


def _resources(section: DCGMSpec | DCGMExporterSpec, claim: str) -> dict[str, Any]:
    """The container's resources with its claim: what lets it see the claimed GPUs."""
    dumped = dump_model(section.resources) if section.resources else {}
    return {**dumped, "claims": [{"name": claim}]}


def _daemonset(
    name: str,
    state: str,
    spec: GPUClusterSpec,
    ctx: RenderContext,
    pod: dict[str, Any],
    *,
    own: dict[str, str],
    selector: dict[str, str],
    pod_labels: dict[str, str] | None = None,
    pod_annotations: dict[str, str] | None = None,
    strategy: dict[str, Any] | None = None,
) -> Manifest:
    if spec.daemonsets.tolerations:
        pod["tolerations"] = tolerations(spec)
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": workload_meta(name, state, ctx.namespace, own, spec),
        "spec": {
            "selector": {"matchLabels": selector},
            "updateStrategy": strategy or {"type": "RollingUpdate"},
            "template": {
                "metadata": template_meta(pod_labels or own, spec, pod_annotations),
                "spec": pod,
            },
        },
    }


def dcgm(spec: GPUClusterSpec, ctx: RenderContext) -> list[Manifest]:
    """The standalone host engine, reached by exporters through a node-local Service."""
    section = spec.dcgm
    assert section is not None
    ns, s = ctx.namespace, DCGM
    ctr: dict[str, Any] = {
        "name": "nvidia-dcgm-ctr",
        "image": image_ref(section, DEFAULT_IMAGES["dcgm"], "spec.dcgm"),
        **pull_policy(section.pull_policy_as_written),
        **({"args": list(section.args)} if section.args else {}),
        **({"env": dump_env(section.env)} if section.env else {}),
        "securityContext": {"privileged": True},
        "ports": [{"name": "dcgm", "containerPort": 5555}],
        "livenessProbe": {"tcpSocket": {"port": 5555}, "initialDelaySeconds": 15},
        "readinessProbe": {"tcpSocket": {"port": 5555}, "initialDelaySeconds": 15},
        "resources": _resources(section, "admin-gpus"),
    }
    pod: dict[str, Any] = {
        "priorityClassName": PRIORITY_CLASS,
        "serviceAccountName": DCGM_NAME,
        "nodeSelector": {"nvidia.com/gpu.deploy.dcgm-dra": "true"},
        **pull_secrets(section.image_pull_secrets),
        **(
            {"hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet"}
            if section.host_network
            else {}
        ),
        "resourceClaims": [{"name": "admin-gpus", "resourceClaimTemplateName": DCGM_CLAIM}],
        "containers": [ctr],
    }
    app = {"app": DCGM_NAME}
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta(DCGM_NAME, s, ns, app),
        "spec": {
            "type": "ClusterIP",
            "internalTrafficPolicy": "Local",
            "selector": app,
            "ports": [{"name": "dcgm", "port": 5555, "targetPort": 5555, "protocol": "TCP"}],
        },
    }
    return [
        service_account(DCGM_NAME, s, ns, {}),
        role("Role", DCGM_NAME, s, ns, [rule(["resource.k8s.io"], ["resourceclaims"], READ)]),
        binding("RoleBinding", DCGM_NAME, s, ns, DCGM_NAME, DCGM_NAME, ns),
        admin_claim_template(DCGM_CLAIM, s, ns, "admin-gpus", None),
        _daemonset(DCGM_NAME, s, spec, ctx, pod, own=app, selector=app),
        service,
    ]


def _exporter_env(spec: GPUClusterSpec, section: DCGMExporterSpec) -> list[dict[str, Any]]:
    custom = section.config is not None and bool(section.config.name)
    collectors = "dcgm-metrics.csv" if custom else "dcp-metrics-included.csv"
    job_dir = _job_mapping_dir(section)
    return [
        env("DCGM_EXPORTER_LISTEN", ":9400"),
        env("DCGM_EXPORTER_KUBERNETES", "true"),
        env("DCGM_EXPORTER_COLLECTORS", f"/etc/dcgm-exporter/{collectors}"),
        field_env("NODE_NAME", "spec.nodeName"),
        *([env("DCGM_REMOTE_HOSTENGINE_INFO", REMOTE_ENGINE)] if spec.dcgm_enabled else []),
        *([env("DCGM_HPC_JOB_MAPPING_DIR", job_dir)] if job_dir else []),
        # The kubelet names DRA-allocated devices by pool and device, not UUID: the
        # exporter resolves them through ResourceSlices to label metrics with pods.
        env("KUBERNETES_ENABLE_DRA", "true"),
        *(
            [env("DCGM_EXPORTER_KUBERNETES_ENABLE_POD_LABELS", "true")]
            if section.enable_pod_labels
            else []
        ),
        *(
            [env("DCGM_EXPORTER_KUBERNETES_ENABLE_POD_UID", "true")]
            if section.enable_pod_uid
            else []
        ),
        *(
            [
                env(
                    "DCGM_EXPORTER_KUBERNETES_POD_LABEL_ALLOWLIST_REGEX",
                    ",".join(section.pod_label_allowlist_regex),
                )
            ]
            if section.pod_label_allowlist_regex
            else []
        ),
        *dump_env(section.env),
    ]


def _job_mapping_dir(section: DCGMExporterSpec) -> str | None:
    mapping = section.hpc_job_mapping
    if mapping is None or not mapping.enabled:
        return None
    return mapping.directory or "/var/lib/dcgm-exporter/job-mapping"


def exporter(spec: GPUClusterSpec, ctx: RenderContext) -> list[Manifest]:
    section = spec.dcgm_exporter
    assert section is not None
    ns, s = ctx.namespace, DCGM_EXPORTER
    app = {"app": EXPORTER}
    config = section.config.name if section.config is not None and section.config.name else None
    job_dir = _job_mapping_dir(section)
    mounts = [mount("pod-gpu-resources", "/var/lib/kubelet/pod-resources", read_only=True)]
    kubelet = spec.host_paths.kubelet_root_dir or "/var/lib/kubelet"
    volumes = [host_path("pod-gpu-resources", f"{kubelet}/pod-resources")]
    if config:
        mounts.append(
            {**mount("metrics-config", "/etc/dcgm-exporter/dcgm-metrics.csv", read_only=True)}
            | {"subPath": "dcgm-metrics.csv"}
        )
        volumes.append(
            {
                "name": "metrics-config",
                "configMap": {
                    "name": config,
                    "items": [{"key": "dcgm-metrics.csv", "path": "dcgm-metrics.csv"}],
                },
            }
        )
    if job_dir:
        mounts.append(mount("hpc-job-mapping", job_dir, read_only=True))
        volumes.append(host_path("hpc-job-mapping", job_dir, "DirectoryOrCreate"))
    health = {"port": 9400, "path": "/health"}
    ctr: dict[str, Any] = {
        "name": EXPORTER,
        "image": image_ref(section, DEFAULT_IMAGES["dcgmExporter"], "spec.dcgmExporter"),
        **pull_policy(section.pull_policy_as_written),
        **({"args": list(section.args)} if section.args else {}),
        "env": _exporter_env(spec, section),
        "securityContext": {"privileged": True},
        "ports": [{"name": "metrics", "containerPort": 9400}],
        "livenessProbe": {"httpGet": health, "initialDelaySeconds": 45, "periodSeconds": 5},
        "readinessProbe": {"httpGet": dict(health), "initialDelaySeconds": 45},
        "resources": _resources(section, "admin-gpus"),
        "volumeMounts": mounts,
    }
    pod: dict[str, Any] = {
        "priorityClassName": PRIORITY_CLASS,
        "serviceAccountName": EXPORTER,
        "automountServiceAccountToken": True,
        "nodeSelector": {"nvidia.com/gpu.deploy.dcgm-exporter-dra": "true"},
        **pull_secrets(section.image_pull_secrets),
        **({"hostPID": True} if section.host_pid else {}),
        **(
            {"hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet"}
            if section.host_network
            else {}
        ),
        "resourceClaims": [{"name": "admin-gpus", "resourceClaimTemplateName": EXPORTER_CLAIM}],
        "containers": [ctr],
        "volumes": volumes,
    }
    service_spec = section.service
    svc: dict[str, Any] = {"type": (service_spec.type if service_spec else None) or "ClusterIP"}
    if service_spec is not None and service_spec.internal_traffic_policy:
        svc["internalTrafficPolicy"] = service_spec.internal_traffic_policy
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta(EXPORTER, s, ns, app, {"prometheus.io/scrape": "true"}),
        "spec": {
            **svc,
            "selector": app,
            "ports": [{"name": "gpu-metrics", "port": 9400, "targetPort": 9400, "protocol": "TCP"}],
        },
    }
    read_pods = f"{EXPORTER}-read-pods"
    monitor = _service_monitor(section, ctx)
    return [
        service_account(EXPORTER, s, ns, {}),
        role(
            "Role",
            EXPORTER,
            s,
            ns,
            [
                rule(["resource.k8s.io"], ["resourceclaims"], READ),
                rule([""], ["configmaps"], ["get", "list"]),
            ],
        ),
        role(
            "ClusterRole",
            read_pods,
            s,
            None,
            [rule([""], ["pods"], READ), rule(["resource.k8s.io"], ["resourceslices"], READ)],
            app=EXPORTER,
        ),
        binding("RoleBinding", EXPORTER, s, ns, EXPORTER, EXPORTER, ns),
        binding("ClusterRoleBinding", read_pods, s, None, read_pods, EXPORTER, ns, app=EXPORTER),
        admin_claim_template(EXPORTER_CLAIM, s, ns, "admin-gpus", None),
        service,
        _daemonset(
            EXPORTER,
            s,
            spec,
            ctx,
            pod,
            own=app,
            selector=app,
            pod_annotations=section.annotations,
        ),
        *([monitor] if monitor else []),
    ]


def _service_monitor(section: DCGMExporterSpec, ctx: RenderContext) -> Manifest | None:
    """The exporter's ServiceMonitor, as upstream's DRA state renders it
    (`manifests/state-dcgm-exporter/0600_service_monitor.yaml`): where
    `dcgmExporter.serviceMonitor.enabled` asks for it and the cluster serves the
    Prometheus Operator's ServiceMonitor kind (`internal/state/dcgm_exporter.go` skips
    it otherwise, as the ClusterPolicy side does). Unlike the ClusterPolicy's, its
    endpoint always says `honorLabels`."""
    settings = section.service_monitor
    if settings is None or not settings.enabled or not ctx.service_monitor_crd:
        return None
    app = {"app": EXPORTER}
    labels = {**app, **(settings.additional_labels or {})}
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": meta(EXPORTER, DCGM_EXPORTER, ctx.namespace, labels),
        "spec": {
            "jobLabel": "app",
            "namespaceSelector": {"matchNames": [ctx.namespace]},
            "selector": {"matchLabels": app},
            "endpoints": [endpoint("gpu-metrics", settings, always_honor_labels=True)],
        },
    }


def validator(spec: GPUClusterSpec, ctx: RenderContext) -> list[Manifest]:
    """One pod per GPU node that turns Ready once the DRA driver allocated it a GPU and
    the GPU answered (`nvidia-smi -L` in the claimed container). Its pods carry
    `app=nvidia-operator-validator`, the label upstream's upgrade gate selects."""
    ns, s = ctx.namespace, DRA_VALIDATION
    own = {
        "app.kubernetes.io/name": VALIDATOR,
        "app.kubernetes.io/component": VALIDATOR,
    }
    pod: dict[str, Any] = {
        "priorityClassName": PRIORITY_CLASS,
        "serviceAccountName": VALIDATOR,
        "nodeSelector": {"nvidia.com/gpu.deploy.dra-validator": "true"},
        **pull_secrets(spec.dra_driver.image_pull_secrets),
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "nvidia.com/gpu.present",
                                    "operator": "In",
                                    "values": ["true"],
                                }
                            ]
                        }
                    ]
                }
            }
        },
        "resourceClaims": [
            {"name": "validation-gpu", "resourceClaimTemplateName": VALIDATOR_CLAIM}
        ],
        "initContainers": [
            {
                "name": "gpu-validation",
                "image": ctx.operator_image,
                "command": ["sh", "-c", "nvidia-smi -L"],
                "resources": {"claims": [{"name": "validation-gpu"}]},
            }
        ],
        "containers": [
            {
                "name": VALIDATOR,
                "image": ctx.operator_image,
                "command": [
                    "sh",
                    "-c",
                    "echo all validations are successful; while true; do sleep 86400; done",
                ],
            }
        ],
    }
    # both containers run the operator image: draDriver's pull keys and ours
    pod = operator_image_pulls(pod, ctx, spec.dra_driver.image_pull_policy, None)
    return [
        service_account(VALIDATOR, s, ns, own),
        admin_claim_template(VALIDATOR_CLAIM, s, ns, "validation-gpu", 1),
        _daemonset(
            VALIDATOR,
            s,
            spec,
            ctx,
            pod,
            own={**own, "app": VALIDATOR},
            selector={"app.kubernetes.io/name": VALIDATOR},
            pod_labels={**own, "app": "nvidia-operator-validator"},
            strategy={"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "100%"}},
        ),
    ]
