"""State `state-dra-driver`: the NVIDIA DRA driver as upstream's GPUCluster deploys it.

One kubelet-plugin DaemonSet (a `gpus` container, and a `compute-domains` one when
compute domains are on) behind a driver-validation init container, the compute-domain
controller Deployment, their accounts, the DeviceClasses workloads claim GPUs through,
and a ValidatingAdmissionPolicy that lets the plugin write only its own node's
ResourceSlices (a compromised node cannot rewrite another node's inventory).
"""

from __future__ import annotations

import shlex
from decimal import Decimal
from typing import Any

from components._host_paths import HOST_ROOT_MOUNT, VALIDATIONS_DIR, host_path, mount
from components._k8s import dump_env, dump_model, env, field_env, operator_image_pulls
from components.context import Manifest, RenderContext
from components.dra._common import (
    DRA_DRIVER,
    PRIORITY_CLASS,
    RESOURCE_API,
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
from crd import (
    DefaultImage,
    GPUClusterSpec,
    ImageSpec,
    ResourceRequirements,
    image_ref,
    parse_quantity,
)
from crd._gpucluster import (
    DEFAULT_COMPUTE_DOMAINS_HEALTHCHECK_PORT,
    DEFAULT_GPUS_HEALTHCHECK_PORT,
    DRADriverHealthcheckSpec,
)

DEFAULT_IMAGE = DefaultImage("nvcr.io/nvidia", "dra-driver-nvidia-gpu", "v0.5.0")
"""The chart's DRA driver image (upstream's DRA_DRIVER_IMAGE)."""
PLUGIN = "nvidia-dra-driver-kubelet-plugin"
PLUGIN_ACCOUNT = "nvidia-dra-driver-kubeletplugin"
CONTROLLER = "nvidia-dra-driver-controller"
CD_DAEMON_ACCOUNT = "compute-domain-daemon-service-account"
POLICY = "resourceslices-policy-nvidia-dra-driver"
DEPLOY_LABEL = "nvidia.com/gpu.deploy.dra-driver"
NAME_LABELS = {"app.kubernetes.io/name": "nvidia-dra-driver"}
DRIVER_ROOT_CTR = "/driver-root"
DEFAULT_DRIVER_INSTALL_DIR = "/run/nvidia/driver"

PLUGIN_SCRIPT = """\
set -a
source /run/nvidia/validations/driver-ready
set +a
if [ "${{MASK_NVIDIA_DRIVER_PARAMS}}" = "true" ]; then
  cp /proc/driver/nvidia/params /root/gpu-params
  sed -i 's/^ModifyDeviceFiles: 1$/ModifyDeviceFiles: 0/' /root/gpu-params
  mount --bind /root/gpu-params /proc/driver/nvidia/params
fi
exec {binary} -v "${{LOG_VERBOSITY}}\""""
"""Both plugin containers: export the driver facts the driver-validation init container
wrote (NVIDIA_DRIVER_ROOT, DRIVER_ROOT_CTR_PATH); with MASK_NVIDIA_DRIVER_PARAMS, keep
the plugin from recreating missing device nodes; then run the plugin."""


def image(spec: GPUClusterSpec) -> str:
    dra = spec.dra_driver
    parts = ImageSpec(repository=dra.repository, image=dra.image, version=dra.version)
    return image_ref(parts, DEFAULT_IMAGE, "spec.draDriver")


def feature_gates(spec: GPUClusterSpec) -> str:
    """`FEATURE_GATES` as the driver reads it: sorted `name=bool` pairs."""
    gates = spec.dra_driver.feature_gates or {}
    return ",".join(f"{k}={str(gates[k]).lower()}" for k in sorted(gates))


def _gate(spec: GPUClusterSpec, name: str) -> bool:
    return bool((spec.dra_driver.feature_gates or {}).get(name))


def healthcheck_port(hc: DRADriverHealthcheckSpec | None, default: int) -> int | None:
    """The container's health port, or None when its health service is off."""
    if hc is not None and not hc.enabled:
        return None
    return hc.port if hc is not None and hc.port is not None else default


def _kubelet(spec: GPUClusterSpec, child: str) -> str:
    return f"{spec.host_paths.kubelet_root_dir or '/var/lib/kubelet'}/{child}"


def _install_dir(spec: GPUClusterSpec) -> str:
    return spec.host_paths.driver_install_dir or DEFAULT_DRIVER_INSTALL_DIR


def max_resources(*reqs: ResourceRequirements | None) -> dict[str, Any] | None:
    """The larger of each request and limit (a limit raised to its request): what the
    init container needs to run before either plugin container."""
    result: dict[str, dict[str, Any]] = {}
    for req in reqs:
        if req is None:
            continue
        dumped = dump_model(req)
        for part in ("requests", "limits"):
            for name, value in (dumped.get(part) or {}).items():
                current = result.setdefault(part, {}).get(name)
                if current is None or _qty(value) > _qty(current):
                    result[part][name] = value
    for name, value in (result.get("requests") or {}).items():
        limit = (result.get("limits") or {}).get(name)
        if limit is not None and _qty(value) > _qty(limit):
            result["limits"][name] = value
    return result or None


def _qty(value: Any) -> Decimal:
    return parse_quantity(value) or Decimal(0)


def _probes(port: int | None, liveness_period: int) -> dict[str, Any]:
    if port is None:
        return {}
    grpc = {"port": port, "service": "liveness"}
    return {
        "startupProbe": {
            "grpc": grpc,
            "failureThreshold": 600,
            "periodSeconds": 1,
            "timeoutSeconds": 10,
        },
        "livenessProbe": {
            "grpc": dict(grpc),
            "failureThreshold": 3,
            "periodSeconds": liveness_period,
            "timeoutSeconds": 10,
        },
    }


def _plugin_mounts(spec: GPUClusterSpec) -> list[dict[str, Any]]:
    return [
        mount("plugins-registry", _kubelet(spec, "plugins_registry")),
        mount("plugins", _kubelet(spec, "plugins"), propagation="Bidirectional"),
        mount("cdi", "/var/run/cdi"),
        mount("validations", VALIDATIONS_DIR, read_only=True),
        mount("host-root", HOST_ROOT_MOUNT, read_only=True, propagation="HostToContainer"),
        mount("driver-install-dir", DRIVER_ROOT_CTR, propagation="HostToContainer"),
    ]


def _plugin_container(spec: GPUClusterSpec, gpus: bool) -> dict[str, Any]:
    dra = spec.dra_driver
    section = dra.gpus.kubelet_plugin if gpus else dra.compute_domains.kubelet_plugin
    port = healthcheck_port(
        section.healthcheck,
        DEFAULT_GPUS_HEALTHCHECK_PORT if gpus else DEFAULT_COMPUTE_DOMAINS_HEALTHCHECK_PORT,
    )
    variables = [
        env("HTTP_ENDPOINT", ":8080" if gpus else ":8081"),
        env("METRICS_PATH", "/metrics"),
        env("LOG_VERBOSITY", "4"),
        env("MASK_NVIDIA_DRIVER_PARAMS", ""),
        env("NVIDIA_VISIBLE_DEVICES", "void"),
        env("CDI_ROOT", "/var/run/cdi"),
        *([env("HOST_ROOT", HOST_ROOT_MOUNT)] if gpus else []),
        env("NVIDIA_MIG_CONFIG_DEVICES", "all"),
        field_env("NODE_NAME", "spec.nodeName"),
        field_env("NAMESPACE", "metadata.namespace"),
        *([env("IMAGE_NAME", image(spec))] if gpus else []),
        env("KUBELET_REGISTRAR_DIRECTORY_PATH", _kubelet(spec, "plugins_registry")),
        env("KUBELET_PLUGINS_DIRECTORY_PATH", _kubelet(spec, "plugins")),
        env("HEALTHCHECK_PORT", str(port if port is not None else -1)),
        *([] if gpus else [env("GPU_CLIQUE_LABEL_ENABLED", "true")]),
        *([env("FEATURE_GATES", feature_gates(spec))] if dra.feature_gates else []),
        *dump_env(section.env),
    ]
    mounts = _plugin_mounts(spec)
    if gpus and _gate(spec, "PassthroughSupport"):
        mounts += [
            mount("lib-modules", "/lib/modules/", read_only=True, propagation="HostToContainer"),
            mount("sysfs", "/sys/", propagation="Bidirectional"),
            mount("procfs", "/proc/", propagation="Bidirectional"),
        ]
    binary = "gpu-kubelet-plugin" if gpus else "compute-domain-kubelet-plugin"
    return {
        "name": "gpus" if gpus else "compute-domains",
        "image": image(spec),
        **pull_policy(dra.image_pull_policy),
        "securityContext": {"privileged": True},
        "command": ["bash", "-c"],
        "args": [PLUGIN_SCRIPT.format(binary=binary)],
        "env": variables,
        **_probes(port, 30 if gpus else 10),
        "resources": dump_model(section.resources) if section.resources else {},
        "volumeMounts": mounts,
    }


def _driver_validation(spec: GPUClusterSpec, ctx: RenderContext) -> dict[str, Any]:
    """Wait until the node's driver is usable and write `driver-ready`: upstream runs
    its `nvidia-validator` (COMPONENT=driver), we run our node agent's driver check
    with the same environment (no /dev/char links, no GPU initialisation) and mounts."""
    check = shlex.join(
        [
            "gpuop",
            "node-agent",
            "validate",
            "--checks",
            "driver",
            "--driver-root",
            DRIVER_ROOT_CTR,
            "--host-root",
            HOST_ROOT_MOUNT,
        ]
    )
    dra = spec.dra_driver
    resources = max_resources(
        dra.gpus.kubelet_plugin.resources,
        dra.compute_domains.kubelet_plugin.resources if dra.compute_domains.enabled else None,
    )
    return {
        "name": "driver-validation",
        "image": ctx.operator_image,
        "command": ["sh", "-c"],
        "args": [f"until {check}; do sleep 5; done"],
        **({"resources": resources} if resources else {}),
        "securityContext": {"privileged": True, "runAsUser": 0},
        "env": [
            env("COMPONENT", "driver"),
            env("WITH_WAIT", "true"),
            env("DRIVER_VALIDATION_SKIP_GPU_INIT", "true"),
            env("DISABLE_DEV_CHAR_SYMLINK_CREATION", "true"),
            field_env("OPERATOR_NAMESPACE", "metadata.namespace"),
            env("HOST_ROOT", "/"),
            env("DRIVER_INSTALL_DIR", _install_dir(spec)),
            env("DRIVER_INSTALL_DIR_CTR_PATH", DRIVER_ROOT_CTR),
        ],
        "volumeMounts": [
            mount("host-root", HOST_ROOT_MOUNT, read_only=True, propagation="HostToContainer"),
            mount("driver-install-dir", DRIVER_ROOT_CTR, propagation="HostToContainer"),
            mount("validations", VALIDATIONS_DIR),
        ],
    }


GPU_NODE_TERMS = [
    {"matchExpressions": [{"key": k, "operator": "In", "values": [v]}]}
    for k, v in (
        ("feature.node.kubernetes.io/pci-10de.present", "true"),
        ("feature.node.kubernetes.io/cpu-model.vendor_id", "NVIDIA"),
        ("nvidia.com/gpu.present", "true"),
    )
]


def kubelet_plugin(spec: GPUClusterSpec, ctx: RenderContext) -> Manifest:
    own = {**NAME_LABELS, "app.kubernetes.io/component": PLUGIN, "app": PLUGIN}
    containers = [_plugin_container(spec, gpus=True)]
    if spec.dra_driver.compute_domains.enabled:
        containers.append(_plugin_container(spec, gpus=False))
    volumes = [
        host_path("plugins-registry", _kubelet(spec, "plugins_registry")),
        host_path("plugins", _kubelet(spec, "plugins")),
        host_path("cdi", "/var/run/cdi"),
        host_path("host-root", "/"),
        host_path("driver-install-dir", _install_dir(spec), "DirectoryOrCreate"),
        host_path("validations", VALIDATIONS_DIR, "DirectoryOrCreate"),
    ]
    if _gate(spec, "PassthroughSupport"):
        volumes += [
            host_path("lib-modules", "/lib/modules/", "Directory"),
            host_path("sysfs", "/sys/", "Directory"),
            host_path("procfs", "/proc/", "Directory"),
        ]
    pod: dict[str, Any] = {
        "priorityClassName": spec.daemonsets.priority_class_name or PRIORITY_CLASS,
        "serviceAccountName": PLUGIN_ACCOUNT,
        **pull_secrets(spec.dra_driver.image_pull_secrets),
        "nodeSelector": {DEPLOY_LABEL: "true"},
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": GPU_NODE_TERMS
                }
            }
        },
        **({"tolerations": tolerations(spec)} if spec.daemonsets.tolerations else {}),
        "initContainers": [_driver_validation(spec, ctx)],
        "containers": containers,
        "volumes": volumes,
    }
    # the driver validation runs the operator image: draDriver's pull keys and ours
    pod = operator_image_pulls(pod, ctx, spec.dra_driver.image_pull_policy, None)
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": workload_meta(PLUGIN, DRA_DRIVER, ctx.namespace, own, spec),
        "spec": {
            "selector": {"matchLabels": {"app": PLUGIN}},
            "updateStrategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": "100%"},
            },
            "template": {"metadata": template_meta(own, spec), "spec": pod},
        },
    }


