"""Maintenance windows: when the fleet pass may start driver upgrades (gpuop extension).

Declared as annotations on the ClusterPolicy or an NVIDIADriver, each for its own nodes
(upstream's CRDs have no field for it, so upstream YAML keeps applying unchanged):

    gpuop.io/driver-upgrade-windows: "0 22 * * 1-5 6h; 0 0 * * 6 2d"
    gpuop.io/driver-upgrade-windows-timezone: Europe/Berlin     # default UTC

Each entry is a cron expression (`statemachine.cron`) and how long the window stays
open from each firing (`90m`, `6h`, `1h30m`, `2d`; real time, so a window across a DST
change is as long as it says). The windows are a union. A window only gates *starts*:
outside every window no `upgrade-required` node is granted a slot, while a node already
under way (cordon-required onwards) finishes, since leaving it cordoned half-upgraded
helps nobody. An annotation that cannot be read holds every start (safe: a typo must
not turn into "upgrade any time") and is reported, never raised.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from statemachine.cron import Cron, CronError

WINDOWS_ANNOTATION = "gpuop.io/driver-upgrade-windows"
TIMEZONE_ANNOTATION = "gpuop.io/driver-upgrade-windows-timezone"
#: Longest window one entry may declare (a longer one is "always", say so instead).
MAX_DURATION_S = 31 * 86400
#: A timer set for a window's opening fires this much after it, never just before.
OPENING_MARGIN_S = 1.0
#: Reasons of the `DriverUpgradeWindow` condition.
OPEN, CLOSED, INVALID = "WindowOpen", "WindowClosed", "InvalidWindow"
_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?$")
#: How far ahead `closes_at` merges adjoining windows, and at most how many: a span
#: open longer is reported as open with no end (`* * * * * 1h` is always open).
MERGE_HORIZON_S = 7 * 86400
MERGE_LIMIT = 48


class WindowError(ValueError):
    """The annotations do not declare readable windows; the message names them."""


def _duration(text: str) -> int:
    found = _DURATION.match(text)
    if not text or found is None:
        raise WindowError(f"duration {text!r}: want e.g. 90m, 6h, 1h30m or 2d")
    days, hours, minutes = (int(g) if g else 0 for g in found.groups())
    seconds = days * 86400 + hours * 3600 + minutes * 60
    if not 0 < seconds <= MAX_DURATION_S:
        raise WindowError(f"duration {text!r}: must be more than 0 and at most 31d")
    return seconds


def _human(seconds: int) -> str:
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    parts = [f"{days}d" if days else "", f"{hours}h" if hours else ""]
    parts.append(f"{rest // 60}m" if rest else "")
    return "".join(parts)


@dataclass(frozen=True)
class Window:
    """One entry: opens whenever `cron` fires, for `duration_s` seconds."""

    cron: Cron
    duration_s: int

    @classmethod
    def parse(cls, text: str) -> Window:
        words = text.split()
        if not words:
            raise WindowError("empty entry")
        cron_words = 1 if words[0].startswith("@") else 5
        if len(words) != cron_words + 1:
            raise WindowError(f"{text.strip()!r}: want a cron expression and a duration")
        try:
            cron = Cron.parse(" ".join(words[:cron_words]))
        except CronError as err:
            raise WindowError(str(err)) from None
        return cls(cron, _duration(words[-1]))

    def describe(self) -> str:
        return f"{self.cron.text} {_human(self.duration_s)}"


@dataclass(frozen=True)
class WindowState:
    """Where the schedule stands at one instant (epoch seconds throughout)."""

    open: bool
    closes_at: float | None = None
    """While open: when the open span (windows that adjoin merged) ends; None when it
    stays open past `MERGE_HORIZON_S` or `MERGE_LIMIT` adjoining windows."""
    next_opens_at: float | None = None
    """The next window's opening after now (while open: after this span closes)."""
    next_duration_s: int = 0


@dataclass(frozen=True)
class Schedule:
    """The windows of one resource, in its time zone."""

    windows: tuple[Window, ...]
    zone: tzinfo
    zone_name: str

    def _covering_end(self, at: float) -> float | None:
        """The latest end of a window open at ``at`` (a window opening at ``at``
        counts, one closing at ``at`` does not)."""
        end: float | None = None
        for w in self.windows:
            start = w.cron.previous_fire(at, self.zone)
            if start is not None and start + w.duration_s > at:
                end = max(end or 0.0, start + w.duration_s)
        return end

    def _next_opening(self, after: float) -> tuple[float, int] | None:
        found: tuple[float, int] | None = None
        for w in self.windows:
            start = w.cron.next_fire(after, self.zone)
            if start is not None and (found is None or start < found[0]):
                found = (start, w.duration_s)
        return found

    def state(self, now: float) -> WindowState:
        end = self._covering_end(now)
        if end is None:
            nxt = self._next_opening(now)
            return WindowState(False, None, *(nxt or (None, 0)))
        for _ in range(MERGE_LIMIT):  # a window opening before it closes extends it
            if end > now + MERGE_HORIZON_S:
                break
            later = self._covering_end(end)
            if later is None or later <= end:
                nxt = self._next_opening(end + 1)
                return WindowState(True, end, *(nxt or (None, 0)))
            end = later
        return WindowState(True)

    def local(self, instant: float) -> str:
        """An instant as people in the schedule's zone read it."""
        when = datetime.fromtimestamp(instant, self.zone)
        return f"{when:%Y-%m-%d %H:%M} {self.zone_name}"

    def describe(self) -> str:
        return "; ".join(w.describe() for w in self.windows) + f" ({self.zone_name})"


