"""Shared, read-only leaves for the watch caches, so memory stays flat as the fleet grows.

At 3,000 GPU nodes the caches hold 3,000 nodes and about 20,000 operand pods.
Much of what they keep is the same as their neighbours' (a pod's labels are its
DaemonSet revision's, nodes alike share status and allocatable), and every JSON
decode makes new copies of the same strings. :func:`shared` returns one canonical, immutable
instance per distinct value (hash-consing, held weakly: a value no cached
object uses any more is freed) and interns strings. What stays per object is
only what is unique to it (name, uid, resourceVersion).

Shared values are :class:`FrozenDict` / :class:`FrozenList`: real ``dict`` and
``list`` subclasses (JSON, ``==`` and ``isinstance`` work as before) that refuse
mutation, because a change to one would silently change every object sharing
it. ``copy.copy``/``copy.deepcopy``/``dict(x)`` give ordinary mutable copies.
"""

from __future__ import annotations

import copy
import sys
import weakref
from typing import Any, NoReturn

__all__ = ["FrozenDict", "FrozenList", "frozen", "shared"]


def _refuse(self: object, *args: object, **kwargs: object) -> NoReturn:
    raise TypeError(
        f"{type(self).__name__} is a shared, read-only part of a cached object; copy it first"
    )


class FrozenDict(dict[str, Any]):
    """A ``dict`` that refuses mutation (and can be held weakly by the pool)."""

    __slots__ = ("__weakref__",)

    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    def copy(self) -> dict[str, Any]:
        return dict(self)

    def __copy__(self) -> dict[str, Any]:
        return dict(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, Any]:
        return copy.deepcopy(dict(self), memo)

    def __reduce__(self) -> tuple[type[dict[str, Any]], tuple[dict[str, Any]]]:
        return (dict, (dict(self),))


class FrozenList(list[Any]):
    """A ``list`` that refuses mutation (and can be held weakly by the pool)."""

    __slots__ = ("__weakref__",)

    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse
    append = extend = insert = pop = remove = clear = sort = reverse = _refuse

    def copy(self) -> list[Any]:
        return list(self)

    def __copy__(self) -> list[Any]:
        return list(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> list[Any]:
        return copy.deepcopy(list(self), memo)

    def __reduce__(self) -> tuple[type[list[Any]], tuple[list[Any]]]:
        return (list, (list(self),))


_POOL: weakref.WeakValueDictionary[tuple[Any, ...], FrozenDict | FrozenList] = (
    weakref.WeakValueDictionary()
)


def shared(value: Any) -> Any:
    """The canonical read-only instance equal to ``value`` (strings interned, containers pooled)."""
    if isinstance(value, str):
        return sys.intern(value)
    if isinstance(value, dict):
        key: tuple[Any, ...]
        if all(type(v) is str for v in value.values()):
            # Labels, the common case (every pod event): the key `_identity` would make,
            # without a call per entry.
            items = [(sys.intern(str(k)), sys.intern(v)) for k, v in value.items()]
            key = ("d", *((k, ("str", v)) for k, v in items))
        else:
            items = [(sys.intern(str(k)), shared(v)) for k, v in value.items()]
            key = ("d", *((k, _identity(v)) for k, v in items))
        found = _POOL.get(key)
        if found is None:
            found = FrozenDict(items)
            _POOL[key] = found
        return found
    if isinstance(value, list | tuple):
        elements = [shared(v) for v in value]
        key = ("l", *(_identity(v) for v in elements))
        found = _POOL.get(key)
        if found is None:
            found = FrozenList(elements)
            _POOL[key] = found
        return found
    return value


def frozen(value: dict[str, Any]) -> FrozenDict:
    """A read-only dict of interned strings that is *not* pooled: for values unique to
    one object (a node's labels), where pooling would only add a pool entry."""
    return FrozenDict((sys.intern(str(k)), shared(v)) for k, v in value.items())


def _identity(value: Any) -> Any:
    # Canonical children are unique objects, and a pooled parent keeps its children
    # alive, so their id is a stable part of the parent's key. The type keeps
    # True/1/1.0 apart (they hash and compare equal).
    if isinstance(value, FrozenDict | FrozenList):
        return (id(value),)
    return (type(value).__name__, value)


def pool_size() -> int:
    """How many distinct shared containers are alive (for tests and debugging)."""
    return len(_POOL)
