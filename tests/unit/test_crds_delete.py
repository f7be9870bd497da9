"""`gpuop crds delete` (the chart's `operator.cleanupCRD` hook) deletes exactly our three
CRDs and says which were there."""

from __future__ import annotations

import asyncio
from typing import Any

from gpuop.install import CRD_KIND, delete_crds


class _Rest:
    def __init__(self, present: set[str]) -> None:
        self.present = present
        self.deleted: list[tuple[Any, str]] = []

    async def delete(self, kind: Any, name: str, namespace: str | None = None) -> bool:
        self.deleted.append((kind, name))
        return name in self.present


def test_deletes_every_crd_and_names_those_that_were_there() -> None:
    rest = _Rest({"clusterpolicies.nvidia.com"})
    deleted = asyncio.run(delete_crds(rest))  # type: ignore[arg-type]
    assert deleted == ["clusterpolicies.nvidia.com"]
    assert rest.deleted == [
        (CRD_KIND, "clusterpolicies.nvidia.com"),
        (CRD_KIND, "nvidiadrivers.nvidia.com"),
        (CRD_KIND, "gpuclusters.nvidia.com"),
    ]