def parse_schedule(annotations: Mapping[str, str]) -> Schedule | None:
    """The resource's windows; None when it declares none (upgrades start any time)."""
    text = annotations.get(WINDOWS_ANNOTATION)
    zone_name = (annotations.get(TIMEZONE_ANNOTATION) or "").strip() or "UTC"
    if text is None:
        return None
    entries = [e for e in re.split(r"[;\n]", text) if e.strip()]
    if not entries:
        raise WindowError(f"{WINDOWS_ANNOTATION} is set but declares no window")
    windows = []
    for entry in entries:
        try:
            windows.append(Window.parse(entry))
        except WindowError as err:
            raise WindowError(f"{WINDOWS_ANNOTATION}: {err}") from None
    zone: tzinfo
    if zone_name == "UTC":
        zone = UTC
    else:
        try:
            zone = ZoneInfo(zone_name)
        except (ZoneInfoNotFoundError, ValueError):
            raise WindowError(
                f"{TIMEZONE_ANNOTATION}: {zone_name!r} is not an IANA time zone"
            ) from None
    return Schedule(tuple(windows), zone, zone_name)


@dataclass(frozen=True)
class WindowDecision:
    """What the windows of one driver owner say in one fleet pass."""

    reason: str = ""
    """`WindowOpen`, `WindowClosed`, `InvalidWindow`; empty: no windows declared."""
    message: str = ""
    held: Mapping[str, str] = field(default_factory=dict)
    """Candidates (`upgrade-required` nodes) that may not start now, with why."""
    requeue_after: float | None = None
    """Seconds until the pass must look again (a window opens, or closes on waiting
    nodes); None: only news wakes it."""
    state: WindowState | None = None

    @property
    def configured(self) -> bool:
        return bool(self.reason)

    @property
    def is_open(self) -> bool:
        return self.reason in ("", OPEN)

    def merged(self, held: Mapping[str, str] | None) -> dict[str, str]:
        """The rollout gate's holds with ours (ours name the reason first)."""
        return {**(held or {}), **self.held}


def plan_windows(
    annotations: Mapping[str, str], candidates: Iterable[str], now: float
) -> WindowDecision:
    """Which of ``candidates`` the windows hold back at ``now``, and when to look again."""
    try:
        schedule = parse_schedule(annotations)
    except WindowError as err:
        why = f"invalid maintenance window ({err}); no node upgrade starts until it is fixed"
        return WindowDecision(INVALID, why, {n: why for n in candidates})
    if schedule is None:
        return WindowDecision()
    waiting = sorted(candidates)
    state = schedule.state(now)
    if state.open:
        if state.closes_at is None:
            return WindowDecision(
                OPEN,
                "maintenance window open, adjoining windows keep it open (no end computed)",
                {},
                None,
                state,
            )
        message = f"maintenance window open until {schedule.local(state.closes_at)}"
        # Waiting nodes: look again when it closes, so the condition says so in time.
        again = state.closes_at - now + OPENING_MARGIN_S if waiting else None
        return WindowDecision(OPEN, message, {}, again, state)
    if state.next_opens_at is None:
        message = f"outside the maintenance windows {schedule.describe()}; none opens again"
        again = None
    else:
        message = (
            f"outside the maintenance windows; the next opens "
            f"{schedule.local(state.next_opens_at)} for {_human(state.next_duration_s)}"
        )
        again = state.next_opens_at - now + OPENING_MARGIN_S if waiting else None
    return WindowDecision(CLOSED, message, {n: message for n in waiting}, again, state)


def window_status(annotations: Mapping[str, str], now: float) -> dict[str, object] | None:
    """The windows as the `gpuop upgrade` reports show them; None without any."""
    decision = plan_windows(annotations, (), now)
    if not decision.configured:
        return None
    status: dict[str, object] = {"state": decision.reason, "message": decision.message}
    state = decision.state
    if state is not None:
        for key, instant in (("closesAt", state.closes_at), ("nextOpensAt", state.next_opens_at)):
            if instant is not None:
                status[key] = datetime.fromtimestamp(instant, UTC).isoformat()
    return status
