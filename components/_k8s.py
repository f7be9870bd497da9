"""Small builders for the Kubernetes objects operands are made of.

Every operand goes through the same helpers so that labels, pod-wide settings from
`spec.daemonsets` and security settings cannot drift between modules.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from components._host_paths import RUN_NVIDIA, VALIDATIONS_DIR, mount, validations_mount
from components.context import Manifest, RenderContext
from components.keys import TAINT_EFFECT, TAINT_KEY
from crd import ClusterPolicySpec, ComponentSpec, EnvVar, ImageSpec

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
PART_OF_LABEL = "app.kubernetes.io/part-of"
COMPONENT_LABEL = "app.kubernetes.io/component"
APP_LABEL = "app"
MANAGED_BY = "gpuop"
PART_OF = "gpu-operator"


def _ours(component: str) -> dict[str, str]:
    return {MANAGED_BY_LABEL: MANAGED_BY, PART_OF_LABEL: PART_OF, COMPONENT_LABEL: component}


def object_labels(component: str, spec: ClusterPolicySpec, ctx: RenderContext) -> dict[str, str]:
    """Metadata labels: the context's, then the policy's, then ours (ours win)."""
    return {**ctx.extra_labels, **spec.daemonsets.labels, **_ours(component)}


def metadata(
    name: str,
    component: str,
    spec: ClusterPolicySpec,
    ctx: RenderContext,
    *,
    namespaced: bool = True,
) -> dict[str, Any]:
    """Object metadata; cluster-scoped objects get no namespace."""
    meta: dict[str, Any] = {"name": name, "labels": object_labels(component, spec, ctx)}
    if namespaced:
        meta["namespace"] = ctx.namespace
    return meta


def config_map(
    name: str, component: str, spec: ClusterPolicySpec, ctx: RenderContext, data: dict[str, str]
) -> Manifest:
    """A ConfigMap of ours holding `data` (layouts, scripts, probes an operand mounts)."""
    meta = metadata(name, component, spec, ctx)
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


def service(
    name: str,
    component: str,
    spec: ClusterPolicySpec,
    ctx: RenderContext,
    *,
    app: str,
    port_name: str,
    port: int,
    scrape: bool = False,
    **fields: Any,
) -> Manifest:
    """A Service for the pods labelled `app=<app>` on one TCP port, itself labelled with
    `app` (what upstream's ServiceMonitors select); `scrape` asks an annotation-driven
    Prometheus to scrape it; `fields` join its spec (type, internalTrafficPolicy)."""
    meta = metadata(name, component, spec, ctx)
    meta["labels"][APP_LABEL] = app
    if scrape:
        meta["annotations"] = {"prometheus.io/scrape": "true"}
    ports = [{"name": port_name, "port": port, "targetPort": port, "protocol": "TCP"}]
    body = {"selector": {APP_LABEL: app}, "ports": ports, **fields}
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": body}


#: Pod labels the policy may not replace, as upstream: `app` is the DaemonSet's selector
#: and `part-of` is how the controller finds operand pods.
_FIXED_POD_LABELS = (APP_LABEL, PART_OF_LABEL)


def pod_labels(app: str, component: str, spec: ClusterPolicySpec) -> dict[str, str]:
    """Pod template labels: ours, then the policy's pod-wide labels, which win (upstream's
    chart sets `managed-by: gpu-operator`) except on `app` and `part-of`. Nothing outside
    `spec.daemonsets` and the operand's own section can restart its pods."""
    policy = {k: v for k, v in spec.daemonsets.labels.items() if k not in _FIXED_POD_LABELS}
    return {APP_LABEL: app, **_ours(component), **policy}


def max_unavailable(value: int | str) -> int | str:
    """Kubernetes int-or-string: a quoted count ("1", upstream's chart style) becomes the
    int it means, the canonical form every API server version reads as a count."""
    return int(value) if isinstance(value, str) and value.isdigit() else value


