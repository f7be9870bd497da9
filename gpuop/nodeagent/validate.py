"""Runs the validation checks in order and keeps the status files true to the node.

Once: each check in turn, stopping at the first failure (later checks depend on the
earlier ones); exit status says whether all passed. Waiting: retry the first check
not yet passing with capped exponential backoff; when all pass, keep re-running the
cheap checks so a driver that goes away or a GPU that falls off the bus takes the
status files (and the pod's readiness) with it. On shutdown every file is removed.

A check never crashes the runner: an exception becomes a failed check.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from gpuop.log import get_logger
from gpuop.nodeagent.checks import Check, CheckResult
from gpuop.nodeagent.status import StatusFiles
from gpuop.nodeagent.timing import sleep_or_stop

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Backoff:
    initial_s: float = 1.0
    maximum_s: float = 30.0
    factor: float = 2.0

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt`` (0-based)."""
        return float(min(self.maximum_s, self.initial_s * self.factor ** min(attempt, 64)))


class Validator:
    def __init__(
        self,
        checks: Sequence[Check],
        status: StatusFiles,
        *,
        backoff: Backoff | None = None,
        recheck_interval_s: float = 60.0,
    ) -> None:
        self.checks = list(checks)
        self.status = status
        self.backoff = backoff or Backoff()
        self.recheck_interval_s = recheck_interval_s
        self.passed: set[str] = set()
        self.last: dict[str, CheckResult] = {}
        self.companions: dict[str, tuple[str, ...]] = {}

    async def _run(self, check: Check) -> CheckResult:
        try:
            result = await check.run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug or an API outage must not crash the pod
            result = CheckResult.failed(f"{type(exc).__name__}: {exc}")
        previous = self.last.get(check.name)
        self.last[check.name] = result
        if result.ok:
            for gone in set(self.companions.get(check.name, ())) - set(result.companions):
                self.status.remove(gone)
            for companion in result.companions:
                self.status.write(companion, {})
            self.companions[check.name] = result.companions
            self.status.write(check.name, result.fields)
            self.passed.add(check.name)
            if previous is None or not previous.ok:
                log.info("check passed", check=check.name, **{**result.fields, **result.facts})
        else:
            self._invalidate(check)
            log.warning("check failed", check=check.name, reason=result.reason)
        return result

    def _invalidate(self, check: Check) -> None:
        """A failed check takes its own file and those of every later check with it."""
        start = self.checks.index(check)
        for later in self.checks[start:]:
            self._remove(later.name)

    def _remove(self, name: str) -> None:
        self.status.remove(name)
        for companion in self.companions.pop(name, ()):
            self.status.remove(companion)
        self.passed.discard(name)

    def remove_all(self) -> None:
        for check in self.checks:
            self._remove(check.name)

    async def run_once(self) -> bool:
        """Every check in order, stopping at the first failure."""
        for check in self.checks:
            if not (await self._run(check)).ok:
                return False
        return True

    def _first_pending(self) -> Check | None:
        return next((c for c in self.checks if c.name not in self.passed), None)

    async def run_wait(self, stop: asyncio.Event) -> None:
        """Until ``stop`` is set: bring every check to passing, then keep it so."""
        attempt = 0
        try:
            while not stop.is_set():
                pending = self._first_pending()
                if pending is not None:
                    if (await self._run(pending)).ok:
                        attempt = 0
                        continue
                    delay = self.backoff.delay(attempt)
                    attempt += 1
                    log.info("retrying", check=pending.name, in_seconds=delay)
                    await sleep_or_stop(stop, delay)
                    continue
                log.info("all checks passed", checks=[c.name for c in self.checks])
                while not stop.is_set() and self._first_pending() is None:
                    if self.recheck_interval_s <= 0:
                        await stop.wait()
                        break
                    await sleep_or_stop(stop, self.recheck_interval_s)
                    if not stop.is_set():
                        await self._recheck()
        finally:
            self.remove_all()
            log.info("status files removed", directory=str(self.status.directory))

    async def _recheck(self) -> None:
        for check in self.checks:
            if check.recheck and not (await self._run(check)).ok:
                return
