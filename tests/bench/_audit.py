"""Requests attributed to the operator's own identity, read from the API server's audit log.

The benchmark cluster runs kube-apiserver with an audit policy that records only
the operator's user (``OPERATOR_USER``, a client certificate minted for the
benchmark) at level ``Metadata`` and nothing else, so every line is one of the
operator's requests as the server saw it. ``RequestReceived`` is omitted; a
watch is counted once at ``ResponseStarted`` (it completes only when it ends),
every other request once at ``ResponseComplete``.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from pathlib import Path
from typing import Any

OPERATOR_USER = "gpuop-bench-operator"
READ_VERBS = frozenset({"get", "list", "watch"})

AUDIT_POLICY: dict[str, Any] = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "Metadata", "users": [OPERATOR_USER]},
        {"level": "None"},
    ],
}


class AuditCounter:
    """Counts the operator's requests by ``(verb, resource)`` between two marks."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        # Wall-clock span (first, last completion) per (verb, resource) of the last take:
        # when the rollout's node patches ended says what the labelling cost.
        self.spans: dict[tuple[str, str], tuple[float, float]] = {}

    def mark(self) -> None:
        """Start a window: everything logged so far is skipped."""
        self._offset = self.path.stat().st_size if self.path.exists() else 0

    def take(self) -> Counter[tuple[str, str]]:
        """Requests logged since the last mark (or take); starts the next window."""
        counts: Counter[tuple[str, str]] = Counter()
        self.spans = {}
        if not self.path.exists():
            return counts
        with self.path.open("rb") as handle:
            handle.seek(self._offset)
            data = handle.read()
        end = data.rfind(b"\n") + 1  # a half-written last line waits for the next take
        self._offset += end
        for line in data[:end].splitlines():
            if not line.strip():
                continue
            event = json.loads(line)
            if (event.get("user") or {}).get("username") != OPERATOR_USER:
                continue
            verb = str(event.get("verb", "?"))
            stage = event.get("stage")
            if verb == "watch":
                if stage != "ResponseStarted":
                    continue
            elif stage not in ("ResponseComplete", "Panic"):
                continue
            ref = event.get("objectRef") or {}
            resource = str(ref.get("resource") or event.get("requestURI", "?"))
            if ref.get("subresource"):
                resource += "/" + str(ref["subresource"])
            counts[(verb, resource)] += 1
            stamp = wall_seconds(event.get("stageTimestamp"))
            if stamp is not None:
                first, last = self.spans.get((verb, resource), (stamp, stamp))
                self.spans[(verb, resource)] = (min(first, stamp), max(last, stamp))
        return counts


def wall_seconds(stamp: object) -> float | None:
    """Epoch seconds of an RFC 3339 timestamp (audit events, the operator's log)."""
    if not isinstance(stamp, str):
        return None
    try:
        return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def writes(counts: Counter[tuple[str, str]]) -> int:
    return sum(n for (verb, _), n in counts.items() if verb not in READ_VERBS)


def by_verb(counts: Counter[tuple[str, str]]) -> dict[str, int]:
    out: Counter[str] = Counter()
    for (verb, _), n in counts.items():
        out[verb] += n
    return dict(sorted(out.items()))


def as_table(counts: Counter[tuple[str, str]]) -> dict[str, int]:
    return {f"{verb} {res}": n for (verb, res), n in sorted(counts.items())}