def rolling_update_strategy(spec: ClusterPolicySpec) -> dict[str, Any]:
    """The operand DaemonSets' update strategy from `spec.daemonsets`."""
    if spec.daemonsets.update_strategy == "OnDelete":
        return {"type": "OnDelete"}
    limit = max_unavailable(spec.daemonsets.rolling_update.max_unavailable)
    return {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": limit}}


#: With health remediation on, operands must still run on a quarantined node: the node
#: agent among them is what reports the GPU healthy again, and a driver or device plugin
#: pod recreated there (an upgrade, a config change) would otherwise wait for a release
#: that can then never come. A dry run taints nothing, so it adds no toleration either:
#: a template change would roll every operand pod and give the driver a new revision.
QUARANTINE_TOLERATION = {"key": TAINT_KEY, "operator": "Exists", "effect": TAINT_EFFECT}


def dump_tolerations(spec: ClusterPolicySpec) -> list[dict[str, Any]]:
    tolerations = [
        t.model_dump(mode="json", by_alias=True, exclude_none=True)
        for t in spec.daemonsets.tolerations
    ]
    remediation = spec.health_remediation
    if (
        remediation is not None
        and remediation.enabled
        and not remediation.dry_run
        and not any(t.get("key") == TAINT_KEY for t in tolerations)
    ):
        tolerations.append(dict(QUARANTINE_TOLERATION))
    return tolerations


def unique(names: Iterable[str]) -> list[str]:
    """Order-preserving de-duplication."""
    return list(dict.fromkeys(names))


def pull_secrets(*groups: Iterable[str] | None) -> list[dict[str, str]]:
    return [{"name": n} for n in unique(n for g in groups if g for n in g)]


_EAGERNESS = {"Never": 0, "IfNotPresent": 1, "Always": 2}


def eager_pull_policy(*policies: str | None) -> str | None:
    """The most eager of `policies` (Always, then IfNotPresent, then Never; a value
    Kubernetes does not know loses to these, and is kept only alone, for the API server
    to judge); None where none is given."""
    given = [p for p in policies if p]
    return max(given, key=lambda p: _EAGERNESS.get(p, -1)) if given else None


def operator_image_pulls(
    pod: Mapping[str, Any],
    ctx: RenderContext,
    policy: str | None,
    secrets: Iterable[str] | None,
) -> dict[str, Any]:
    """`pod` with every container (init or main) that runs the operator image pulling
    it as the administrators asked: `policy` and `secrets` are those of the policy
    section whose image ours replaces there (upstream's `validator.*` for the validator,
    the sandbox validator and the operands' `*-validation` init containers;
    `nodeStatusExporter.*` for the node status exporter; a GPUCluster's `draDriver.*`),
    the operator's own are the context's (the chart's `operator.imagePullPolicy` and
    `operator.imagePullSecrets`).

    Such a container gets the more eager of the two pull policies (none where neither is
    set: the API server's default); the pod keeps its own secrets first, in their order,
    then the section's, then the operator's, each once. A pod that does not run the
    operator image is returned as it is."""
    image = ctx.operator_image
    if not any(
        ctr.get("image") == image
        for ctr in (*pod.get("initContainers", ()), *pod.get("containers", ()))
    ):
        return dict(pod)
    chosen = eager_pull_policy(policy, ctx.operator_image_pull_policy)

    def pulled(ctr: dict[str, Any]) -> dict[str, Any]:
        if ctr.get("image") != image:
            return ctr
        result = {k: v for k, v in ctr.items() if k != "imagePullPolicy"}
        if chosen:
            result["imagePullPolicy"] = chosen
        return result

    result = dict(pod)
    for key in ("initContainers", "containers"):
        if key in pod:
            result[key] = [pulled(ctr) for ctr in pod[key]]
    own = [s["name"] for s in pod.get("imagePullSecrets") or ()]
    names = pull_secrets(own, secrets, ctx.operator_image_pull_secrets)
    if names:
        result["imagePullSecrets"] = names
    else:
        result.pop("imagePullSecrets", None)
    return result


def daemonset(
    name: str,
    component: str,
    spec: ClusterPolicySpec,
    ctx: RenderContext,
    pod_spec: dict[str, Any],
    *,
    node_selector: Mapping[str, str],
    update_strategy: dict[str, Any] | None = None,
    pod_annotations: Mapping[str, str] | None = None,
    host_network: bool | None = None,
    selector_labels: Mapping[str, str] | None = None,
    selector_key: str = APP_LABEL,
    grace_period: int | None = None,
    replaced_image: ImageSpec | None = None,
) -> Manifest:
    """A DaemonSet selecting `app=<name>` (`<selector_key>=<name>` where upstream's
    selects on another key, its pods then without `app`; and `selector_labels`, which
    its pods carry too), with the policy's pod-wide settings applied:
    `spec.daemonsets.podSecurityContext` on every operand pod, and `host_network` (the
    operand section's `hostNetwork`) as upstream's `applyHostNetworkConfig` does it.
    `grace_period`: the pods' terminationGracePeriodSeconds, where not the default.
    `replaced_image`: the section whose image the pods' operator-image containers stand
    in for, whose pull keys they honour with the operator's (`operator_image_pulls`):
    `spec.validator` unless said (upstream runs its validator image in each operand's
    validation init containers).

    The selector is immutable: it is upstream's for each DaemonSet, so that gpuop adopts
    the DaemonSets NVIDIA's operator created in place (see `Applier` for the ones
    that still need replacing).
    """
    labels = {**pod_labels(name, component, spec), **(selector_labels or {})}
    if selector_key != APP_LABEL:
        del labels[APP_LABEL]
        labels = {selector_key: name, **labels}
    annotations = {**spec.daemonsets.annotations, **(pod_annotations or {})}
    template_meta: dict[str, Any] = {"labels": labels}
    if annotations:
        template_meta["annotations"] = annotations
    replaced = spec.validator if replaced_image is None else replaced_image
    full_pod: dict[str, Any] = {
        **operator_image_pulls(
            pod_spec, ctx, replaced.image_pull_policy, replaced.image_pull_secrets
        ),
        "nodeSelector": dict(node_selector),
        "tolerations": dump_tolerations(spec),
        "priorityClassName": spec.daemonsets.priority_class_name,
    }
    if not full_pod.get("imagePullSecrets"):
        full_pod.pop("imagePullSecrets", None)
    security = spec.daemonsets.pod_security_context
    if security is not None and (dumped := dump_model(security)):
        full_pod["securityContext"] = dumped
    if host_network:
        use_host_network(full_pod)
    if grace_period is not None:
        full_pod["terminationGracePeriodSeconds"] = grace_period
    meta = metadata(name, component, spec, ctx)
    # Upstream labels the DaemonSet itself `app=<name>` too: `kubectl get ds -l app=...`
    # finds ours as it found NVIDIA's.
    meta["labels"] = {APP_LABEL: name, **meta["labels"]}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": meta,
        "spec": {
            "selector": {"matchLabels": {selector_key: name, **(selector_labels or {})}},
            "updateStrategy": update_strategy or rolling_update_strategy(spec),
            "template": {"metadata": template_meta, "spec": full_pod},
        },
    }


