"""Schedules on a real Redis, with schedulers running in the test's event loop: entries
added, replaced and removed at run time and picked up without a restart or polling, the
App's entries written by the scheduler, bad entries refused before anything is written,
tampered ones skipped, and each fire claimed once even by schedulers that ignore the lock.
Fires are counted on a clock the test steps (obsq.testing, or a ManualClock of its own).
The replicas as processes, SIGKILLed mid-fire and stopped through an outage, are in
test_scheduler_replicas.py."""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
from datetime import datetime, timedelta, timezone

import pytest
import redis
from support import wait_until

import obsq
from obsq.broker import ScheduleKeys
from obsq.broker.keys import QueueKeys
from obsq.clock import ManualClock
from obsq.engine.scheduler import SchedulerLoop
from obsq.inspection.inspector import Inspector
from obsq.schedule import FIRE_HEADER
from obsq.settings import SchedulerSettings

from .helpers import collides, namespace_keys, queue_key_names


@pytest.fixture
def enqueued(app: obsq.App) -> list[obsq.TaskInfo]:
    """The tasks the App's clients (the schedulers') created, in order."""
    created: list[obsq.TaskInfo] = []

    @app.use_producer
    async def record(messages, call_next):
        infos = await call_next(messages)
        created.extend(i for i in infos if not i.duplicate)
        return infos

    return created


def names(infos: list[obsq.TaskInfo], entry: str) -> list[str]:
    return [i.id for i in infos if i.id.startswith(entry + "@")]


async def test_entries_are_added_listed_replaced_and_removed(client, raw_redis,
                                                             namespace) -> None:
    entry = await client.schedule("nightly", "0 3 * * *", "report:nightly", {"m": "last"},
                                  timezone="Europe/Paris", missed="skip", queue="reports")
    assert entry.name == "nightly" and entry.source == "client"
    await client.schedule("ticker", "@every 1h", "tick")
    listed = {s.name: s for s in await client.schedules()}
    assert listed.keys() == {"nightly", "ticker"}
    nightly = listed["nightly"]
    assert (nightly.spec, nightly.type, nightly.payload, nightly.timezone, nightly.missed,
            nightly.options, nightly.source) == ("0 3 * * *", "report:nightly", {"m": "last"},
                                                 "Europe/Paris", "skip", {"queue": "reports"},
                                                 "client")
    paris = nightly.next_fire_at.astimezone(entry._zone)
    assert (paris.hour, paris.minute) == (3, 0) and nightly.last_fire_at is None
    assert nightly.fire_count == nightly.missed_count == 0 and nightly.error is None

    # the same definition again changes nothing; another one replaces it
    version = raw_redis.get(ScheduleKeys(namespace).version)
    await client.schedule("nightly", "0 3 * * *", "report:nightly", {"m": "last"},
                          timezone="Europe/Paris", missed="skip", queue="reports")
    assert raw_redis.get(ScheduleKeys(namespace).version) == version
    await client.schedule("nightly", "0 4 * * *", "report:nightly", timezone="Europe/Paris")
    nightly = {s.name: s for s in await client.schedules()}["nightly"]
    assert nightly.spec == "0 4 * * *" and nightly.missed == "once" and nightly.payload is None

    assert await client.unschedule("nightly") is True
    assert await client.unschedule("nightly") is False
    assert [s.name for s in await client.schedules()] == ["ticker"]


def test_the_sync_client_schedules_too(redis_url, namespace) -> None:
    with obsq.SyncClient(redis_url, namespace) as client:
        entry = client.schedule("hourly", "0 * * * *", "report:hourly", timezone="Asia/Tokyo",
                                missed="skip")
        assert (entry.timezone, entry.missed) == ("Asia/Tokyo", "skip")
        assert [s.name for s in client.schedules()] == ["hourly"]
        assert client.unschedule("hourly") is True and client.schedules() == []


async def test_bad_input_is_refused_before_anything_is_written(client, raw_redis,
                                                               namespace) -> None:
    for call, error, message in [
        (client.schedule("nightly", "0 3 * * *", "t", timezone="Europe/Pariss"), ValueError,
         "unknown timezone 'Europe/Pariss'"),
        (client.schedule("nightly", "0 25 * * *", "t"), ValueError, "neither a cron spec"),
        (client.schedule("nightly", "@every 1s", "t", missed="always"), ValueError,
         "missed must be one of skip, once"),
        (client.schedule("night{ly}", "@every 1s", "t"), ValueError, "without braces"),
        (client.schedule("nightly", "@every 1s", "t", task_id="x"), ValueError,
         "the scheduler sets it"),
        (client.schedule("nightly", "@every 1s", "t", urgency=3), TypeError,
         "unknown schedule option 'urgency'"),
        (client.schedule("nightly", "@every 1s", "t", {"x": float("inf")}), ValueError,
         "NaN or an infinity"),
        (client.unschedule("night{ly}"), ValueError, "without braces"),
    ]:
        with pytest.raises(error, match=message):
            await call
    assert namespace_keys(raw_redis, namespace) == []


