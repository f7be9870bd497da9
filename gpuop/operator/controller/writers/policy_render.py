"""What the cluster pass renders for a ClusterPolicy, memoised on its inputs.

Rendering and hashing every object cost most of a rollout pass's CPU, so the render is
kept until an input changes: the policy's generation, the GPU nodes' facts, the site
ConfigMaps' keys and whether the Prometheus Operator's APIs are served.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from components import NodeFacts, ObjectKind, RenderContext, desired_objects, node_facts
from components.driver_config import config_problems, referenced_config_maps
from components.hashing import with_hash
from components.kinds import PROMETHEUS_RULE, SERVICE_MONITOR
from crd import ClusterPolicySpec
from gpuop.kube.informer import Obj
from gpuop.kube.rest import Rest
from gpuop.operator.controller.base.config import OperatorConfig
from gpuop.operator.controller.base.memo import VersionMemo
from gpuop.operator.controller.base.optional_watches import OptionalWatches
from gpuop.operator.controller.base.site_config import SiteConfigMaps
from gpuop.operator.controller.views.node_views import GpuFleet
from gpuop.operator.controller.writers.apply import owned_by, owner_reference
from gpuop.operator.controller.writers.status_write import POLICY

Desired = dict[str, list[Obj]]
"""Each component's desired objects, by component name (every component, maybe [])."""


@dataclass(kw_only=True)
class PolicyRender:
    """The ClusterPolicy's rendered objects and the memos they are kept by."""

    config: OperatorConfig
    rest: Rest
    watches: OptionalWatches
    site_config: SiteConfigMaps
    _served: VersionMemo[str, bool] = field(default_factory=VersionMemo, init=False)
    _rendered: tuple[tuple[object, ...], Desired, tuple[str, ...]] | None = field(
        default=None, init=False
    )
    _facts: dict[str, tuple[Obj, NodeFacts]] = field(default_factory=dict, init=False)
    _facts_memo: tuple[int, tuple[NodeFacts, ...]] | None = field(default=None, init=False)

    async def render(
        self, raw: Obj, spec: ClusterPolicySpec, gpu_nodes: list[Obj], fleet: GpuFleet
    ) -> Desired:
        """Every component's objects, owned by the policy and carrying their hash.

        Rendered again only when its inputs changed (the policy's generation, the GPU
        nodes' facts, the Prometheus Operator's APIs): during a rollout the pass runs on every
        pod change, and rendering and hashing every object each time cost most of its
        CPU. Callers get a fresh mapping over the shared, never-mutated objects."""
        facts = self._node_facts(gpu_nodes, fleet.version)
        site_keys = self.site_config.keys(referenced_config_maps(spec))
        ctx = RenderContext(
            namespace=self.config.namespace,
            operator_image=self.config.operator_image,
            operator_image_pull_policy=self.config.operator_image_pull_policy,
            operator_image_pull_secrets=self.config.operator_image_pull_secrets,
            mig_capable=fleet.mig_capable,
            service_monitor_crd=await self._served_kind(raw, SERVICE_MONITOR),
            prometheus_rule_crd=await self._served_kind(raw, PROMETHEUS_RULE),
            gpu_nodes=facts,
            config_map_keys=site_keys,
        )
        meta = raw["metadata"]
        key = (
            meta.get("uid"),
            meta.get("generation") or meta.get("resourceVersion"),
            ctx.mig_capable,
            ctx.service_monitor_crd,
            ctx.prometheus_rule_crd,
            facts,
            tuple(sorted(site_keys.items())),
        )
        if self._rendered is None or self._rendered[0] != key:
            owner = owner_reference(POLICY.api_version, POLICY.kind, meta)
            desired = {
                name: [with_hash(owned_by(o, owner)) for o in objs]
                for name, objs in desired_objects(spec, ctx).items()
            }
            self._rendered = (key, desired, tuple(config_problems(spec, ctx)))
        return {name: list(objs) for name, objs in self._rendered[1].items()}

    @property
    def config_problems(self) -> tuple[str, ...]:
        """Why the last render lacks the driver's site configuration (a named ConfigMap
        missing, an OS with no known directory): empty when it has it all."""
        return self._rendered[2] if self._rendered else ()

    def _node_facts(self, gpu_nodes: list[Obj], nodes_version: int) -> tuple[NodeFacts, ...]:
        """Each GPU node's facts in name order, read again only from a node object the
        cache replaced since. ``nodes_version``: the node cache's version ``gpu_nodes``
        were read at (the cache may have moved on while the pass awaited)."""
        if self._facts_memo is not None and self._facts_memo[0] == nodes_version:
            return self._facts_memo[1]
        known = self._facts
        self._facts = {}
        out = []
        for node in gpu_nodes:  # in name order
            name = str(node["metadata"]["name"])
            entry = known.get(name)
            if entry is None or entry[0] is not node:
                entry = (node, node_facts(node))
            self._facts[name] = entry
            out.append(entry[1])
        self._facts_memo = (nodes_version, tuple(out))
        return self._facts_memo[1]

    async def _served_kind(self, raw: Obj, kind: ObjectKind) -> bool:
        """Whether an optional kind's API (the Prometheus Operator's ServiceMonitor or
        PrometheusRule) is served (discovery, which every authenticated client may
        read), starting or stopping its watch. Asked once per policy version, never on
        a timer."""

        async def probe() -> bool:
            found = await self.rest.api_resource_exists(kind.api_version, kind.plural)
            self.watches.served(kind, found)
            return found

        # Keyed by generation, not resourceVersion: status writes bump that.
        version = str(raw["metadata"].get("generation"))
        return await self._served.aget(kind.kind, version, probe)
