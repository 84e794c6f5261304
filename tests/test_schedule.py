"""Schedule entries without Redis: fire times of cron specs in a timezone across DST
changes, intervals, what a scheduler does with fires it reaches late, the checks that
refuse a bad entry before anything is written, and the scheduler's settings."""

from __future__ import annotations

from datetime import datetime

import pytest

import obsq
from obsq.errors import ConfigurationError
from obsq.schedule import FIRE_HEADER, SCHEDULE_HEADER, Plan, Schedule, fire_text
from obsq.settings import SchedulerSettings


def ms(text: str) -> int:
    """'2024-03-31T01:00Z' -> epoch milliseconds."""
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def fires(spec: str, zone: str, start: str, until: str) -> list[str]:
    """Every fire of `spec` in `zone` after `start` up to `until`, in UTC."""
    entry = Schedule("e", spec, "t", timezone=zone)
    out, fire = [], entry.next_after(ms(start))
    while fire <= ms(until):
        out.append(fire_text(fire))
        fire = entry.next_after(fire)
    return out


# -- cron specs across DST changes (Europe/Paris: +01:00, +02:00 from 2024-03-31 02:00 to
# 2024-10-27 03:00 local time) --------------------------------------------------------------


def test_a_daily_time_keeps_its_local_time_across_both_changes() -> None:
    assert fires("0 3 * * *", "Europe/Paris", "2024-03-29T12:00Z", "2024-04-01T12:00Z") == [
        "2024-03-30T02:00:00Z", "2024-03-31T01:00:00Z", "2024-04-01T01:00:00Z"]
    assert fires("0 3 * * *", "Europe/Paris", "2024-10-25T12:00Z", "2024-10-28T12:00Z") == [
        "2024-10-26T01:00:00Z", "2024-10-27T02:00:00Z", "2024-10-28T02:00:00Z"]


def test_a_time_the_clocks_skip_fires_once_when_they_jump() -> None:
    # 02:30 does not exist on 2024-03-31: it fires at 03:00 local, 01:00 UTC
    assert fires("30 2 * * *", "Europe/Paris", "2024-03-29T12:00Z", "2024-04-01T12:00Z") == [
        "2024-03-30T01:30:00Z", "2024-03-31T01:00:00Z", "2024-04-01T00:30:00Z"]


def test_a_time_the_clocks_repeat_fires_once_at_its_first_pass() -> None:
    # 02:30 happens twice on 2024-10-27 (00:30 and 01:30 UTC): once is enough
    assert fires("30 2 * * *", "Europe/Paris", "2024-10-25T12:00Z", "2024-10-28T12:00Z") == [
        "2024-10-26T00:30:00Z", "2024-10-27T00:30:00Z", "2024-10-28T01:30:00Z"]
    assert fires("*/30 2 * * *", "Europe/Paris", "2024-10-26T22:00Z", "2024-10-27T03:00Z") == [
        "2024-10-27T00:00:00Z", "2024-10-27T00:30:00Z"]
    assert fires("30 1 * * *", "America/New_York", "2024-11-02T12:00Z",
                 "2024-11-04T12:00Z") == ["2024-11-03T05:30:00Z", "2024-11-04T06:30:00Z"]


def test_a_spec_that_runs_every_hour_runs_every_real_hour() -> None:
    # the day the clocks go back has 25 hours, the day they go forward 23
    assert len(fires("0 * * * *", "Europe/Paris", "2024-10-26T21:59Z",
                     "2024-10-27T22:59Z")) == 25
    assert fires("0 * * * *", "Europe/Paris", "2024-10-26T23:30Z", "2024-10-27T02:30Z") == [
        "2024-10-27T00:00:00Z", "2024-10-27T01:00:00Z", "2024-10-27T02:00:00Z"]
    assert len(fires("0 * * * *", "Europe/Paris", "2024-03-30T22:59Z",
                     "2024-03-31T21:59Z")) == 23


def test_cron_fires_in_utc_by_default() -> None:
    assert fires("0 3 * * *", "UTC", "2024-03-30T12:00Z", "2024-04-01T12:00Z") == [
        "2024-03-31T03:00:00Z", "2024-04-01T03:00:00Z"]


# -- intervals and late fires ---------------------------------------------------------------