async def test_the_scheduler_picks_up_changes_at_once_and_never_polls(
        app, private_redis, namespace, enqueued) -> None:
    """A scheduler with a 30 s lock waits up to 10 s at a time: an entry added or removed
    is seen within that only because the change wakes it; while idle it makes a few calls
    per wait, which Redis counts."""
    from obsq.engine.scheduler import Scheduler

    scheduler = Scheduler(app, private_redis.url, handle_signals=False,
                          settings=SchedulerSettings(lock_ttl=30.0, missed_after=60.0))
    running = asyncio.create_task(scheduler.run())
    admin = redis.Redis.from_url(private_redis.url)
    try:
        async with obsq.Client(private_redis.url, namespace) as client:
            await wait_until(lambda: scheduler.loop.holding, timeout=10)
            await asyncio.sleep(0.5)  # into its long wait
            await client.schedule("blink", "@every 0.5s", "blink")
            await wait_until(lambda: len(names(enqueued, "blink")) >= 3, timeout=5)

            await client.unschedule("blink")
            await wait_until(lambda: "blink" not in scheduler.loop.entries, timeout=5)

            before = _calls(admin)
            await asyncio.sleep(3)
            idle_calls = _calls(admin) - before
    finally:
        scheduler.stop()
        await running
        admin.close()
    print(f"calls to Redis by an idle scheduler in 3 s: {idle_calls}")
    assert idle_calls <= 6  # per 10 s wait: the lock, the due read and the wait itself


async def test_an_entry_removed_fires_no_more(client, start_env, enqueued) -> None:
    env = await start_env()
    await env.client.schedule("blink", "@every 0.5s", "blink")
    await env.advance(1.5)
    assert len(names(enqueued, "blink")) == 3
    await env.client.unschedule("blink")
    await env.advance(1.5)  # three more intervals: none fired
    assert len(names(enqueued, "blink")) == 3


async def test_the_app_entries_are_written_by_the_scheduler(app, client, start_scheduler,
                                                            start_env, namespace,
                                                            enqueued) -> None:
    app.periodic("@every 0.5s", "tick", {"n": 1}, name="ticker")
    app.periodic("0 3 * * *", "report:nightly", timezone="Europe/Paris")
    env = await start_env()
    await env.advance(1)
    assert len(names(enqueued, "ticker")) == 2
    listed = {s.name: s for s in await client.schedules()}
    assert {name: s.source for name, s in listed.items()} == {"ticker": "app",
                                                               "report:nightly": "app"}
    assert listed["ticker"].fire_count == 2 and listed["ticker"].last_fire_at is not None
    task = await client.info(names(enqueued, "ticker")[0])
    assert task.payload == {"n": 1} and task.headers["obsq-schedule"] == "ticker"
    assert task.id == f"ticker@{task.headers[FIRE_HEADER]}"
    with pytest.raises(ValueError, match="defined by the App's code"):
        await client.schedule("ticker", "@every 1s", "tick")
    with pytest.raises(ValueError, match="defined by the App's code"):
        await client.unschedule("report:nightly")

    # a scheduler of a newer version of the code, without the nightly report, removes it
    await env.scheduler.loop.stop()
    newer = obsq.App(namespace=namespace)
    newer.periodic("@every 0.5s", "tick", {"n": 1}, name="ticker")
    await start_scheduler(newer)
    await wait_until(lambda: _names(client, {"ticker"}), timeout=10)


async def test_a_tampered_entry_is_logged_and_skipped(client, start_env, raw_redis,
                                                      namespace, enqueued, caplog) -> None:
    caplog.set_level(logging.INFO, "obsq")
    keys = ScheduleKeys(namespace)
    await client.schedule("good", "@every 0.5s", "tick")
    await client.schedule("victim", "@every 0.5s", "tick")
    raw_redis.hset(keys.entries, "victim", b'{"spec": "@every 0.5s", "type": "t{x}"}')
    raw_redis.hset(keys.firing, "ghost", b"not a claim")
    env = await start_env()
    await env.advance(1.5)
    assert len(names(enqueued, "good")) == 3
    assert names(enqueued, "victim") == []
    assert raw_redis.zscore(keys.next, "victim") == float("inf")  # parked
    assert raw_redis.hexists(keys.firing, "ghost") is False
    assert "schedule 'victim' in Redis is not valid" in caplog.text
    assert "schedule ghost: a claimed fire in Redis is not readable" in caplog.text
    victim = {s.name: s for s in await client.schedules()}["victim"]
    assert victim.next_fire_at is None and "task type" in victim.error

    # written again properly, it fires
    raw_redis.hset(keys.entries, "wreck", b"\xff\xfe")
    await client.schedule("victim", "@every 0.5s", "tick")
    await env.advance(0.5)
    assert len(names(enqueued, "victim")) == 1
    assert not env.scheduler.loop.failures
    assert caplog.text.count("schedule 'victim' in Redis is not valid") == 1


