"""The common shape of an operand: everything the rest of the operator derives from it.

The registry lists one `Component` per rollout state; a node operand's is made from its
`components.operand.Operand` declaration, the others' (the driver, the RuntimeClasses,
the operator's metrics) by hand. The rollout order, the deploy labels, the kinds the
controller watches and prunes, the permissions the chart must hold for the operator and
the ClusterRoles it may write are all read from these declarations.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from components.context import Manifest, RenderContext
from components.keys import CONTAINER_WORKLOAD, VM_PASSTHROUGH_WORKLOAD, VM_VGPU_WORKLOAD
from crd import ClusterPolicySpec

Render = Callable[[ClusterPolicySpec, RenderContext], list[Manifest]]
NodeFilter = Callable[[Mapping[str, str]], bool]
"""Over a GPU node's labels: whether the node gets the operand's deploy label."""
Rule = dict[str, list[str]]
"""A Kubernetes PolicyRule: apiGroups, resources, verbs (and resourceNames, if any)."""


def rule(group: str, resources: str, verbs: str) -> Rule:
    """A PolicyRule on one API group, `resources` and `verbs` each space-separated (the
    operand roles' rules are many and short: one line each)."""
    return {"apiGroups": [group], "resources": resources.split(), "verbs": verbs.split()}


@dataclass(frozen=True)
class ObjectKind:
    """A Kubernetes kind: enough to list, watch, write and prune it. The one kind type:
    operands declare theirs here, `gpuop.kube.kinds` adds the operator's own."""

    api_version: str
    kind: str
    plural: str
    namespaced: bool = True
    optional: bool = False
    """Served only where a CRD installs it (the Prometheus operator's ServiceMonitor):
    watched only once discovery finds the API, never listed where it is absent."""

    @property
    def group(self) -> str:
        """The API group (`""` for the core group), as RBAC rules name it."""
        return self.api_version.rpartition("/")[0]


@dataclass(frozen=True)
class Permissions:
    """What an operand's pods may do: the rules of its Role (in the operator namespace)
    and of its ClusterRole. The operator must hold each of them too, because Kubernetes
    lets it grant only what it holds (the chart's RBAC is checked against these)."""

    role: tuple[Rule, ...] = ()
    cluster: tuple[Rule, ...] = ()


def every_gpu_node(_labels: Mapping[str, str]) -> bool:
    """The default eligibility: the deploy label goes on every GPU node, as upstream."""
    return True


@dataclass(frozen=True)
class Placement:
    """Which GPU workloads (`nvidia.com/gpu.workload.config`) a deploy label goes with,
    as upstream's per-workload label sets: a node serving containers gets the container
    stack's, a VM host the sandbox operands' (never both, so the NVIDIA driver and
    vfio-pci never claim one GPU together)."""

    workloads: frozenset[str] = frozenset({CONTAINER_WORKLOAD})
    passthrough_mode: str | None = None
    """On vm-passthrough nodes, only in this `sandboxWorkloads.mode` (the KubeVirt and
    the Kata device plugins); None: in every mode."""

    def applies(self, workload: str, mode: str) -> bool:
        """Whether a node of `workload` gets the label under sandbox `mode`."""
        if workload not in self.workloads:
            return False
        return workload != VM_PASSTHROUGH_WORKLOAD or self.passthrough_mode in (None, mode)


CONTAINER_ONLY = Placement()
"""The container stack (driver, toolkit, device plugin, ...): the default."""
VM_HOSTS = Placement(frozenset({VM_PASSTHROUGH_WORKLOAD, VM_VGPU_WORKLOAD}))
PASSTHROUGH_ONLY = Placement(frozenset({VM_PASSTHROUGH_WORKLOAD}))
VGPU_ONLY = Placement(frozenset({VM_VGPU_WORKLOAD}))
EVERY_WORKLOAD = Placement(
    frozenset({CONTAINER_WORKLOAD, VM_PASSTHROUGH_WORKLOAD, VM_VGPU_WORKLOAD})
)


@dataclass(frozen=True)
class Component:
    """One operand, that is one rollout state of the operator.

    `objects` is empty when the component is disabled, or when it is enabled but has
    nothing to run yet (the MIG manager with no MIG-capable node); either way the
    controller deletes whatever of the component is left and does not wait on it.
    Its position in the rollout is its place in `components.registry.COMPONENTS`.
    """

    name: str
    """Rollout state name (upstream's), also the `app.kubernetes.io/component` label."""
    deploy_label: str | None
    """Node label that selects the nodes its DaemonSet runs on, if it owns one."""
    is_enabled: Callable[[ClusterPolicySpec], bool]
    render: Render
    kinds: tuple[ObjectKind, ...]
    """Every kind `render` may return (a unit test holds it to that)."""
    permissions: Permissions = field(default_factory=Permissions)
    """The RBAC rules its own Role and ClusterRole grant its pods."""
    eligible: NodeFilter = every_gpu_node
    """Which GPU nodes carry `deploy_label` (the MIG manager's: MIG-capable ones)."""
    placement: Placement = CONTAINER_ONLY
    """Which nodes' workloads carry `deploy_label` (see `components.labels.node_workload`)."""
    cluster_roles: tuple[str, ...] = ()
    """The names of the ClusterRoles (and their bindings) `render` may return: the
    operator may write only these (the chart's list is generated from the registry)."""

    def enabled(self, spec: ClusterPolicySpec) -> bool:
        """Whether the policy switches this component on."""
        return self.is_enabled(spec)

    def objects(self, spec: ClusterPolicySpec, ctx: RenderContext) -> list[Manifest]:
        """Desired objects; empty when the component is disabled."""
        return self.render(spec, ctx) if self.enabled(spec) else []


def always(_spec: ClusterPolicySpec) -> bool:
    """For the states every policy has (operator metrics)."""
    return True
