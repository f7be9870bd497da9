"""An operand as one declaration, and the one function that renders every operand.

A node operand is the same skeleton each time: a ServiceAccount with its Role (and
ClusterRole, where it reads cluster-scoped objects), maybe some objects of its own, and
a DaemonSet running its pod as that account on the nodes its deploy label selects, with
the policy section's pull secrets and host networking. `Operand` says what differs (its
names, section, rules, placement and pod); `render` builds the rest the same way for
all, and `Operand.component` is what the registry lists. Adding an operand is its
module (an `Operand` and the function building its pod), its spec class and one
registry line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from components._accounts import SCC_RULE, cluster_role_and_binding, operand_account
from components._k8s import APP_LABEL, container, daemonset, gpu_access, pull_secrets, service
from components.component import (
    CONTAINER_ONLY,
    Component,
    NodeFilter,
    ObjectKind,
    Permissions,
    Placement,
    Rule,
    every_gpu_node,
)
from components.context import Manifest, RenderContext
from components.keys import TRUE
from components.kinds import CLUSTER_RBAC, DAEMONSET, NAMESPACED_RBAC, SERVICE
from crd import ClusterPolicySpec, ComponentSpec, component_image, section_at

Objects = Callable[[ClusterPolicySpec, RenderContext], list[Manifest]]
"""Objects an operand renders beside its account, DaemonSet and Service (ConfigMaps,
ServiceMonitors)."""


@dataclass(frozen=True)
class Pod:
    """What is an operand's own in its pod; `render` adds the account, the pull
    secrets, GPU access, host networking and the policy's pod-wide settings."""

    containers: list[dict[str, Any]]
    init: list[dict[str, Any]] = field(default_factory=list)
    volumes: list[dict[str, Any]] = field(default_factory=list)
    fields: Mapping[str, Any] = field(default_factory=dict)
    """Further pod spec fields (hostPID...); they win over `render`'s."""
    annotations: Mapping[str, str] = field(default_factory=dict)
    pull_secrets: Sequence[str] | None = None
    """Pulled after the section's own (a driver manager init container's image)."""


PodBuild = Callable[[ClusterPolicySpec, RenderContext], Pod | None]
"""An operand's pod under a policy; None: enabled, but nothing to run yet."""


@dataclass(frozen=True)
class Grant:
    """A ClusterRole (and its binding to the operand's account) beside the account's
    own, rendered only where `when` says the policy needs it."""

    name: str
    rules: tuple[Rule, ...]
    when: Callable[[ClusterPolicySpec], bool]


def _none(_spec: ClusterPolicySpec, _ctx: RenderContext) -> list[Manifest]:
    return []


def _no_fields(_spec: ClusterPolicySpec) -> Mapping[str, Any]:
    return {}


@dataclass(frozen=True)
class Port:
    """The operand's Service: named as its DaemonSet (as upstream's), in front of its
    pods, on one TCP port."""

    name: str
    number: int
    scrape: bool = False
    """Ask an annotation-driven Prometheus to scrape it."""
    fields: Callable[[ClusterPolicySpec], Mapping[str, Any]] = _no_fields
    """Further Service spec fields under a policy (type, internalTrafficPolicy)."""


