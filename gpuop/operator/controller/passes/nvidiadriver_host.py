"""What the NVIDIADriver controller needs of the operator that hosts it.

NVIDIADrivers shares the operator's caches and writers rather than keeping copies (what
its writes wake goes through the operator's router, handed to it as ``wake``);
naming exactly those parts here, as a protocol, keeps the NVIDIADriver modules from
importing the operator that imports them (import-linter's acyclic contract).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from crd import ClusterPolicySpec
    from gpuop.kube.informer import Informer, Obj
    from gpuop.kube.rest import Rest
    from gpuop.operator.controller.base.config import OperatorConfig
    from gpuop.operator.controller.base.site_config import SiteConfigMaps
    from gpuop.operator.controller.writers.apply import Applier
    from gpuop.operator.controller.writers.rollback import RollbackTemplates


class DriverHost(Protocol):
    """The operator's shared parts, as NVIDIADrivers reads and uses them."""

    @property
    def rest(self) -> Rest: ...
    @property
    def config(self) -> OperatorConfig: ...
    @property
    def nodes(self) -> Informer: ...
    @property
    def owned(self) -> dict[str, Informer]: ...
    @property
    def applier(self) -> Applier: ...
    @property
    def site_config(self) -> SiteConfigMaps: ...
    @property
    def rollback(self) -> RollbackTemplates: ...

    def active_spec(self) -> ClusterPolicySpec | None: ...
    def gpucluster_object(self) -> Obj | None: ...
