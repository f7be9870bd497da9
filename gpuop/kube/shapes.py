"""Parse only what a watch cache keeps.

An operand pod is 6-16 KB of JSON, and at fleet scale the pods watch brings tens of
thousands of them during a rollout: ``json.loads`` built every field in Python
(managedFields, the whole pod spec) only for the cache's transform to keep a few
hundred bytes. A *shape* is a ``TypedDict`` naming the fields the transform reads;
pydantic-core parses the JSON in Rust and builds just those: parsing and trimming
an operand pod takes about two thirds of the time ``json.loads`` and the transform
took (``python -m tests.bench.parse``).

The shape never decides what an object means: the transform still runs on what the
shape kept, so a field missing from the shape is a field the cache lacks. Anything
the shape does not fit (an ``ERROR`` event's Status, a field of an unexpected type)
is parsed whole instead, so a surprise costs speed, never data.
"""

from __future__ import annotations

import json
from typing import Any, cast

from pydantic import TypeAdapter, ValidationError
from typing_extensions import TypedDict

Obj = dict[str, Any]

#: ``continue`` is a Python keyword, hence the functional form.
_ListMeta = TypedDict("_ListMeta", {"resourceVersion": str, "continue": str}, total=False)


def _typed_dict(name: str, fields: dict[str, Any]) -> Any:
    """A ``TypedDict`` built at run time: the watch event wraps whatever shape it is given."""
    return cast(Any, TypedDict)(name, fields, total=False)


class Decoder:
    """Watch lines and LIST pages as dicts, narrowed to ``shape`` when there is one."""

    def __init__(self, shape: Any = None) -> None:
        self._event: TypeAdapter[Any] | None = None
        self._page: TypeAdapter[Any] | None = None
        if shape is not None:
            self._event = TypeAdapter(_typed_dict("WatchEvent", {"type": str, "object": shape}))
            self._page = TypeAdapter(
                _typed_dict("ListPage", {"metadata": _ListMeta, "items": list[shape]})
            )

    def event(self, line: bytes) -> Obj:
        """One watch event; an ``ERROR`` keeps its whole Status (code, message)."""
        event = _shaped(self._event, line)
        if event is not None and event.get("type") != "ERROR":
            return event
        parsed: Obj = json.loads(line)
        return parsed

    def page(self, body: bytes) -> Obj:
        """One LIST response: ``items`` and ``metadata`` (continue, resourceVersion)."""
        page = _shaped(self._page, body)
        if page is not None:
            return page
        parsed: Obj = json.loads(body)
        return parsed


def _shaped(adapter: TypeAdapter[Any] | None, data: bytes) -> Obj | None:
    """``data`` parsed into the adapter's shape; None without one or when it does not fit."""
    if adapter is None:
        return None
    try:
        shaped: Obj = adapter.validate_json(data)
    except ValidationError:
        return None
    return shaped