CONTROL_PLANE_TOLERATIONS = [
    {"effect": "NoSchedule", "key": "node-role.kubernetes.io/control-plane", "operator": "Exists"},
    {"effect": "NoSchedule", "key": "node-role.kubernetes.io/master", "operator": "Exists"},
    {"key": "CriticalAddonsOnly", "operator": "Exists"},
]


def controller(spec: GPUClusterSpec, ctx: RenderContext) -> Manifest:
    """The compute-domain controller: one replica, preferring control-plane nodes."""
    own = {**NAME_LABELS, "app.kubernetes.io/component": CONTROLLER, "app": CONTROLLER}
    section = spec.dra_driver.compute_domains.controller
    variables = [
        env("HTTP_ENDPOINT", ":8080"),
        env("METRICS_PATH", "/metrics"),
        env("PPROF_PATH", ""),
        env("LOG_VERBOSITY", "4"),
        env("LOG_VERBOSITY_CD_DAEMON", "4"),
        field_env("POD_NAME", "metadata.name"),
        field_env("NAMESPACE", "metadata.namespace"),
        env("IMAGE_NAME", image(spec)),
        env("NVIDIA_VISIBLE_DEVICES", "void"),
        env("LEADER_ELECTION_ENABLED", "false"),
        env("LEADER_ELECTION_LEASE_LOCK_NAME", CONTROLLER),
        env("LEADER_ELECTION_LEASE_LOCK_NAMESPACE", ctx.namespace),
        env("LEADER_ELECTION_LEASE_DURATION", "15s"),
        env("LEADER_ELECTION_RENEW_DEADLINE", "10s"),
        env("LEADER_ELECTION_RETRY_PERIOD", "2s"),
        *([env("FEATURE_GATES", feature_gates(spec))] if spec.dra_driver.feature_gates else []),
        *dump_env(section.env),
    ]
    ctr: dict[str, Any] = {
        "name": "compute-domain",
        "image": image(spec),
        **pull_policy(spec.dra_driver.image_pull_policy),
        "command": ["compute-domain-controller", "-v", "$(LOG_VERBOSITY)"],
        "env": variables,
        **({"resources": dump_model(section.resources)} if section.resources else {}),
    }
    affinity = {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "preference": {
                        "matchExpressions": [
                            {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}
                        ]
                    },
                    "weight": 100,
                }
            ]
        },
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "podAffinityTerm": {
                        "labelSelector": {"matchLabels": {"app": CONTROLLER}},
                        "topologyKey": "kubernetes.io/hostname",
                    },
                    "weight": 100,
                }
            ]
        },
    }
    pod = {
        "priorityClassName": spec.daemonsets.priority_class_name or PRIORITY_CLASS,
        "serviceAccountName": CONTROLLER,
        **pull_secrets(spec.dra_driver.image_pull_secrets),
        "affinity": affinity,
        "tolerations": [*CONTROL_PLANE_TOLERATIONS, *tolerations(spec)],
        "containers": [ctr],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": workload_meta(CONTROLLER, DRA_DRIVER, ctx.namespace, own, spec),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": CONTROLLER}},
            "template": {"metadata": template_meta(own, spec), "spec": pod},
        },
    }