def use_host_network(pod: dict[str, Any]) -> None:
    """Put `pod` in the node's network namespace; cluster DNS must then be asked for
    explicitly (ClusterFirstWithHostNet), or the pod would resolve with the node's."""
    pod["hostNetwork"] = True
    pod["dnsPolicy"] = "ClusterFirstWithHostNet"


def dump_model(model: BaseModel) -> dict[str, Any]:
    """A CRD model as the API writes it (camelCase, unset fields left out)."""
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


NRI_ANNOTATION_DOMAIN = "nvidia.cdi.k8s.io"
MANAGEMENT_CDI_DEVICE = "management.nvidia.com/gpu=all"


def gpu_access(
    spec: ClusterPolicySpec, container_name: str
) -> tuple[dict[str, Any], dict[str, str]]:
    """How an operand container reaches every GPU: pod-spec fields and pod annotations.

    Normally through the `nvidia` RuntimeClass; with `cdi.nriPluginEnabled` the
    toolkit's NRI plugin injects the management CDI device named by an annotation
    instead, and no RuntimeClass is asked for (the runtime's config is not edited)."""
    if spec.cdi.nri_plugin_enabled:
        key = f"{NRI_ANNOTATION_DOMAIN}/container.{container_name}"
        return {}, {key: MANAGEMENT_CDI_DEVICE}
    return {"runtimeClassName": spec.operator.runtime_class}, {}


def env(name: str, value: str) -> dict[str, Any]:
    return {"name": name, "value": value}


def field_env(name: str, path: str) -> dict[str, Any]:
    """An environment variable from the downward API (`spec.nodeName`, `metadata.uid`)."""
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def dump_env(variables: Sequence[EnvVar] | None) -> list[dict[str, Any]]:
    return [v.model_dump(mode="json", by_alias=True, exclude_none=True) for v in variables or ()]


