"""The API server's refusals of objects we apply: what the status says of each, and when
it is sent again."""

from __future__ import annotations

import json
from dataclasses import dataclass

#: Client errors that say "try again" rather than "this object is wrong":
#: 409 conflict, 408 timeout, 425 too early, 429 throttled.
_TRANSIENT_4XX = frozenset({408, 409, 425, 429})

#: A refused object is retried after this, doubling per refusal, up to the cap; an
#: event-driven pass in between does not send it again (the answer would not change).
REFUSAL_RETRY_BASE = 10.0


REFUSAL_RETRY_CAP = 600.0


def is_refusal(status: int | None) -> bool:
    """A 4xx the same object would get again (invalid, forbidden, namespace missing).

    Transient codes and 5xx are left to the work queue's backoff instead."""
    return status is not None and 400 <= status < 500 and status not in _TRANSIENT_4XX


def server_message(reason: str | None) -> str:
    """The ``message`` of the API server's Status body, else the body as it is."""
    text = (reason or "").strip()
    try:
        body = json.loads(text)
    except ValueError:
        return text[:1000]
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return str(body["message"])[:1000]
    return text[:1000]


@dataclass(frozen=True)
class Refusal:
    """One object the API server refused, for the status and the next retry."""

    kind: str
    namespace: str | None
    name: str
    code: int
    message: str
    applied_hash: str
    attempts: int
    retry_at: float

    def describe(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.kind} {where} refused by the API server ({self.code}): {self.message}"


def refusal_delay(attempts: int, base: float = REFUSAL_RETRY_BASE) -> float:
    """Delay before sending a refused object again after ``attempts`` refusals."""
    return float(min(REFUSAL_RETRY_CAP, base * 2 ** max(0, attempts - 1)))


def refusals_message(refusals: list[Refusal], limit: int = 4000) -> str:
    """One status message naming every refused object (in apply order)."""
    return "; ".join(r.describe() for r in refusals)[:limit]