def device_class(name: str, expression: str) -> Manifest:
    return {
        "apiVersion": RESOURCE_API,
        "kind": "DeviceClass",
        "metadata": meta(name, DRA_DRIVER, None),
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }


def _gpu_class(name: str, kind: str) -> Manifest:
    return device_class(
        name,
        "device.driver == 'gpu.nvidia.com'"
        f" && device.attributes['gpu.nvidia.com'].type == '{kind}'",
    )


def device_classes(spec: GPUClusterSpec) -> list[Manifest]:
    """gpu, mig and vfio GPU classes; the compute-domain ones with compute domains."""
    cd = (
        "device.driver == 'compute-domain.nvidia.com'"
        " && device.attributes['compute-domain.nvidia.com']"
    )
    classes = [_gpu_class("gpu.nvidia.com", "gpu"), _gpu_class("mig.nvidia.com", "mig")]
    if spec.dra_driver.compute_domains.enabled:
        classes += [
            device_class("compute-domain-daemon.nvidia.com", f"{cd}.type == 'daemon'"),
            device_class(
                "compute-domain-default-channel.nvidia.com",
                f"{cd}.type == 'channel' && device.attributes['compute-domain.nvidia.com'].id == 0",
            ),
        ]
    classes.append(_gpu_class("vfio.gpu.nvidia.com", "vfio"))
    return classes


