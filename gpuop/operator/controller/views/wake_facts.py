"""What each unit reads of a resource besides its spec, for the router: a change of it
wakes that unit."""

from __future__ import annotations

from typing import Any

from gpuop.kube.informer import Obj
from statemachine.maintenance_window import TIMEZONE_ANNOTATION, WINDOWS_ANNOTATION
from statemachine.rollback import ROLLBACK_ANNOTATION
from statemachine.rollout_gate import (
    RECORD_ANNOTATION,
    RESUME_ANNOTATION,
)


def gate_facts(policy: Obj | None) -> Any:
    """What the gate reads of a policy besides its spec: a change wakes the fleet pass."""
    if policy is None:
        return None
    annotations = policy["metadata"].get("annotations") or {}
    return (
        annotations.get(RESUME_ANNOTATION),
        annotations.get(RECORD_ANNOTATION),
        annotations.get(ROLLBACK_ANNOTATION),
    )


def rollback_facts(raw: Obj | None) -> str | None:
    """What the cluster pass reads of a policy's annotations for a rollback."""
    return (((raw or {}).get("metadata") or {}).get("annotations") or {}).get(ROLLBACK_ANNOTATION)


def window_facts(obj: Obj | None) -> Any:
    """What the windows read of a resource: a change wakes the fleet pass."""
    if obj is None:
        return None
    annotations = obj["metadata"].get("annotations") or {}
    return annotations.get(WINDOWS_ANNOTATION), annotations.get(TIMEZONE_ANNOTATION)
