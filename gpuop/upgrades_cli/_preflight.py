"""What the operator's upgrade pre-flight holds, as ``gpuop upgrade status|plan`` show it.

The CLI asks no registry: it reads the hold the operator recorded on each driver
DaemonSet (``statemachine.preflight.RECORD_ANNOTATION``), for that DaemonSet's current
template only, and holds the pool's waiting nodes with it as the fleet pass does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gpuop.kube.informer import Obj
from statemachine.fleet_report import NodeFacts
from statemachine.preflight import recorded_hold
from statemachine.upgrade_keys import UpgradeState


def pool_holds(daemonsets: Iterable[Obj]) -> dict[str, str]:
    """Driver DaemonSet name -> why the pre-flight holds its pool (held ones only)."""
    holds = {}
    for ds in daemonsets:
        meta = ds["metadata"]
        hold = recorded_hold(meta.get("annotations") or {}, int(meta.get("generation") or 0))
        if hold:
            holds[str(meta["name"])] = hold
    return dict(sorted(holds.items()))


def preflight_held(
    holds: Mapping[str, str], apps: Mapping[str, str], facts: Iterable[NodeFacts]
) -> dict[str, str]:
    """The nodes waiting for a slot (``upgrade-required``) in a held pool, with why."""
    return {
        f.name: holds[apps[f.name]]
        for f in facts
        if f.state is UpgradeState.UPGRADE_REQUIRED and apps.get(f.name) in holds
    }


def preflight_lines(holds: Mapping[str, str]) -> list[str]:
    return [f"upgrade pre-flight ({pool}): {why}" for pool, why in holds.items()]
