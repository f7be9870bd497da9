"""Upgrade pre-flight: a driver pool starts no wave before every image it will pull is
known to exist.

A driver upgrade cordons a node and deletes its driver pod before the new image is
pulled; a tag that was never pushed (a typo in ``driver.version``, a kernel with no
precompiled build, a mirror not yet synced) would leave each node of the wave
cordoned without a driver. So the fleet pass asks the registry first, and a pool whose
images are not all there holds every node of it on its current driver, cordoning none.
This module decides from the registry's answers; the operator asks and records.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

RECORD_ANNOTATION = "gpuop.io/driver-upgrade-preflight"
"""On a driver DaemonSet whose pool is held: why, for the template generation checked
(``gpuop upgrade status`` and ``plan`` read it; absent while the pool may proceed)."""


class Mode(StrEnum):
    """What the operator does when a registry cannot be asked (the chart's
    ``operator.upgradePreflight``, the ``--upgrade-preflight`` flag)."""

    HOLD = "hold"
    """Check; a missing image or an unreachable registry holds the pool."""
    PROCEED = "proceed"
    """Check; a missing image holds, an unreachable registry is logged and the wave
    proceeds (air-gapped mirrors without the registry API)."""
    OFF = "off"
    """No pre-flight: no registry is asked."""


class Found(StrEnum):
    PRESENT = "present"
    MISSING = "missing"
    """The registry answered that the tag or repository does not exist."""
    DENIED = "denied"
    """The registry refused the pool's pull credentials: nodes could not pull either."""
    UNREACHABLE = "unreachable"
    """No answer, an error, or no registry API (network, TLS, HTTP 5xx, 429)."""


@dataclass(frozen=True)
class ImageCheck:
    """One image's answer, as the registry gave it."""

    image: str
    found: Found
    detail: str = ""

    def describe(self) -> str:
        what = {
            Found.PRESENT: "present",
            Found.MISSING: "not found in its registry",
            Found.DENIED: "refused by its registry with the pool's pull secrets",
            Found.UNREACHABLE: "not checked: registry unreachable",
        }[self.found]
        return f"{self.image} {what}" + (f" ({self.detail})" if self.detail else "")


@dataclass(frozen=True)
class PoolVerdict:
    pool: str
    hold: str = ""
    """Why the pool holds (names every image at fault); empty: it may proceed."""
    unchecked: tuple[ImageCheck, ...] = ()
    """Images whose registry could not be asked, passed over in ``proceed`` mode."""

    @property
    def held(self) -> bool:
        return bool(self.hold)

    @property
    def retry(self) -> bool:
        """Whether asking again later could change the answer (a held pool, or one that
        proceeded unchecked): the fleet pass looks again with backoff."""
        return self.held or bool(self.unchecked)


def pool_verdict(pool: str, checks: Iterable[ImageCheck], mode: Mode) -> PoolVerdict:
    """Whether ``pool`` may start a wave, from its images' answers."""
    listed = list(checks)
    blocking = [
        c
        for c in listed
        if c.found in (Found.MISSING, Found.DENIED)
        or (c.found is Found.UNREACHABLE and mode is not Mode.PROCEED)
    ]
    unchecked = tuple(c for c in listed if c.found is Found.UNREACHABLE and mode is Mode.PROCEED)
    if not blocking:
        return PoolVerdict(pool, unchecked=unchecked)
    named = "; ".join(c.describe() for c in blocking)
    return PoolVerdict(
        pool, hold=f"pre-flight: {named}; pool {pool} holds on its current driver", unchecked=()
    )


def held_nodes(
    candidates: Mapping[str, Sequence[str]], verdicts: Mapping[str, PoolVerdict]
) -> dict[str, str]:
    """Each waiting node of a held pool, with its pool's reason (the budget's ``held``)."""
    return {
        node: verdicts[pool].hold
        for pool, nodes in candidates.items()
        if pool in verdicts and verdicts[pool].held
        for node in nodes
    }


def record(verdict: PoolVerdict, generation: int) -> str | None:
    """The annotation value for ``verdict`` on the DaemonSet of ``generation``; None
    (removed) when the pool may proceed."""
    if not verdict.held:
        return None
    return json.dumps({"generation": generation, "hold": verdict.hold}, sort_keys=True)


def recorded_hold(annotations: Mapping[str, str], generation: int) -> str:
    """The hold recorded on a DaemonSet, if it is for its current template (a newer
    template has not been checked yet: its old answer says nothing)."""
    raw = annotations.get(RECORD_ANNOTATION)
    if not raw:
        return ""
    try:
        data = json.loads(raw)
    except ValueError:
        return ""
    if not isinstance(data, dict) or data.get("generation") != generation:
        return ""
    hold = data.get("hold")
    return hold if isinstance(hold, str) else ""


def pool_images(pod_spec: Mapping[str, object]) -> tuple[str, ...]:
    """Every image a pod of the pool pulls (init containers first), each once."""
    seen: dict[str, None] = {}
    for key in ("initContainers", "containers"):
        for container in pod_spec.get(key) or ():  # type: ignore[attr-defined]
            image = container.get("image") if isinstance(container, Mapping) else None
            if isinstance(image, str) and image:
                seen.setdefault(image, None)
    return tuple(seen)


def pull_secret_names(pod_spec: Mapping[str, object]) -> tuple[str, ...]:
    """The pod's ``imagePullSecrets``, in order (the kubelet tries them in that order)."""
    names = []
    for ref in pod_spec.get("imagePullSecrets") or ():  # type: ignore[attr-defined]
        name = ref.get("name") if isinstance(ref, Mapping) else None
        if isinstance(name, str) and name:
            names.append(name)
    return tuple(names)
