"""The kinds the controller watches and prunes, derived from the operand registry, and
the watches on those whose API a CRD provides.

Every kind some operand renders is owned: watched (label-selected) so a deleted object
is re-created and one no longer wanted is pruned. A kind an optional CRD serves (the
Prometheus operator's ServiceMonitor) is watched only once discovery has found its API:
a LIST against an API that is not served would fail and retry forever.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from components import OWNED_KINDS, ObjectKind
from gpuop.kube.informer import Informer
from gpuop.log import get_logger

log = get_logger(__name__)

OWNED: tuple[ObjectKind, ...] = OWNED_KINDS
OWNED_NAMESPACED: tuple[ObjectKind, ...] = tuple(k for k in OWNED if k.namespaced)
"""Namespaced kinds we create and watch (label-selected) in the operator namespace."""
OWNED_CLUSTER: tuple[ObjectKind, ...] = tuple(k for k in OWNED if not k.namespaced)
OWNED_BY_NAME: dict[str, ObjectKind] = {k.kind: k for k in OWNED}
ALWAYS_WATCHED: tuple[ObjectKind, ...] = tuple(k for k in OWNED if not k.optional)
"""Owned kinds every cluster serves: watched from the start."""


class OptionalWatches:
    """Watches on owned kinds whose API may be absent, started when discovery finds it.

    A watch joins `owned` (the controller's caches by kind) only once its first list is
    in, so the controller never prunes or re-applies from an empty cache; until then it
    reads such objects one by one before writing them. `served(kind, False)` stops the
    watch again (the CRD was removed), so no list is retried against a missing API.
    """

    def __init__(
        self,
        owned: dict[str, Informer],
        make: Callable[[ObjectKind], Informer],
        on_synced: Callable[[], None],
    ) -> None:
        self._owned = owned
        self._make = make
        self._on_synced = on_synced
        self._requests: asyncio.Queue[ObjectKind] = asyncio.Queue()
        self._tasks: dict[str, asyncio.Task[None] | None] = {}

    def served(self, kind: ObjectKind, present: bool) -> None:
        """What discovery said about `kind`'s API; starts or stops its watch."""
        if present and kind.kind not in self._tasks:
            self._tasks[kind.kind] = None  # asked for; `run` starts it
            self._requests.put_nowait(kind)
        elif not present and kind.kind in self._tasks:
            task = self._tasks.pop(kind.kind)
            if task is not None:
                task.cancel()
            self._owned.pop(kind.kind, None)
            log.info("watch stopped: API not served", kind=kind.kind)

    async def run(self) -> None:
        """Root task: runs the watches asked for; they end with it."""
        async with asyncio.TaskGroup() as group:
            while True:
                kind = await self._requests.get()
                if kind.kind in self._tasks and self._tasks[kind.kind] is None:
                    self._tasks[kind.kind] = group.create_task(
                        self._watch(kind), name=f"watch-{kind.plural}"
                    )

    async def _watch(self, kind: ObjectKind) -> None:
        informer = self._make(kind)

        async def register() -> None:
            await informer.synced.wait()
            self._owned[kind.kind] = informer
            log.info("watch started: API served", kind=kind.kind)
            self._on_synced()

        registering = asyncio.create_task(register(), name=f"synced-{kind.plural}")
        try:
            await informer.run()  # until cancelled: `served(kind, False)` or shutdown
        finally:
            registering.cancel()
            if self._owned.get(kind.kind) is informer:
                del self._owned[kind.kind]
