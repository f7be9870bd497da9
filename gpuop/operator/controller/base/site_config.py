"""The operator namespace's ConfigMaps as the driver's site configuration reads them.

`spec.driver.repoConfig`, `certConfig` and `kernelModuleConfig` name ConfigMaps the
administrator creates (unlabelled, so the owned-object caches never see them) whose
files are mounted one by one (`components.driver_config`). The cache keeps only each
ConfigMap's name and data keys, so a file added to a repository ConfigMap re-renders
the driver, and a change of its contents alone (the pods read it on start) does not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from gpuop.kube.informer import Informer, ResourceSpec
from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Rest

Obj = dict[str, Any]
CONFIG_MAP = by_kind("v1", "ConfigMap")


def trim_config_map(cm: Obj) -> Obj:
    meta = cm.get("metadata") or {}
    return {
        "metadata": {k: meta[k] for k in ("name", "namespace", "resourceVersion") if k in meta},
        "keys": tuple(sorted(cm.get("data") or {})),
    }


class SiteConfigMaps:
    """Name -> data keys of every ConfigMap in the operator's namespace."""

    def __init__(self, rest: Rest, namespace: str, changed: Callable[[], None]) -> None:
        self._changed = changed
        self.cache = Informer(
            ResourceSpec(
                "configmaps", rest.lister(CONFIG_MAP, namespace), transform=trim_config_map
            ),
            self._on_event,
        )

    def _on_event(self, event: str, old: Obj | None, new: Obj | None) -> None:
        if old is None or new is None or old["keys"] != new["keys"]:
            self._changed()

    def keys(self, names: Iterable[str]) -> dict[str, tuple[str, ...]]:
        """The data keys of each named ConfigMap that exists (a missing one is absent)."""
        found: dict[str, tuple[str, ...]] = {}
        for cm in self.cache.store.values():
            name = cm["metadata"]["name"]
            if name in names:
                found[name] = cm["keys"]
        return found
