"""What kube-apiserver itself counted over a timed window: the simulator's health
beside the clock.

On two shared cores the control plane falls behind during a 1,000-node rollout, in
two ways that are nobody's requests and that the clock pays for all the same:

- the watch cache closes a watcher whose buffer stays full ("Forcing ... watcher
  close due to unresponsiveness" in its log); every client (the controller manager,
  the scheduler, kwok, the operator) then opens its watch again from where it was;
- kwok v0.8 handles some pod events more than once (far more often with its stage
  workers in parallel) and plays a pod's ready stage again each time, with a newly
  allocated pod IP; the API server rejects every play after the first (422: two pod
  IPs of one family).

Counting both per run (from ``/metrics``, read at the clock's start and end) says
how much of a difference between two runs is the simulator's rather than the code
under test's. Two reads of ``/metrics`` per run: nothing the clock can see.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gpuop.kube.rest import Rest

#: (metric family, the labels a sample must have) for each figure kept.
_COUNTED: dict[str, tuple[str, dict[str, str]]] = {
    "pod_status_patches": (
        "apiserver_request",
        {"verb": "PATCH", "resource": "pods", "subresource": "status", "code": "200"},
    ),
    "pod_status_rejected": (
        "apiserver_request",
        {"verb": "PATCH", "resource": "pods", "subresource": "status", "code": "422"},
    ),
    "pod_watch_events": ("apiserver_watch_events", {"resource": "pods"}),
}
#: Watchers the watch cache closed for falling behind, kept per resource.
_TERMINATED = "apiserver_terminated_watchers"


def counters(text: str) -> dict[str, float]:
    """The kept figures of one ``/metrics`` text: ``_COUNTED``'s names, and
    ``watchers_closed:<resource>`` for each resource whose watchers were closed."""
    out: dict[str, float] = dict.fromkeys(_COUNTED, 0.0)
    families = tuple({family for family, _ in _COUNTED.values()} | {_TERMINATED})
    kept = "\n".join(line for line in text.splitlines() if _about(line, families))
    for family in text_string_to_metric_families(kept):
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue
            if family.name == _TERMINATED:
                key = f"watchers_closed:{sample.labels.get('resource', '')}"
                out[key] = out.get(key, 0.0) + sample.value
                continue
            for name, (wanted, labels) in _COUNTED.items():
                if family.name == wanted and _has(sample.labels, labels):
                    out[name] += sample.value
    return out


def _about(line: str, families: tuple[str, ...]) -> bool:
    """Is this line (a sample, or its ``# HELP``/``# TYPE``) one of ``families``?
    The whole text is some 10,000 lines; the parser reads only these."""
    name = line.split(" ", 3)[2] if line.startswith("# ") and line.count(" ") >= 2 else line
    return name.startswith(families)


def _has(labels: Mapping[str, str], wanted: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in wanted.items())


def delta(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, Any]:
    """What happened between two reads: the kept figures, and ``watchers_closed`` as a
    table by resource (only resources with any)."""
    out: dict[str, Any] = {
        name: round(after.get(name, 0.0) - before.get(name, 0.0)) for name in _COUNTED
    }
    closed = {
        key.split(":", 1)[1]: round(after[key] - before.get(key, 0.0))
        for key in sorted(after)
        if key.startswith("watchers_closed:")
    }
    out["watchers_closed"] = {res: n for res, n in closed.items() if n}
    return out


async def read_metrics(rest: Rest) -> str:
    """kube-apiserver's ``/metrics`` (the bench's admin user may read it)."""
    resp = await rest.api.call_api(
        "/metrics",
        "GET",
        header_params={"Accept": "text/plain"},
        auth_settings=["BearerToken"],
        _preload_content=False,
        _return_http_data_only=True,
        _request_timeout=rest.timeout,
    )
    try:
        body: bytes = await resp.read()
    finally:
        resp.release()
    if resp.status != 200:
        raise RuntimeError(f"GET /metrics: HTTP {resp.status}: {body[:200]!r}")
    return body.decode()


@dataclass
class ApiserverCounters:
    """``start`` and ``take`` around a timed window, as :class:`ClusterCpu` does."""

    rest: Rest
    _before: dict[str, float] | None = None

    async def start(self) -> None:
        self._before = counters(await read_metrics(self.rest))

    async def take(self) -> dict[str, Any]:
        after = counters(await read_metrics(self.rest))
        return delta(self._before or {}, after)
