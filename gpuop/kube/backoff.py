"""Capped exponential backoff with jitter: the one policy every retrying loop uses.

The cap is applied to the exponent before anything is computed, so a key that has
failed for days still gets a delay (``0.2 * 2**1024`` is not a float: the work queue
used to die at failure 1,025). Jitter spreads loops that failed together (every
informer when the API server restarts) so they do not come back in lockstep. The
jitter only shortens a delay, so ``cap`` is a hard upper bound.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

#: 2**64 times any sensible base is far past any cap; larger exponents add nothing.
_MAX_EXPONENT = 64


@dataclass(frozen=True)
class Backoff:
    """Delays ``base, 2*base, 4*base, ...`` up to ``cap``, each shortened by up to ``jitter``."""

    base: float
    cap: float
    jitter: float = 0.25

    def ceiling(self, attempt: int) -> float:
        """The delay before retry ``attempt`` (1-based) without jitter."""
        exponent = min(max(attempt, 1) - 1, _MAX_EXPONENT)
        return min(self.cap, self.base * 2.0**exponent)

    def delay(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """The jittered delay: in ``[ceiling * (1 - jitter), ceiling]``."""
        return self.ceiling(attempt) * (1.0 - self.jitter * rand())


class Retry:
    """A loop's consecutive-failure count with its backoff: ``failed()`` gives the
    next delay, ``succeeded()`` starts over."""

    def __init__(self, policy: Backoff) -> None:
        self.policy = policy
        self.failures = 0

    def failed(self) -> float:
        self.failures += 1
        return self.policy.delay(self.failures)

    def succeeded(self) -> None:
        self.failures = 0
