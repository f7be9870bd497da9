"""When an observed DaemonSet counts as rolled out (upstream semantics, made safer).

Ready when it wants no pods, or when every wanted pod is available and, for RollingUpdate,
runs the current template. OnDelete DaemonSets (the driver under automatic upgrades) skip
the revision check: the upgrade state machine owns when pods move to a new revision.
Unlike upstream, a status the DaemonSet controller has not yet computed for the current
generation is never taken as ready, so a just-created DaemonSet does not pass as
"wants no pods" before the controller has looked at the nodes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def _int(section: Mapping[str, Any], key: str) -> int:
    value = section.get(key)
    return value if isinstance(value, int) else 0


def daemonset_ready(ds: Mapping[str, Any]) -> tuple[bool, str]:
    """(ready, message); the message says what is missing, or why it is ready."""
    metadata: Mapping[str, Any] = ds.get("metadata") or {}
    spec: Mapping[str, Any] = ds.get("spec") or {}
    status: Mapping[str, Any] = ds.get("status") or {}
    generation = _int(metadata, "generation")
    observed = status.get("observedGeneration")
    if not isinstance(observed, int) or observed < generation:
        return False, "DaemonSet controller has not observed the latest spec yet"
    desired = _int(status, "desiredNumberScheduled")
    if desired == 0:
        return True, "no nodes to run on"
    available = _int(status, "numberAvailable")
    unavailable = _int(status, "numberUnavailable")
    if unavailable > 0 or available < desired:
        return False, f"{available}/{desired} pods available"
    strategy = (spec.get("updateStrategy") or {}).get("type", "RollingUpdate")
    if strategy != "OnDelete":
        updated = _int(status, "updatedNumberScheduled")
        if updated < desired:
            return False, f"{updated}/{desired} pods updated"
    return True, f"{available}/{desired} pods available"


def component_ready(
    desired: Iterable[Mapping[str, Any]], observed: Mapping[str, Mapping[str, Any]]
) -> tuple[bool, str]:
    """Readiness of a component: all its desired DaemonSets exist and are ready.

    `observed` maps DaemonSet name to the cached object. A component with no DaemonSet
    (a Service, a RuntimeClass) is ready once applied.
    """
    problems: list[str] = []
    for obj in desired:
        if obj.get("kind") != "DaemonSet":
            continue
        name = str(obj["metadata"]["name"])
        found = observed.get(name)
        if found is None:
            problems.append(f"{name}: not created yet")
            continue
        ready, message = daemonset_ready(found)
        if not ready:
            problems.append(f"{name}: {message}")
    return (not problems, "; ".join(problems) or "ready")
