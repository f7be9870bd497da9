"""Which driver owns, and runs on, each node: the read side of NVIDIADrivers.

The node pass, the fleet pass, the upgrade machine and the workload hand-over all ask
which driver DaemonSet runs on a node and under which upgradePolicy; the NVIDIADriver
pass (the write side, :mod:`gpuop.operator.controller.passes.nvidiadriver`) asks which nodes a
resource
owns. One small unit answers them from the caches, memoised per cache version, and is
handed to each reader, so none of them holds the NVIDIADriver controller.
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import ValidationError

from components.driver import DAEMONSET_NAME as POLICY_DRIVER_DS
from components.driver import DriverPool, pool_for
from components.nvidiadriver import gpucluster_base, policy_for
from crd import OWNER_LABEL, ClusterPolicySpec, NVIDIADriver, parse_nvidiadriver
from gpuop.kube.informer import Informer, Obj
from gpuop.operator.controller.base.memo import VersionMemo
from gpuop.operator.controller.views.node_views import labels
from gpuop.operator.controller.views.objects import is_policy_driver, nvd_owner
from gpuop.operator.controller.views.upgrade_inputs import policy_view
from statemachine import UpgradePolicyView
from statemachine.driver_owner import NEXT_OWNER_LABEL


class DriverOwners:
    """Answers over the NVIDIADriver, node and DaemonSet caches; keeps only memos."""

    def __init__(
        self,
        drivers: Informer,
        nodes: Informer,
        daemonsets: Informer,
        active_spec: Callable[[], ClusterPolicySpec | None],
        gpucluster_mode: Callable[[], bool] = lambda: False,
    ) -> None:
        self.drivers = drivers
        self._nodes = nodes
        self._daemonsets = daemonsets
        self._active_spec = active_spec
        self._gpucluster_mode = gpucluster_mode
        self._parsed: VersionMemo[str, NVIDIADriver | None] = VersionMemo()
        #: Fleet-wide answers read by every cluster pass and every NVIDIADriver pass,
        #: worked out again only after their cache changed (a rollout's passes would
        #: otherwise scan every node and every DaemonSet each time).
        self._owned_nodes: VersionMemo[str, frozenset[str]] = VersionMemo()
        self._policy_pools: VersionMemo[str, tuple[DriverPool, ...]] = VersionMemo()

    def has_listed(self) -> bool:
        """Whether the NVIDIADriver cache has listed: before, which resource drives a
        node and under which upgradePolicy is unknown, and no pass may act on it."""
        return self.drivers.synced.is_set()

    def base_spec(self) -> ClusterPolicySpec | None:
        """The policy NVIDIADrivers render and upgrade over: the active ClusterPolicy's,
        or beside a GPUCluster (no ClusterPolicy: ``gpucluster_mode``) upstream's
        defaults (:func:`components.nvidiadriver.gpucluster_base`); None with neither."""
        spec = self._active_spec()
        if spec is None and self._gpucluster_mode():
            return gpucluster_base()
        return spec

    def gpucluster_mode(self) -> bool:
        """Whether NVIDIADrivers run beside a GPUCluster (no ClusterPolicy), as upstream's
        DRA stack wants its drivers installed (`resolveActiveConfig`)."""
        return self._active_spec() is None and self._gpucluster_mode()

    def enabled(self) -> bool:
        """Whether NVIDIADrivers drive: the active ClusterPolicy hands its driver to them,
        or a GPUCluster runs without a ClusterPolicy."""
        spec = self.base_spec()
        return spec is not None and spec.driver.enabled and spec.driver.use_nvidia_driver_crd

    def owned_nodes(self) -> frozenset[str]:
        """The nodes an NVIDIADriver owns, or is taking over (they carry its owner or
        next-owner label)."""
        return self._owned_nodes.get(
            "nodes",
            str(self._nodes.version),
            lambda: frozenset(
                str(n["metadata"]["name"])
                for n in self._nodes.values()
                if OWNER_LABEL in labels(n) or NEXT_OWNER_LABEL in labels(n)
            ),
        )

    def model(self, name: str) -> NVIDIADriver | None:
        """The parsed resource, once per resourceVersion (every node pass asks)."""
        raw = self.drivers.get(name)
        if raw is None or raw["metadata"].get("deletionTimestamp"):
            return None
        rv = str(raw["metadata"].get("resourceVersion"))
        return self._parsed.get(name, rv, lambda: _parse_or_none(raw))

    def driver_app(self, node: str) -> str:
        """The driver DaemonSet (`app`) running on ``node``: the ClusterPolicy's, or the
        owning resource's whose pool selects the node ("" when there is none yet)."""
        found = self._nodes.get(node)
        owner = labels(found).get(OWNER_LABEL) if found is not None else None
        node_labels = labels(found) if found is not None else {}
        if not owner:
            # A precompiled driver has a DaemonSet per kernel: the node's kernel's.
            return pool_for(node_labels, self.policy_pools()) or POLICY_DRIVER_DS
        for ds in self._daemonsets.values():
            if nvd_owner(ds) != owner:
                continue
            selector = ds["spec"]["template"]["spec"].get("nodeSelector") or {}
            if all(node_labels.get(k) == v for k, v in selector.items()):
                return str(ds["metadata"]["name"])
        return ""

    def policy_pools(self) -> tuple[DriverPool, ...]:
        """The ClusterPolicy's driver DaemonSets (one, or one per kernel when precompiled),
        worked out again only after the DaemonSet cache changed (every node asks)."""
        daemonsets = self._daemonsets
        return self._policy_pools.get(
            "pools",
            str(daemonsets.version),
            lambda: tuple(
                DriverPool(
                    name=str(ds["metadata"]["name"]),
                    node_selector=ds["spec"]["template"]["spec"].get("nodeSelector") or {},
                    created=str(ds["metadata"].get("creationTimestamp") or ""),
                )
                for ds in daemonsets.values()
                if is_policy_driver(ds["metadata"]["name"])
                and nvd_owner(ds) is None
                and not ds["metadata"].get("deletionTimestamp")
            ),
        )

    def owner_pools(self, owner: str) -> list[str]:
        """The driver DaemonSets of the NVIDIADriver ``owner`` (one per pool): one
        rollout, which its canary and halt gate."""
        return sorted(
            str(ds["metadata"]["name"])
            for ds in self._daemonsets.values()
            if nvd_owner(ds) == owner and not ds["metadata"].get("deletionTimestamp")
        )

    def upgrade_policies(self) -> dict[str, UpgradePolicyView] | None:
        """Each resource's own upgradePolicy (upstream defaults when unset); None when the
        ClusterPolicy does not use NVIDIADrivers."""
        spec = self.base_spec()
        if spec is None or not self.enabled() or not self.has_listed():
            return None
        result = {}
        for raw in self.drivers.values():
            model = self.model(raw["metadata"]["name"])
            if model is not None:
                result[model.name] = upgrade_policy(model, spec)
        return result


def upgrade_policy(model: NVIDIADriver, spec: ClusterPolicySpec) -> UpgradePolicyView:
    """The resource's own upgradePolicy as the upgrade machine reads it (upstream's
    defaults where unset), over the active ClusterPolicy (shared with the conformance
    test)."""
    return policy_view(policy_for(model.spec, spec))


def _parse_or_none(raw: Obj) -> NVIDIADriver | None:
    try:
        return parse_nvidiadriver(raw)
    except ValidationError:
        return None
