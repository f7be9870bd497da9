"""Maintenance windows: the cron reading, time zones and DST, windows across midnight,
what a closed or invalid window holds (only nodes waiting to start), and when the
fleet pass is asked to look again."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from statemachine import BudgetNode, UpgradeState, select_nodes
from statemachine.cron import Cron, CronError
from statemachine.maintenance_window import (
    CLOSED,
    INVALID,
    OPEN,
    OPENING_MARGIN_S,
    TIMEZONE_ANNOTATION,
    WINDOWS_ANNOTATION,
    parse_schedule,
    plan_windows,
    window_status,
)

BERLIN = ZoneInfo("Europe/Berlin")


def at(text: str, zone: ZoneInfo | None = None) -> float:
    """An ISO wall time in ``zone`` (UTC without one) as epoch seconds."""
    return datetime.fromisoformat(text).replace(tzinfo=zone or UTC).timestamp()


def utc(instant: float | None) -> str:
    assert instant is not None
    return datetime.fromtimestamp(instant, UTC).strftime("%Y-%m-%d %H:%M")


def windows(text: str, zone: str | None = None) -> dict[str, str]:
    annotations = {WINDOWS_ANNOTATION: text}
    if zone is not None:
        annotations[TIMEZONE_ANNOTATION] = zone
    return annotations


# ------------------------------------------------------------------ cron reading
def test_cron_fields_names_ranges_steps_and_macros() -> None:
    cron = Cron.parse("*/15 22-23,0 * jan-mar,DEC mon-fri")
    assert cron.minutes == (0, 15, 30, 45)
    assert cron.hours == (0, 22, 23)
    assert cron.months == frozenset({1, 2, 3, 12})
    assert cron.weekdays == frozenset({1, 2, 3, 4, 5})
    assert Cron.parse("0 0 * * 7").weekdays == frozenset({0})  # 7 is Sunday too
    assert Cron.parse("5/20 * * * *").minutes == (5, 25, 45)
    assert Cron.parse("@weekly").weekdays == frozenset({0})


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("0 24 * * *", "outside 0-23"),
        ("60 * * * *", "outside 0-59"),
        ("0 0 * 13 *", "outside 1-12"),
        ("0 0 * * 8", "outside 0-7"),
        ("0 5-1 * * *", "backwards"),
        ("*/0 * * * *", "step"),
        ("0 0 * *", "5 fields"),
        ("x 0 * * *", "not a number"),
        ("0 0 31 2 *", "never fires"),
        ("0 0 30,31 feb *", "never fires"),
    ],
)
def test_unreadable_crons_say_why(text: str, why: str) -> None:
    with pytest.raises(CronError, match=why):
        Cron.parse(text)


def test_both_day_fields_restricted_match_either_as_in_cron() -> None:
    either = Cron.parse("0 0 1 * mon")  # the 1st, and every Monday
    assert either.matches_day(datetime(2026, 12, 1).date())  # a Tuesday, the 1st
    assert either.matches_day(datetime(2026, 12, 7).date())  # a Monday
    assert not either.matches_day(datetime(2026, 12, 8).date())
    both = Cron.parse("0 0 */2 * mon")  # a starred day field: both must match
    assert both.matches_day(datetime(2026, 12, 7).date())  # Monday the 7th
    assert not both.matches_day(datetime(2026, 12, 14).date())  # Monday the 14th
    assert Cron.parse("0 0 29 2 *").next_fire(at("2026-03-01 00:00"), UTC) == at("2028-02-29 00:00")


# ------------------------------------------------------------------ time zones and DST
def test_a_window_is_read_in_its_time_zone_summer_and_winter() -> None:
    cron = Cron.parse("0 22 * * *")
    assert utc(cron.next_fire(at("2026-07-01 12:00"), BERLIN)) == "2026-07-01 20:00"  # CEST
    assert utc(cron.next_fire(at("2026-12-01 12:00"), BERLIN)) == "2026-12-01 21:00"  # CET
    assert utc(cron.next_fire(at("2026-12-01 12:00"), UTC)) == "2026-12-01 22:00"


def test_a_start_in_the_spring_forward_gap_opens_late_never_lost() -> None:
    # Berlin, 2026-03-29: 02:00 CET jumps to 03:00 CEST; 02:30 never shows on a clock.
    cron = Cron.parse("30 2 * * *")
    start = cron.next_fire(at("2026-03-29 00:00", BERLIN), BERLIN)
    assert utc(start) == "2026-03-29 01:30"  # 03:30 CEST: as if the clock had not jumped
    assert start is not None
    assert utc(cron.next_fire(start + 1, BERLIN)) == "2026-03-30 00:30"  # 02:30 CEST


def test_a_start_in_the_repeated_fall_back_hour_opens_once() -> None:
    # Berlin, 2026-10-25: 03:00 CEST falls back to 02:00 CET; 02:30 happens twice.
    cron = Cron.parse("30 2 * * *")
    first = cron.next_fire(at("2026-10-25 00:00", BERLIN), BERLIN)
    assert utc(first) == "2026-10-25 00:30"  # 02:30 CEST, the first occurrence
    assert first is not None
    assert utc(cron.next_fire(first + 1, BERLIN)) == "2026-10-26 01:30"  # not 01:30 the 25th
    assert cron.previous_fire(at("2026-10-25 02:00"), BERLIN) == first


def test_a_window_lasts_its_duration_in_real_time_across_a_dst_change() -> None:
    # 00:00 CEST + 4h on the fall-back night ends at 03:00 CET (4 hours later, not 04:00).
    schedule = parse_schedule(windows("0 0 * * * 4h", "Europe/Berlin"))
    assert schedule is not None
    state = schedule.state(at("2026-10-25 01:00", BERLIN))
    assert state.open
    assert state.closes_at == at("2026-10-24 22:00") + 4 * 3600
    assert datetime.fromtimestamp(state.closes_at, BERLIN).hour == 3


# ------------------------------------------------------------------ windows
def test_a_window_across_midnight() -> None:
    annotations = windows("0 22 * * * 4h")
    late = plan_windows(annotations, ["n"], at("2026-12-01 23:00"))
    assert late.reason == OPEN
    assert not late.held
    assert "until 2026-12-02 02:00 UTC" in late.message
    early = plan_windows(annotations, ["n"], at("2026-12-02 01:59"))
    assert early.reason == OPEN
    closed = plan_windows(annotations, ["n"], at("2026-12-02 02:00"))  # closing is exclusive
    assert closed.reason == CLOSED
    assert "next opens 2026-12-02 22:00 UTC for 4h" in closed.message
    opening = plan_windows(annotations, ["n"], at("2026-12-02 22:00"))  # opening inclusive
    assert opening.reason == OPEN


def test_windows_that_adjoin_or_overlap_are_one_span() -> None:
    weekend = windows("0 22 * * fri 6h; 0 0 * * sat 2d", "Europe/Berlin")
    friday = at("2026-11-27 23:00", BERLIN)
    state = parse_schedule(weekend).state(friday)  # type: ignore[union-attr]
    assert state.open
    assert state.closes_at == at("2026-11-30 00:00", BERLIN)  # Monday 00:00, not Sat 04:00
    assert state.next_opens_at == at("2026-12-04 22:00", BERLIN)
    always = plan_windows(windows("0 0 * * * 12h\n0 12 * * * 12h"), ["n"], friday)
    assert always.reason == OPEN
    assert always.requeue_after is None
    assert "no end computed" in always.message
    every_minute = plan_windows(windows("* * * * * 1m"), ["n"], friday)  # 48 merges, then stop
    assert every_minute.reason == OPEN
    assert every_minute.state is not None
    assert every_minute.state.closes_at is None


def test_a_closed_window_holds_waiting_nodes_and_asks_to_look_again_when_it_opens() -> None:
    now = at("2026-12-01 12:00")
    decision = plan_windows(windows("0 22 * * * 4h"), ["b", "a"], now)
    assert decision.reason == CLOSED
    assert set(decision.held) == {"a", "b"}
    assert decision.requeue_after == at("2026-12-01 22:00") - now + OPENING_MARGIN_S
    # Nothing waits: no timer (an idle operator is not woken for a window).
    assert plan_windows(windows("0 22 * * * 4h"), [], now).requeue_after is None
    # While open with nodes waiting, the pass looks again when it closes.
    inside = at("2026-12-01 23:00")
    opened = plan_windows(windows("0 22 * * * 4h"), ["a"], inside)
    assert opened.requeue_after == at("2026-12-02 02:00") - inside + OPENING_MARGIN_S


def test_a_window_holds_only_starts_so_a_node_under_way_finishes() -> None:
    """The window's holds feed the budget, which only ever starts `upgrade-required`
    nodes: a node already cordoned for its upgrade is not a candidate and keeps going
    (node passes carry it on), while the queued one waits for the window."""
    decision = plan_windows(windows("0 22 * * * 4h"), ["queued"], at("2026-12-01 12:00"))
    fleet = [
        BudgetNode("moving", UpgradeState.DRAIN_REQUIRED, unschedulable=True),
        BudgetNode("queued", UpgradeState.UPGRADE_REQUIRED),
    ]
    held = decision.merged({"other": "canary"})
    assert held["queued"] == decision.message
    assert held["other"] == "canary"
    selection = select_nodes(fleet, max_parallel_upgrades=0, max_unavailable="100%", held=held)
    assert selection.start == ()
    assert selection.blocked == {"queued": decision.message}
    assert selection.in_progress == 1  # the node under way keeps its slot
    opened = plan_windows(windows("0 22 * * * 4h"), ["queued"], at("2026-12-01 22:30"))
    selection = select_nodes(
        fleet, max_parallel_upgrades=0, max_unavailable="100%", held=opened.merged(None)
    )
    assert selection.start == ("queued",)


@pytest.mark.parametrize(
    ("annotations", "why"),
    [
        (windows("0 22 * * *"), "a cron expression and a duration"),
        (windows("0 22 * * * 4x"), "duration '4x'"),
        (windows("0 22 * * * 32d"), "at most 31d"),
        (windows(" ; "), "declares no window"),
        (windows("0 99 * * * 1h"), "outside 0-23"),
        (windows("@daily 1h", "Mars/Olympus"), "not an IANA time zone"),
    ],
)
def test_an_invalid_window_holds_every_start_and_names_the_annotation(
    annotations: dict[str, str], why: str
) -> None:
    decision = plan_windows(annotations, ["a"], at("2026-12-01 12:00"))
    assert decision.reason == INVALID
    assert why in decision.message
    assert "gpuop.io/driver-upgrade-windows" in decision.message
    assert decision.held == {"a": decision.message}
    assert decision.requeue_after is None  # fixing the annotation wakes the pass


def test_no_windows_declared_holds_nothing() -> None:
    decision = plan_windows({TIMEZONE_ANNOTATION: "Europe/Berlin"}, ["a"], 0.0)
    assert not decision.configured
    assert decision.is_open
    assert not decision.held
    assert window_status({}, 0.0) is None


def test_the_report_view_names_the_next_window_in_utc_and_its_zone() -> None:
    status = window_status(windows("0 22 * * 1-5 6h", "Europe/Berlin"), at("2026-12-05 12:00"))
    assert status is not None
    assert status["state"] == CLOSED
    assert status["nextOpensAt"] == "2026-12-07T21:00:00+00:00"  # Monday 22:00 CET
    assert "2026-12-07 22:00 Europe/Berlin for 6h" in str(status["message"])
