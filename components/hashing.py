"""A content hash of each desired object, stored on it, so the controller writes only
objects whose desired content changed: a reconcile that changes nothing writes nothing,
and fields the API server defaults never look like drift."""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from typing import Any

HASH_ANNOTATION = "gpuop.io/applied-hash"
LEGACY_HASH_ANNOTATION = "gpuop.dev/applied-hash"
"""Where releases before the single `gpuop.io/` domain kept the hash: still read, so
objects they applied are not rewritten only because the annotation moved."""
_HASH_ANNOTATIONS = (HASH_ANNOTATION, LEGACY_HASH_ANNOTATION)
HASH_LENGTH = 16


def manifest_hash(obj: Mapping[str, Any]) -> str:
    """sha256 of the object's canonical JSON (sorted keys), ignoring its own hash
    annotation and any status; shortened to 16 hex digits."""
    body = {k: v for k, v in obj.items() if k != "status"}
    metadata = dict(body.get("metadata") or {})
    annotations = {
        k: v for k, v in (metadata.get("annotations") or {}).items() if k not in _HASH_ANNOTATIONS
    }
    if annotations:
        metadata["annotations"] = annotations
    else:
        metadata.pop("annotations", None)
    body["metadata"] = metadata
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()[:HASH_LENGTH]


def with_hash(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of `obj` with its hash in metadata.annotations."""
    result = copy.deepcopy(dict(obj))
    metadata = result.setdefault("metadata", {})
    metadata["annotations"] = {
        **(metadata.get("annotations") or {}),
        HASH_ANNOTATION: manifest_hash(obj),
    }
    return result


def applied_hash(obj: Mapping[str, Any] | None) -> str | None:
    """The hash annotation an object carries, if any (the legacy spelling too)."""
    if obj is None:
        return None
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    for key in _HASH_ANNOTATIONS:
        value = annotations.get(key)
        if isinstance(value, str):
            return value
    return None


def needs_apply(desired: Mapping[str, Any], observed: Mapping[str, Any] | None) -> bool:
    """Whether `desired` (with or without its hash annotation) must be written: the
    observed object is missing or was applied from different desired content."""
    return applied_hash(observed) != manifest_hash(desired)