def test_intervals_count_from_the_last_fire() -> None:
    entry = Schedule("e", "@every 1.5s", "t")
    assert entry.every_ms == 1500
    assert entry.next_after(1000) == 2500
    for spec, every_ms in [("@every 250ms", 250), ("@every 1.5m", 90_000),
                           ("@every 2h", 7_200_000), ("@every 1d", 86_400_000),
                           ("@every 30", 30_000)]:
        assert Schedule("e", spec, "t").every_ms == every_ms


def test_fires_reached_in_time_are_all_enqueued() -> None:
    entry = Schedule("e", "@every 1s", "t", missed="skip")
    # a takeover 7 s late is within missed_after (15 s): every fire goes out, late
    assert entry.plan(1000, 8_500, 15_000) == Plan(0, None, tuple(range(1000, 8001, 1000)),
                                                   9000)
    assert entry.plan(1000, 1000, 15_000) == Plan(0, None, (1000,), 2000)


def test_missed_fires_are_skipped_or_caught_up_once() -> None:
    # the schedulers were down from 3 s to 20.5 s: the fires of 3 s to 18 s are missed
    skip = Schedule("e", "@every 3s", "t", missed="skip")
    assert skip.plan(3000, 20_500, 1000) == Plan(6, None, (), 21_000)
    once = Schedule("e", "@every 3s", "t", missed="once")
    assert once.plan(3000, 20_500, 1000) == Plan(5, 18_000, (), 21_000)
    # those still within missed_after go out as usual, after the catch-up
    assert once.plan(3000, 20_500, 5000) == Plan(4, 15_000, (18_000,), 21_000)


def test_a_long_outage_is_counted_without_walking_every_fire() -> None:
    every = Schedule("e", "@every 1s", "t", missed="once")
    assert every.plan(0, 30 * 86_400_000, 15_000) == Plan(
        30 * 86_400 - 16, 30 * 86_400_000 - 16_000, tuple(range(30 * 86_400_000 - 15_000,
                                                                 30 * 86_400_000 + 1, 1000)),
        30 * 86_400_000 + 1000)
    cron = Schedule("e", "* * * * * *", "t", missed="once")  # every second
    start, now = ms("2024-01-01T00:00Z"), ms("2024-01-02T00:00Z")
    plan = cron.plan(start, now, 15_000)
    assert plan.missed == 10_000 - 1  # counted up to SCHEDULE_COUNT_LIMIT
    assert plan.catch_up == now - 16_000  # the latest missed fire all the same
    assert plan.fires[0] == now - 15_000 and plan.following == now + 1000


# -- the task of a fire ---------------------------------------------------------------------


def test_each_fire_has_its_own_task_id_and_headers() -> None:
    entry = Schedule("nightly", "0 3 * * *", "report:nightly", {"m": 1},
                     options={"queue": "reports", "headers": {"tenant": "t1"}})
    fire = ms("2026-03-01T02:00Z")
    assert entry.task_id(fire) == "nightly@2026-03-01T02:00:00Z"
    assert entry.task_id(fire + 250) == "nightly@2026-03-01T02:00:00.250Z"
    assert entry.enqueue_options(fire, min_retention=15) == {
        "queue": "reports", "task_id": "nightly@2026-03-01T02:00:00Z", "retention": 15,
        "headers": {"tenant": "t1", SCHEDULE_HEADER: "nightly",
                    FIRE_HEADER: "2026-03-01T02:00:00Z"}}
    kept = Schedule("e", "@every 1s", "t", options={"retention": 3600})
    assert kept.enqueue_options(0, min_retention=15)["retention"] == 3600


def test_the_stored_form_is_canonical_and_read_back() -> None:
    a = Schedule("e", "@every 1s", "t", {"b": 1, "a": 2}, options={"queue": "q", "max_retry": 1})
    b = Schedule("e", "@every 1s", "t", {"a": 2, "b": 1}, options={"max_retry": 1, "queue": "q"})
    assert a.encoded() == b.encoded() and a.digest == b.digest
    assert Schedule.decode("e", a.encoded()) == a


@pytest.mark.parametrize(("raw", "why"), [
    (b"not json", "not valid"), (b"[1, 2]", "not a JSON object"), (b'{"spec": "@every 1s"}',
                                                                    "has no 'type'"),
    (b'{"spec": "@every 1s", "type": "t", "timezone": "Mars/Olympus"}', "unknown timezone"),
    (b'{"spec": "nope", "type": "t"}', "neither a cron spec"),
    (b'{"spec": "@every 1s", "type": "t", "options": {"task_id": "x"}}', "scheduler sets it")])