def resourceslice_policy(ctx: RenderContext) -> list[Manifest]:
    """The kubelet plugin's account may write only ResourceSlices of the node its pod
    runs on (or cluster-wide ones with a node selector or allNodes)."""
    target = '(request.operation == "DELETE" ? oldObject : object).spec'
    policy = {
        "failurePolicy": "Fail",
        "matchConstraints": {
            "resourceRules": [
                {
                    "apiGroups": ["resource.k8s.io"],
                    "apiVersions": ["v1", "v1beta1", "v1beta2"],
                    "operations": ["CREATE", "UPDATE", "DELETE"],
                    "resources": ["resourceslices"],
                }
            ]
        },
        "matchConditions": [
            {
                "name": "isRestrictedUser",
                "expression": "request.userInfo.username == "
                f'"system:serviceaccount:{ctx.namespace}:{PLUGIN_ACCOUNT}"',
            }
        ],
        "variables": [
            {
                "name": "userNodeName",
                "expression": "request.userInfo.extra[?'authentication.kubernetes.io/node-name']"
                "[0].orValue('')",
            },
            {"name": "objectNodeName", "expression": f'{target}.?nodeName.orValue("")'},
            {"name": "nodeSelectorValue", "expression": f"{target}.?nodeSelector.orValue(null)"},
            {"name": "allNodesValue", "expression": f"{target}.?allNodes.orValue(false)"},
        ],
        "validations": [
            {
                "expression": 'variables.userNodeName != ""',
                "message": "no node association found for user, this user must run in a pod"
                " on a node and ServiceAccountTokenPodNodeInfo must be enabled",
            },
            {
                "expression": "variables.userNodeName == variables.objectNodeName"
                " || variables.allNodesValue == true || variables.nodeSelectorValue != null",
                "messageExpression": '"this user running on node \'"+variables.userNodeName+"\''
                ' may not modify cluster or node resourceslices"',
            },
        ],
    }
    api = "admissionregistration.k8s.io/v1"
    return [
        {
            "apiVersion": api,
            "kind": "ValidatingAdmissionPolicy",
            "metadata": meta(POLICY, DRA_DRIVER, None),
            "spec": policy,
        },
        {
            "apiVersion": api,
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": meta(POLICY, DRA_DRIVER, None),
            "spec": {"policyName": POLICY, "validationActions": ["Deny"]},
        },
    ]


