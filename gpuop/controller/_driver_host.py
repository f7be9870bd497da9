"""What the NVIDIADriver controller needs of the operator that hosts it.

NVIDIADrivers shares the operator's caches, queue and writers rather than keeping copies;
naming exactly those parts here, as a protocol, keeps the NVIDIADriver modules from
importing the operator that imports them (import-linter's acyclic contract).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from crd import ClusterPolicySpec
    from gpuop.controller._apply import Applier
    from gpuop.controller._config import OperatorConfig
    from gpuop.controller._site_config import SiteConfigMaps
    from gpuop.informer import Informer
    from gpuop.rest import Rest
    from gpuop.workqueue import WorkQueue


class FleetNews(Protocol):
    """The node passes' side of a driver pod event: whether a node waits for a slot."""

    def upgrades_queued(self) -> bool: ...
    def fleet_soon(self) -> None: ...


class DriverHost(Protocol):
    """The operator's shared parts, as NVIDIADrivers reads and uses them."""

    @property
    def rest(self) -> Rest: ...
    @property
    def config(self) -> OperatorConfig: ...
    @property
    def queue(self) -> WorkQueue: ...
    @property
    def nodes(self) -> Informer: ...
    @property
    def owned(self) -> dict[str, Informer]: ...
    @property
    def applier(self) -> Applier: ...
    @property
    def node_passes(self) -> FleetNews: ...
    @property
    def site_config(self) -> SiteConfigMaps: ...

    def active_spec(self) -> ClusterPolicySpec | None: ...