def test_a_tampered_entry_does_not_decode(raw: bytes, why: str) -> None:
    with pytest.raises(ValueError, match="schedule 'e' in Redis is not valid") as caught:
        Schedule.decode("e", raw)
    assert why in str(caught.value)


# -- bad entries are refused ----------------------------------------------------------------


@pytest.mark.parametrize(("change", "error", "message"), [
    ({"name": "a{b}"}, ValueError, "without braces"),
    ({"name": "a b"}, ValueError, "must not contain spaces"),
    ({"name": "x" * 101}, ValueError, "longer than 100"),
    ({"timezone": "Europe/Pariss"}, ValueError, "unknown timezone 'Europe/Pariss'"),
    ({"timezone": "../../etc/passwd"}, ValueError, "unknown timezone"),
    ({"spec": "61 * * * *"}, ValueError, "neither a cron spec"),
    ({"spec": "0 0 30 2 *"}, ValueError, "never fires"),
    ({"spec": "@every soon"}, ValueError, "not an interval"),
    ({"spec": "@every 10ms"}, ValueError, "at least 0.1 s"),
    ({"spec": "@every 0s"}, ValueError, "at least 0.1 s"),
    ({"spec": "@every -1s"}, ValueError, "at least 0.1 s"),
    ({"missed": "twice"}, ValueError, "missed must be one of skip, once"),
    ({"task_type": "a{b}"}, ValueError, "task type"),
    ({"payload": float("nan")}, ValueError, "NaN"),
    ({"payload": object()}, TypeError, "not JSON-serializable"),
    ({"options": {"task_id": "x"}}, ValueError, "the scheduler sets it"),
    ({"options": {"delay": 5}}, ValueError, "the scheduler sets it"),
    ({"options": {"quue": "x"}}, TypeError, "unknown schedule option 'quue'"),
    ({"options": {"queue": "a{b}"}}, ValueError, "queue"),
    ({"options": {"max_retry": -1}}, ValueError, "max_retry"),
    ({"options": {"expires": "1h"}}, TypeError, "a schedule's expires is seconds"),
    ({"options": {"expires": 0}}, ValueError, "expires must be"),
])
def test_bad_entries_are_refused(change: dict, error: type, message: str) -> None:
    fields = {"name": "nightly", "spec": "0 3 * * *", "task_type": "report:nightly",
              **change}
    with pytest.raises(error, match=message.replace("{", r"\{").replace(".", r"\.")):
        Schedule(**fields)


def test_a_schedule_takes_an_expiry_in_seconds() -> None:
    entry = Schedule(name="quotes", spec="@every 1m", task_type="quote:refresh",
                     options={"expires": 50})
    assert entry.options == {"expires": 50}


def test_app_periodic_names_its_entries() -> None:
    app = obsq.App()
    entry = app.periodic("0 3 * * *", "report:nightly", {"m": "last"}, timezone="Europe/Paris",
                         missed="skip", queue="reports")
    assert app.schedules == {"report:nightly": entry} and entry.source == "app"
    assert entry.options == {"queue": "reports"}
    with pytest.raises(ValueError, match="already registered; give each a name="):
        app.periodic("@every 1h", "report:nightly")
    app.periodic("@every 1h", "report:nightly", name="hourly-report")
    assert sorted(app.schedules) == ["hourly-report", "report:nightly"]


def test_fire_times_are_iso_8601_in_utc() -> None:
    assert fire_text(0) == "1970-01-01T00:00:00Z"
    assert fire_text(ms("2026-03-01T02:00Z") + 5) == "2026-03-01T02:00:00.005Z"


def test_scheduler_settings_come_from_the_environment_and_are_checked() -> None:
    settings = SchedulerSettings.from_env({"OBSQ_LOCK_TTL": "1", "OBSQ_MISSED_AFTER": "2.5",
                                           "OBSQ_CONCURRENCY": "7"})
    assert (settings.lock_ttl, settings.missed_after) == (1.0, 2.5)
    assert SchedulerSettings() == SchedulerSettings(lock_ttl=5.0, missed_after=15.0)
    with pytest.raises(ConfigurationError, match=r"at least 1\.5 times lock_ttl"):
        SchedulerSettings(lock_ttl=11.0)  # a failover's fires would count as missed
    with pytest.raises(ConfigurationError, match="OBSQ_MISSED_AFTER"):
        SchedulerSettings.from_env({"OBSQ_MISSED_AFTER": "soon"})