@dataclass(frozen=True)
class Operand:
    """One node operand: everything the operator needs to render, place and grant it."""

    name: str
    """Rollout state name (upstream's), also the `app.kubernetes.io/component` label."""
    section: str
    """Its ClusterPolicy section (wire name): switch, pull secrets, `hostNetwork`."""
    daemonset: str
    deploy_label: str | None
    """The node label its DaemonSet selects (`true`), if it owns one."""
    pod: PodBuild
    account: str = ""
    """Its ServiceAccount, and its Role's and ClusterRole's name; by default its
    DaemonSet's without `-daemonset`, as upstream names nearly all of them."""
    enabled: Callable[[ClusterPolicySpec], bool] | None = None
    """Whether the policy switches it on; None: its section's `enabled`."""
    placement: Placement = CONTAINER_ONLY
    eligible: NodeFilter = every_gpu_node
    role: tuple[Rule, ...] = (SCC_RULE,)
    """Its Role's rules (every operand may use OpenShift's privileged SCC)."""
    cluster: tuple[Rule, ...] = ()
    """Its ClusterRole's rules; none: no ClusterRole."""
    grants: tuple[Grant, ...] = ()
    service: Port | None = None
    before: Objects = _none
    """Objects between its account and its DaemonSet (ConfigMaps it mounts)."""
    after: Objects = _none
    """Objects after its DaemonSet and Service (ServiceMonitors, alert rules)."""
    kinds: tuple[ObjectKind, ...] = ()
    """The kinds `before` and `after` may render."""
    gpu_container: str | None = None
    """The container given every GPU (`gpu_access`), if any."""
    node_selector: Mapping[str, str] | None = None
    """Where not `{deploy_label: true}` (the MPS daemon's)."""
    selector_key: str = APP_LABEL
    selector_labels: Mapping[str, str] | None = None
    labelled_account: bool = False
    """Label the account and its Role `app=<account>`, as upstream's exporters'."""
    own_image_pulls: bool = False
    """Its operator-image containers pull as its own section says, not `validator`'s."""
    grace_period: int | None = None

    def __post_init__(self) -> None:
        if not self.account:
            object.__setattr__(self, "account", self.daemonset.removesuffix("-daemonset"))

    def component(self) -> Component:
        """What the registry lists and the rest of the operator reads."""
        has_cluster_role = bool(self.cluster or self.grants)
        return Component(
            name=self.name,
            deploy_label=self.deploy_label,
            is_enabled=self.enabled or partial(switched_on, self.section),
            render=partial(render, self),
            kinds=(
                *NAMESPACED_RBAC,
                *(CLUSTER_RBAC if has_cluster_role else ()),
                *self.kinds,
                DAEMONSET,
                *((SERVICE,) if self.service else ()),
            ),
            permissions=Permissions(
                role=self.role, cluster=(*self.cluster, *(r for g in self.grants for r in g.rules))
            ),
            eligible=self.eligible,
            placement=self.placement,
            cluster_roles=(
                *((self.account,) if self.cluster else ()),
                *(g.name for g in self.grants),
            ),
        )


def section_of(spec: ClusterPolicySpec, path: str) -> ComponentSpec:
    """The policy section of an operand, by wire path (`vfioManager`)."""
    found = section_at(spec, path)
    if not isinstance(found, ComponentSpec):
        raise KeyError(path)
    return found


def main_container(name: str, spec: ClusterPolicySpec, path: str, **options: Any) -> dict[str, Any]:
    """An operand's own container: the image of its section at `path`, with that
    section's args, env and resources (`container` takes `options`)."""
    return container(name, component_image(spec, path), section_of(spec, path), **options)


def switched_on(path: str, spec: ClusterPolicySpec) -> bool:
    """The `enabled` of the policy section at `path`."""
    found = section_at(spec, path)
    return isinstance(found, ComponentSpec) and found.enabled


def render(op: Operand, spec: ClusterPolicySpec, ctx: RenderContext) -> list[Manifest]:
    """The operand's account and RBAC, its `before` objects, its DaemonSet and Service,
    then its `after` objects; nothing while its pod has nothing to run."""
    pod = op.pod(spec, ctx)
    if pod is None:
        return []
    cluster = list(op.cluster) or None
    app = op.account if op.labelled_account else None
    objects = operand_account(op.account, op.name, spec, ctx, list(op.role), cluster, app=app)
    for grant in op.grants:
        if grant.when(spec):
            rules = list(grant.rules)
            objects += cluster_role_and_binding(
                grant.name, op.name, spec, ctx, rules, account=op.account
            )
    objects += [*op.before(spec, ctx), _daemonset(op, spec, ctx, pod)]
    if op.service is not None:
        objects.append(_service(op, op.service, spec, ctx))
    return [*objects, *op.after(spec, ctx)]


def _service(op: Operand, port: Port, spec: ClusterPolicySpec, ctx: RenderContext) -> Manifest:
    return service(
        op.daemonset,
        op.name,
        spec,
        ctx,
        app=op.daemonset,
        port_name=port.name,
        port=port.number,
        scrape=port.scrape,
        **port.fields(spec),
    )


def _daemonset(op: Operand, spec: ClusterPolicySpec, ctx: RenderContext, pod: Pod) -> Manifest:
    own = section_of(spec, op.section)
    runtime, nri = gpu_access(spec, op.gpu_container) if op.gpu_container else ({}, {})
    body: dict[str, Any] = {"serviceAccountName": op.account, **runtime, **pod.fields}
    if pod.init:
        body["initContainers"] = pod.init
    body["containers"] = pod.containers
    body["imagePullSecrets"] = pull_secrets(own.image_pull_secrets, pod.pull_secrets)
    body["volumes"] = pod.volumes
    return daemonset(
        op.daemonset,
        op.name,
        spec,
        ctx,
        body,
        node_selector=op.node_selector or {str(op.deploy_label): TRUE},
        pod_annotations={**pod.annotations, **nri},
        host_network=own.host_network,
        selector_labels=op.selector_labels,
        selector_key=op.selector_key,
        grace_period=op.grace_period,
        replaced_image=own if op.own_image_pulls else None,
    )
