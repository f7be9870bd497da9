"""`gpuop doctor`'s rules: known signatures in a :class:`Snapshot` of the cluster, each
mapped to a cause and a fix with the objects that show it. Pure; the answer to "why is
the policy notReady, why do pods wait in Init" (NVIDIA/gpu-operator#161, #487, #667,
#901), which upstream leaves to a must-gather script and the reader.

The rules over the API's objects work on a live cluster as on a bundle; those over
containers' lines (``doctor_signatures``) need logs, which only a real node serves.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from components.context import runtime_name
from components.keys import GPU_PRESENT_LABEL
from crd import REASON_NFD_LABELS_MISSING
from gpuop.admin_cli.doctor_facts import (
    DRIVER_MANAGER,
    Finding,
    Obj,
    Snapshot,
    container_statuses,
    excerpts,
    is_driver_pod,
)
from gpuop.admin_cli.doctor_signatures import in_use_lines, signature_findings

NFD_LABELS = (
    "feature.node.kubernetes.io/pci-10de.present",
    "feature.node.kubernetes.io/pci-0302_10de.present",
    "feature.node.kubernetes.io/pci-0300_10de.present",
)
PULL_REASONS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")
_TAG_MISSING = re.compile(
    r"not found|manifest unknown|no such manifest|does not exist|NotFound", re.IGNORECASE
)
_REFUSED = re.compile(r"unauthorized|authentication required|denied|forbidden|\b40[13]\b", re.I)
SECTIONS = (
    ("nvidia-driver-daemonset", "driver"),
    ("nvidia-vgpu-manager-daemonset", "vgpuManager"),
    ("nvidia-container-toolkit-daemonset", "toolkit"),
    ("nvidia-device-plugin-daemonset", "devicePlugin"),
    ("nvidia-dcgm-exporter", "dcgmExporter"),
    ("nvidia-dcgm", "dcgm"),
    ("gpu-feature-discovery", "gfd"),
    ("nvidia-mig-manager", "migManager"),
    ("nvidia-operator-validator", "validator"),
    ("nvidia-node-status-exporter", "nodeStatusExporter"),
)
"""Pod ``app`` label (a DaemonSet's name, or its prefix) to the policy section."""
TOOLKIT_APP = "nvidia-container-toolkit-daemonset"
NO_NVIDIA_HANDLER = re.compile(
    r'no runtime for "?nvidia"? is configured|RuntimeHandler "?nvidia"? not supported'
    r'|unknown runtime handler "?nvidia',
    re.IGNORECASE,
)
NODE_METRICS = "gpu_operator_node_"
"""The node status exporter's metrics: rules over them never fire without it."""
ALERT_RULES_CONFIG_MAP = "gpu-operator-alert-rules"
"""The chart's rule file for a Prometheus without the Prometheus Operator (every group,
the node ones included: ``monitoring.alertRules.configMap``)."""


def _ref(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


def _some(names: list[str], most: int = 5) -> list[str]:
    return names[:most] + ([f"{len(names) - most} more"] if len(names) > most else [])


def _section(pod: Obj, container: str) -> str:
    if container == DRIVER_MANAGER:
        return "driver.manager"
    app = str((pod["metadata"].get("labels") or {}).get("app") or pod["metadata"]["name"])
    return next((section for prefix, section in SECTIONS if app.startswith(prefix)), "<section>")


# ----------------------------------------------------------------- driver in use
def _manager_failing(pod: Obj) -> bool:
    """The driver manager has failed at least once and not yet succeeded."""
    for status in container_statuses(pod):
        if status.get("name") != DRIVER_MANAGER:
            continue
        state = status.get("state") or {}
        done = (state.get("terminated") or {}).get("exitCode") == 0
        last = (status.get("lastState") or {}).get("terminated") or {}
        return not done and (int(status.get("restartCount") or 0) > 0 or bool(last))
    return False


def driver_in_use(snapshot: Snapshot) -> list[Finding]:
    """A driver pod whose manager cannot unload the old driver, with pods holding GPUs
    on its node (or its own words that the driver is in use)."""
    said = in_use_lines(snapshot)
    findings = []
    for pod in snapshot.pods or []:
        name = pod["metadata"]["name"]
        node = (pod.get("spec") or {}).get("nodeName")
        if not is_driver_pod(pod) or not node:
            continue
        holders = [
            f"pod/{p['namespace']}/{p['name']}"
            for p in snapshot.gpu_pods or []
            if p.get("node") == node and p.get("phase") in ("Running", "Pending", None)
        ]
        if name not in said and not (holders and _manager_failing(pod)):
            continue
        held = f": {len(holders)} pod(s) hold its GPUs" if holders else ""
        why = f" ({said[name]})" if name in said else ""
        findings.append(
            Finding(
                "driver-in-use",
                f"the driver on node {node} cannot be unloaded for the new one{held}; the"
                f" driver pod waits in Init{why}",
                "stop or move the GPU pods on the node, or let the driver manager evict"
                " them (driver.manager.env ENABLE_GPU_POD_EVICTION=true, ENABLE_AUTO_DRAIN"
                "=true); with driver.upgradePolicy.autoUpgrade the operator does it:"
                f" kubectl label node {node} nvidia.com/gpu-driver-upgrade-state="
                "upgrade-required --overwrite",
                (f"node/{node}", f"pod/{snapshot.namespace}/{name}", *_some(holders)),
            )
        )
    return findings


# ----------------------------------------------------------------- image pulls
def image_pulls(snapshot: Snapshot) -> list[Finding]:
    """Containers waiting for an image: one finding per image (its pods and nodes)."""
    waiting: dict[str, list[tuple[Obj, Obj]]] = {}
    for pod in snapshot.pods or []:
        specs = {
            c["name"]: c
            for c in [*(pod["spec"].get("initContainers") or []), *pod["spec"]["containers"]]
        }
        for status in container_statuses(pod):
            reason = ((status.get("state") or {}).get("waiting") or {}).get("reason")
            if reason in PULL_REASONS:
                image = str(specs.get(status["name"], {}).get("image") or status.get("image"))
                waiting.setdefault(image, []).append((pod, status))
    findings = []
    for image, found in sorted(waiting.items()):
        pod, status = found[0]
        message = str(((status.get("state") or {}).get("waiting") or {}).get("message") or "")
        section = _section(pod, str(status["name"]))
        pods = sorted({f"pod/{_ref(p)}" for p, _ in found})
        nodes = sorted(
            {f"node/{p['spec']['nodeName']}" for p, _ in found if p["spec"].get("nodeName")}
        )
        objects = (f"image/{image}", *_some(pods), *_some(nodes))
        if _TAG_MISSING.search(message):
            fix = (
                f"set {section}.version to a tag the registry has, or mirror this one"
                f" ({section}.repository for a private registry)"
            )
            if section == "driver":
                fix = (
                    "the driver's tag is driver.version plus the node's OS (precompiled:"
                    " branch, kernel and OS): set driver.version to one published for"
                    " these nodes' OS, or mirror the tag (driver.repository)"
                )
            findings.append(
                Finding("missing-tag", f"the registry has no image {image}", fix, objects)
            )
        elif _REFUSED.search(message):
            findings.append(
                Finding(
                    "image-pull-refused",
                    f"the registry refuses to serve {image} to the nodes",
                    f"give the pods a pull secret ({section}.imagePullSecrets, a Secret in"
                    f" {snapshot.namespace}) or mirror the image ({section}.repository)",
                    objects,
                )
            )
        else:
            detail = f": {' '.join(message.split())[:160]}" if message else ""
            findings.append(
                Finding(
                    "image-pull-failed",
                    f"the nodes cannot pull {image}{detail}",
                    "check the nodes reach the registry (proxy, DNS, firewall) or mirror"
                    f" the image ({section}.repository)",
                    objects,
                )
            )
    return findings


# ----------------------------------------------------------------- toolkit
def toolkit_runtime(snapshot: Snapshot) -> list[Finding]:
    """The toolkit configures a runtime the node does not run, or pods cannot start
    because the node's runtime has no ``nvidia`` handler."""
    runtimes = {
        n["name"]: runtime_name((n.get("nodeInfo") or {}).get("containerRuntimeVersion"))
        for n in snapshot.nodes or []
    }
    findings = []
    for pod in snapshot.pods or []:
        if (pod["metadata"].get("labels") or {}).get("app") != TOOLKIT_APP:
            continue
        node = pod["spec"].get("nodeName")
        configured = next(
            (
                str(e.get("value"))
                for c in pod["spec"]["containers"]
                for e in c.get("env") or []
                if e.get("name") == "RUNTIME" and e.get("value")
            ),
            None,
        )
        actual = runtimes.get(node) if node else None
        if configured and actual and configured != actual:
            findings.append(
                Finding(
                    "toolkit-runtime-mismatch",
                    f"the container toolkit configures {configured} but node {node} runs"
                    f" {actual}: its pods get no nvidia runtime",
                    "run one container runtime on every GPU node (the toolkit configures"
                    " containerd when any GPU node runs it), or keep this node out"
                    " (label nvidia.com/gpu.deploy.container-toolkit=false) and configure"
                    " its runtime by hand",
                    (f"node/{node}", f"pod/{_ref(pod)}"),
                )
            )
    texts = [(f"pod/{snapshot.namespace}/{ex.pod}", ex.text) for ex in excerpts(snapshot)]
    for event in snapshot.events or []:
        about = event.get("involvedObject") or {}
        ns = f"{about['namespace']}/" if about.get("namespace") else ""
        name = f"{str(about.get('kind') or 'object').lower()}/{ns}{about.get('name')}"
        texts.append((name, str(event.get("message") or "")))
    refused = sorted({name for name, text in texts if NO_NVIDIA_HANDLER.search(text)})
    if refused:
        findings.append(
            Finding(
                "toolkit-runtime-mismatch",
                "pods cannot start: the node's container runtime has no nvidia handler"
                " (the toolkit has not configured the runtime the node runs)",
                "check the toolkit pod on those nodes runs and is Ready; where the runtime"
                " reads another config file, point toolkit.env CONTAINERD_CONFIG (or"
                " CRIO_CONFIG) at it and restart the runtime",
                tuple(_some(refused)),
            )
        )
    return findings


# ----------------------------------------------------------------- NFD, monitoring
def nfd_labels(snapshot: Snapshot) -> list[Finding]:
    """The policy says NFD labels are missing, or no node carries one."""
    policy = snapshot.active_policy()
    if policy is None:
        return []
    conditions = (policy.get("status") or {}).get("conditions") or []
    said = any(c.get("reason") == REASON_NFD_LABELS_MISSING for c in conditions)
    nodes = snapshot.nodes or []
    unlabelled = bool(nodes) and not any(
        (n.get("labels") or {}).get(k) == "true"
        for n in nodes
        for k in (*NFD_LABELS, GPU_PRESENT_LABEL)
    )
    if not said and not unlabelled:
        return []
    return [
        Finding(
            "nfd-labels-missing",
            f"no node carries Node Feature Discovery's PCI label {NFD_LABELS[0]}=true, so"
            " the operator sees no GPU node and deploys nothing",
            "run NFD (the chart's nfd.enabled=true, or check the NFD worker runs on the GPU"
            " nodes and lists PCI vendor 10de)",
            (f"clusterpolicy/{policy['metadata']['name']}",),
        )
    ]


def _node_alert_sources(snapshot: Snapshot) -> list[str]:
    found = []
    for rule in snapshot.prometheus_rules or []:
        for group in (rule.get("spec") or {}).get("groups") or []:
            alerts = [
                r for r in group.get("rules") or [] if NODE_METRICS in str(r.get("expr") or "")
            ]
            if alerts:
                found.append(f"prometheusrule/{_ref(rule)}")
                break
    if ALERT_RULES_CONFIG_MAP in (snapshot.configmaps or []):
        found.append(f"configmap/{snapshot.namespace}/{ALERT_RULES_CONFIG_MAP}")
    return found


def node_status_exporter(snapshot: Snapshot) -> list[Finding]:
    """Alert rules over the node status exporter's metrics, with the exporter off."""
    policy = snapshot.active_policy()
    if policy is None:
        return []
    enabled = ((policy.get("spec") or {}).get("nodeStatusExporter") or {}).get("enabled")
    sources = _node_alert_sources(snapshot)
    if enabled is True or not sources:
        return []
    return [
        Finding(
            "node-status-exporter-off",
            "alert rules read the node status exporter's gpu_operator_node_* metrics but"
            " the exporter is off: GPUOperatorGPULost and the node deployment alerts can"
            " never fire",
            "turn it on (nodeStatusExporter.enabled=true) or drop those rules",
            (f"clusterpolicy/{policy['metadata']['name']}", *sources),
        )
    ]


Rule = Callable[[Snapshot], list[Finding]]
RULES: tuple[Rule, ...] = (
    nfd_labels,
    image_pulls,
    driver_in_use,
    signature_findings,
    toolkit_runtime,
    node_status_exporter,
)


def diagnose(snapshot: Snapshot, rules: Iterable[Rule] = RULES) -> list[Finding]:
    """Every finding of every rule, in the rules' order (roughly: the layer below first)."""
    return [finding for rule in rules for finding in rule(snapshot)]
