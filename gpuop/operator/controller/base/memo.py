"""One value per key, recomputed only when the key's version changes.

Every pass reads the active ClusterPolicy, the NVIDIADrivers and whether the
ServiceMonitor API is served; parsing or asking again each time would cost CPU or
requests for an answer that only changes with the object's resourceVersion (or
generation). :class:`VersionMemo` is that one pattern, named and typed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class VersionMemo(Generic[K, V]):
    """Remembers the last value computed per key, with the version it was computed at."""

    def __init__(self) -> None:
        self._entries: dict[K, tuple[str, V]] = {}

    def get(self, key: K, version: str, compute: Callable[[], V]) -> V:
        """The value for ``key`` at ``version``: remembered, or computed (and remembered)."""
        entry = self._entries.get(key)
        if entry is None or entry[0] != version:
            entry = (version, compute())
            self._entries[key] = entry
        return entry[1]

    async def aget(self, key: K, version: str, compute: Callable[[], Awaitable[V]]) -> V:
        """:meth:`get` for a value that takes a request to find out."""
        entry = self._entries.get(key)
        if entry is None or entry[0] != version:
            entry = (version, await compute())
            self._entries[key] = entry
        return entry[1]