READ = ["get", "list", "watch"]


def accounts(spec: GPUClusterSpec, ctx: RenderContext) -> list[Manifest]:
    """The plugin's, the controller's and the compute-domain daemons' accounts, with
    upstream's rules."""
    ns, s = ctx.namespace, DRA_DRIVER
    plugin_labels = {**NAME_LABELS, "app.kubernetes.io/component": PLUGIN}
    objs = [service_account(PLUGIN_ACCOUNT, s, ns, plugin_labels)]
    if spec.dra_driver.compute_domains.enabled:
        ctl_labels = {**NAME_LABELS, "app.kubernetes.io/component": CONTROLLER}
        cd_labels = {**NAME_LABELS, "app.kubernetes.io/component": "compute-domain-daemon"}
        objs += [
            service_account(CONTROLLER, s, ns, ctl_labels),
            role(
                "ClusterRole",
                CONTROLLER,
                s,
                None,
                [
                    rule(["resource.nvidia.com"], ["computedomains"], [*READ, "update"]),
                    rule(["resource.nvidia.com"], ["computedomains/status"], ["update"]),
                    rule(
                        ["resource.k8s.io"],
                        ["resourceclaimtemplates"],
                        [*READ, "create", "update", "delete"],
                    ),
                    rule(["coordination.k8s.io"], ["leases"], ["get", "create", "update"]),
                    rule([""], ["nodes"], [*READ, "update"]),
                    rule([""], ["pods"], READ),
                ],
            ),
            role(
                "Role",
                CONTROLLER,
                s,
                ns,
                [
                    rule(["apps"], ["daemonsets"], [*READ, "create", "update", "patch", "delete"]),
                    rule(["resource.nvidia.com"], ["computedomaincliques"], [*READ, "update"]),
                ],
            ),
            binding("ClusterRoleBinding", CONTROLLER, s, None, CONTROLLER, CONTROLLER, ns),
            binding("RoleBinding", CONTROLLER, s, ns, CONTROLLER, CONTROLLER, ns),
            service_account(CD_DAEMON_ACCOUNT, s, ns, cd_labels),
            role(
                "ClusterRole",
                "compute-domain-daemon",
                s,
                None,
                [
                    rule(
                        ["resource.nvidia.com"],
                        ["computedomains", "computedomains/status"],
                        [*READ, "update", "patch"],
                    ),
                    rule(
                        ["resource.nvidia.com"],
                        ["computedomaincliques"],
                        [*READ, "create", "update", "patch"],
                    ),
                    rule([""], ["pods"], [*READ, "patch"]),
                ],
            ),
            binding(
                "ClusterRoleBinding",
                "compute-domain-daemon",
                s,
                None,
                "compute-domain-daemon",
                CD_DAEMON_ACCOUNT,
                ns,
            ),
            role(
                "Role",
                PLUGIN_ACCOUNT,
                s,
                ns,
                [rule(["resource.nvidia.com"], ["computedomaincliques"], ["get"])],
            ),
            binding("RoleBinding", PLUGIN_ACCOUNT, s, ns, PLUGIN_ACCOUNT, PLUGIN_ACCOUNT, ns),
        ]
    if _gate(spec, "MPSSupport"):
        mps = f"{PLUGIN_ACCOUNT}-mps"
        objs += [
            role(
                "Role",
                mps,
                s,
                ns,
                [rule(["apps"], ["deployments"], [*READ, "create", "update", "patch", "delete"])],
            ),
            binding("RoleBinding", mps, s, ns, mps, PLUGIN_ACCOUNT, ns),
        ]
    validation = f"{PLUGIN_ACCOUNT}-driver-validation"
    objs += [
        role("Role", validation, s, ns, [rule(["apps"], ["daemonsets"], ["list"])]),
        binding("RoleBinding", validation, s, ns, validation, PLUGIN_ACCOUNT, ns),
        role(
            "ClusterRole",
            PLUGIN_ACCOUNT,
            s,
            None,
            [
                rule(["resource.nvidia.com"], ["computedomains"], READ),
                rule(["resource.k8s.io"], ["resourceclaims"], READ),
                rule(
                    ["resource.k8s.io"], ["resourceslices"], [*READ, "create", "update", "delete"]
                ),
                rule([""], ["nodes"], [*READ, "update", "patch"]),
                rule([""], ["pods"], READ),
            ],
        ),
        binding("ClusterRoleBinding", PLUGIN_ACCOUNT, s, None, PLUGIN_ACCOUNT, PLUGIN_ACCOUNT, ns),
    ]
    return objs


def render(spec: GPUClusterSpec, ctx: RenderContext) -> list[Manifest]:
    """Every object of the state, for a valid spec (an image error raises ImageRefError)."""
    objs = [*accounts(spec, ctx), *device_classes(spec), kubelet_plugin(spec, ctx)]
    if spec.dra_driver.compute_domains.enabled:
        objs.append(controller(spec, ctx))
    return [*objs, *resourceslice_policy(ctx)]