def merge_env(*groups: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Later groups override earlier ones by name (the user's env comes last)."""
    merged: dict[str, dict[str, Any]] = {}
    for group in groups:
        for var in group:
            merged.pop(var["name"], None)
            merged[var["name"]] = var
    return list(merged.values())


def container(
    name: str,
    image: str,
    section: ImageSpec,
    *,
    command: list[str] | None = None,
    args: Sequence[str] = (),
    env_vars: Sequence[dict[str, Any]] = (),
    mounts: Sequence[dict[str, Any]] = (),
    privileged: bool = False,
    root: bool = False,
    selinux_s0: bool = False,
    section_args: bool = True,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A container; a ComponentSpec section adds its args, env and resources. `root` runs
    it as uid 0 whatever the image's user is (ours runs as 65532 by default, which cannot
    write host paths such as /run/nvidia/validations). `selinux_s0`: see
    `security_context`."""
    user_args: list[str] = []
    user_env: list[dict[str, Any]] = []
    resources: dict[str, Any] | None = None
    if isinstance(section, ComponentSpec):
        user_args = list(section.args or ()) if section_args else []
        user_env = dump_env(section.env)
        if section.resources is not None:
            resources = section.resources.model_dump(mode="json", exclude_none=True)
    result: dict[str, Any] = {
        "name": name,
        "image": image,
        "imagePullPolicy": section.image_pull_policy,
    }
    if command:
        result["command"] = command
    all_args = [*args, *user_args]
    if all_args:
        result["args"] = all_args
    all_env = merge_env(env_vars, user_env)
    if all_env:
        result["env"] = all_env
    if resources:
        result["resources"] = resources
    if mounts:
        result["volumeMounts"] = list(mounts)
    if privileged or root or selinux_s0:
        result["securityContext"] = security_context(
            privileged=privileged, root=root, selinux_s0=selinux_s0
        )
    result.update(extra or {})
    return result


def security_context(
    *, privileged: bool = True, root: bool = False, selinux_s0: bool = False
) -> dict[str, Any]:
    """`selinux_s0` gives the container SELinux level s0, as upstream does for the driver,
    the toolkit and the driver check: on an enforcing node (RHEL, Rocky) the default
    per-pod MCS level keeps them from loading modules, writing the runtime's config and
    linking /dev/char."""
    context: dict[str, Any] = {}
    if privileged:
        context["privileged"] = True
    if root:
        context["runAsUser"] = 0
    if selinux_s0:
        context["seLinuxOptions"] = {"level": "s0"}
    return context


TOOLKIT_READY = f"{VALIDATIONS_DIR}/toolkit-ready"
STACK_MESSAGE = "waiting for nvidia container stack to be setup"


def wait_for_file(
    ctx: RenderContext,
    name: str,
    path: str,
    *,
    message: str = STACK_MESSAGE,
    whole_run_nvidia: bool = False,
) -> dict[str, Any]:
    """Init container holding an operand back until an earlier layer wrote its status file.

    Runs the operator image because operand images may be distroless (no shell), as root
    and privileged like upstream's (a non-root user may not see root-only host paths);
    `daemonset` gives it its pull policy and the pod its pull secrets
    (`operator_image_pulls`: upstream's validator image ran here).
    It mounts `/run/nvidia` (volume `run-nvidia`) or only the validations directory
    (volume `run-nvidia-validations`), as upstream's init container for that operand."""
    script = f"until [ -f {path} ]; do echo {message}; sleep 5; done"
    volume = (
        mount("run-nvidia", RUN_NVIDIA, propagation="HostToContainer")
        if whole_run_nvidia
        else validations_mount("HostToContainer")
    )
    return {
        "name": name,
        "image": ctx.operator_image,
        "command": ["sh", "-c"],
        "args": [script],
        "securityContext": security_context(privileged=True, root=True),
        "volumeMounts": [volume],
    }


def with_app_label(obj: Manifest, app: str) -> Manifest:
    """`obj` also labelled `app=<app>`: upstream labels an operand's ConfigMaps (and the
    exporters' RBAC) with the operand's name, so `kubectl get -l app=...` finds ours."""
    meta = obj["metadata"]
    return {**obj, "metadata": {**meta, "labels": {APP_LABEL: app, **meta.get("labels", {})}}}