async def test_claims_alone_keep_each_fire_once(app, redis_url, namespace, enqueued) -> None:
    """Three schedulers that skip the lock and run their rounds at once, as replicas do
    when a paused one wakes up believing it still holds it: 40 rounds, 50 ms apart on their
    shared clock."""
    clock = ManualClock()
    settings = SchedulerSettings(lock_ttl=1.0)
    clients = [obsq.Client(redis_url, namespace, app=app, clock=clock) for _ in range(3)]
    client = clients[0]
    await client.schedule("busy", "@every 0.1s", "tick")
    loops = [SchedulerLoop(c, {}, f"rogue-{i}", settings) for i, c in enumerate(clients)]
    try:
        for _ in range(40):
            await asyncio.gather(*(loop.work() for loop in loops))
            clock.set(clock.now_ms + 50)
        fires = sorted(_fire_time(i) for i in enqueued)
        listed = {s.name: s for s in await client.schedules()}["busy"]
    finally:
        for c in clients:
            await c.close()
    counts = collections.Counter(fires)
    assert len(fires) == 19 and max(counts.values()) == 1, counts.most_common(3)
    assert {b - a for a, b in itertools.pairwise(fires)} == {100}  # no gap
    assert listed.fire_count == len(fires)


async def test_fires_due_together_are_claimed_and_enqueued_as_one_batch(
        app, redis_url, namespace, monkeypatch) -> None:
    """A round that comes late (within missed_after) finds several fires of an entry due:
    one claim, one enqueue of their tasks, each under its own id. A claim whose enqueue
    failed (Redis away) is finished whole in a later round, each fire once."""
    clock = ManualClock()
    batches: list[list[obsq.TaskInfo]] = []

    @app.use_producer
    async def record(messages, call_next):
        infos = await call_next(messages)
        batches.append(infos)
        return infos

    async def redis_away(jobs):
        raise obsq.BrokerError("enqueue", ConnectionError("Connection refused"))

    async with obsq.Client(redis_url, namespace, app=app, clock=clock) as client:
        await client.schedule("busy", "@every 1s", "tick")
        loop = SchedulerLoop(client, {}, "scheduler", SchedulerSettings(lock_ttl=1.0,
                                                                        missed_after=10))
        await loop.work()  # picks the entry up: its first fire within a second
        clock.set(clock.now_ms + 5000)
        await loop.work()
        assert [len(b) for b in batches] == [5]
        clock.set(clock.now_ms + 3000)
        with monkeypatch.context() as patched:
            patched.setattr(client, "enqueue_many", redis_away)
            with pytest.raises(obsq.BrokerError):
                await loop.work()  # three fires claimed, their enqueue failed
        await loop.work()
        listed = {s.name: s for s in await client.schedules()}["busy"]
    assert [len(b) for b in batches] == [5, 3]
    fires = [_fire_time(i) for b in batches for i in b]
    assert not any(i.duplicate for b in batches for i in b)
    assert {b - a for a, b in itertools.pairwise(fires)} == {1000}
    assert (listed.fire_count, listed.missed_count) == (8, 0)


async def test_the_inspector_shows_every_entry(client, start_env, redis_url,
                                               namespace, app, enqueued) -> None:
    app.periodic("@every 0.5s", "tick", name="ticker", missed="skip")
    await client.schedule("nightly", "0 3 * * *", "report:nightly", timezone="Asia/Tokyo")
    env = await start_env()
    await env.advance(0.5)
    assert len(names(enqueued, "ticker")) == 1
    async with Inspector(redis_url, namespace) as inspector:
        found = await inspector.schedules()
    assert [s.name for s in found] == ["ticker", "nightly"]  # soonest first
    ticker, nightly = found
    assert (ticker.spec, ticker.missed, ticker.source, ticker.timezone) == (
        "@every 0.5s", "skip", "app", "UTC")
    assert ticker.next_fire_at - ticker.last_fire_at == timedelta(seconds=0.5)
    assert nightly.source == "client" and nightly.last_fire_at is None
    tokyo = nightly.next_fire_at.astimezone(timezone(timedelta(hours=9)))
    assert (tokyo.hour, tokyo.minute) == (3, 0)


def test_schedule_keys_do_not_collide_with_a_queue_named_schedules() -> None:
    """The keys of a queue named "schedules" share the schedules' prefix: those of
    QueueKeys and those the scripts build from it ("prefix .. 'held:'") must differ."""
    queue, schedule = QueueKeys("ns", "schedules"), ScheduleKeys("ns")
    assert queue.prefix == schedule.prefix
    taken = queue_key_names()
    mine = [getattr(schedule, n)[len(schedule.prefix):] for n in ScheduleKeys.__slots__
            if n != "prefix"]
    assert [name for name in mine if collides(name, taken)] == []


# -- helpers -------------------------------------------------------------------------------


def _fire_time(info: obsq.TaskInfo) -> int:
    text = info.id.partition("@")[2].replace("Z", "+00:00")
    return round(datetime.fromisoformat(text).timestamp() * 1000)


def _calls(r: redis.Redis) -> int:
    """Commands Redis has run, not counting INFO itself."""
    stats = r.info("commandstats")
    return sum(v["calls"] for k, v in stats.items() if k != "cmdstat_info")


async def _names(client: obsq.Client, expected: set[str]) -> bool:
    return {s.name for s in await client.schedules()} == expected

