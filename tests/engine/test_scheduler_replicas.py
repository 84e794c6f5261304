"""`obsq scheduler` replicas as real processes on a real Redis: three of them fire an
`@every 1s` entry for more than 20 s while two are SIGKILLed mid-fire (one before its
enqueue reached Redis, one after) and started again, and a worker runs every task; then
an outage of all the schedulers over five fires, with an entry of each missed policy. Each
fire's task id is its fire time, so a fire enqueued twice and a fire lost both show.
The missed policies are timing logic: a scheduler's rounds on a clock the test steps."""

from __future__ import annotations

import asyncio
import collections
import itertools
import signal
from datetime import datetime

from support import ObsqProcess, wait_until

import obsq
from obsq.clock import ManualClock
from obsq.engine.scheduler import SchedulerLoop
from obsq.inspection.inspector import Inspector
from obsq.settings import SchedulerSettings

from .helpers import decoded, record_key

EVERY_MS = 1000


async def test_three_replicas_fire_each_time_once_through_two_kills(
        app, client, start_worker, spawn_scheduler, raw_redis, redis_url, namespace) -> None:
    ran: list[str] = []

    @app.task("tick")
    async def tick(task: obsq.Task) -> None:
        ran.append(task.id)

    await start_worker()
    # the enqueue calls numbered 5 and 12 kill the scheduler making them (the counter is
    # shared), before and after the task reaches Redis
    kills = {"OBSQ_LOCK_TTL": "1", "OBSQ_ENGINE_KILL_BEFORE": "5",
             "OBSQ_ENGINE_KILL_AFTER": "12"}
    replicas = [spawn_scheduler(**kills) for _ in range(3)]
    for replica in replicas:
        await wait_until(lambda r=replica: "scheduler started" in r.log(), timeout=30)
    await client.schedule("tick", "@every 1s", "tick")

    def created() -> list[str]:
        return decoded(raw_redis.lrange(record_key(namespace, "created"), 0, -1))

    killed: list[ObsqProcess] = []

    def three_replicas_for_20_s() -> bool:
        """A killed replica is started again, as Kubernetes restarts a pod."""
        for replica in list(replicas):
            if replica.poll() is not None and replica not in killed:
                killed.append(replica)
                replicas.append(spawn_scheduler(**kills))  # whichever holds the lock
        return _span(created()) >= 20_000

    await wait_until(three_replicas_for_20_s, timeout=60)
    assert [r.poll() for r in killed] == [-signal.SIGKILL] * 2
    live = [r for r in replicas if r not in killed]
    assert len(live) == 3
    for replica in live:
        replica.signal(signal.SIGTERM)
    assert [await asyncio.to_thread(r.wait) for r in live] == [0, 0, 0]
    ids = created()
    await wait_until(lambda: len(ran) >= len(ids), timeout=30)

    fires = sorted(_fire_time(i) for i in ids)
    expected = (fires[-1] - fires[0]) // EVERY_MS + 1
    attempts = int(raw_redis.get(record_key(namespace, "attempts")))
    print(f"fires over {(fires[-1] - fires[0]) / 1000:.0f} s with 3 replicas, 2 SIGKILLed "
          f"mid-fire and replaced: expected {expected}, enqueued {len(ids)}, run {len(ran)}, "
          f"enqueue calls {attempts}")
    assert max(collections.Counter(ids).values()) == 1  # none enqueued twice
    assert {b - a for a, b in itertools.pairwise(fires)} == {EVERY_MS}  # none lost
    assert len(ids) == expected >= 21
    assert sorted(ran) == sorted(ids)  # each ran once
    # the fire killed before its enqueue was enqueued by the next replica; the one killed
    # after was offered again and refused by its id, though its task had run already
    assert attempts >= expected + 2
    async with Inspector(redis_url, namespace) as inspector:
        (entry,) = await inspector.schedules()
    assert entry.fire_count == expected and entry.missed_count == 0


async def test_an_outage_of_five_fires_follows_each_missed_policy(app, redis_url,
                                                                  namespace) -> None:
    """Fires more than missed_after (1 s) late when a scheduler is back are missed: "skip"
    enqueues none of them, "once" the latest; both are counted in Redis and told to the
    fire hooks (which obsq_scheduler_missed_total counts)."""
    clock = ManualClock()
    every = 2000
    created: list[str] = []

    @app.use_producer
    async def record(messages, call_next):
        infos = await call_next(messages)
        created.extend(i.id for i in infos if not i.duplicate)
        return infos

    def fired(entry: str) -> list[int]:
        return sorted(_fire_time(i) for i in created if i.startswith(entry + "@"))

    async with obsq.Client(redis_url, namespace, app=app, clock=clock) as client:
        await client.schedule("skipper", "@every 2s", "tick", missed="skip")
        await client.schedule("catcher", "@every 2s", "tick", missed="once")
        loop = SchedulerLoop(client, {}, "scheduler", SchedulerSettings(lock_ttl=0.5,
                                                                        missed_after=1))
        missed: collections.Counter[str] = collections.Counter()
        loop.fire_hooks.append(lambda entry, outcome, n: outcome == "missed" and
                               missed.update({entry: n}))

        async def rounds_for(ms: int) -> None:
            """The scheduler's rounds, each after the wait the one before asked for."""
            end = clock.now_ms + ms
            while clock.now_ms < end:
                wait = await loop.tick()
                clock.set(min(clock.now_ms + max(round((wait or 0) * 1000), 1), end))

        await rounds_for(2 * every + 1)
        last = {entry: fired(entry)[-1] for entry in ("skipper", "catcher")}
        assert all(len(fired(entry)) == 2 for entry in last), created
        clock.set(max(last.values()) + 5 * every + 1500)  # down until five fires are late
        await rounds_for(3 * every)
        await loop.stop()
        counts = {s.name: s.missed_count for s in await client.schedules()}
    after = {e: [f for f in fired(e) if f > last[e]] for e in last}
    # skip: the fires go on from a fire after the outage; none in between was enqueued
    skipped = (after["skipper"][0] - last["skipper"]) // every - 1
    assert skipped == 5
    assert {b - a for a, b in itertools.pairwise(after["skipper"])} == {every}
    assert missed["skipper"] == counts["skipper"] == skipped
    # once: the latest missed fire is enqueued late, once, then the fires go on
    catch_up, *on = after["catcher"]
    gap = (on[0] - last["catcher"]) // every - 1
    assert gap == 5 and catch_up == on[0] - every
    assert {b - a for a, b in itertools.pairwise(on)} == {every}
    assert missed["catcher"] == counts["catcher"] == gap - 1


# -- helpers -------------------------------------------------------------------------------


def _fire_time(task_id: str) -> int:
    text = task_id.partition("@")[2].replace("Z", "+00:00")
    return round(datetime.fromisoformat(text).timestamp() * 1000)


def _span(ids: list[str]) -> int:
    times = [_fire_time(i) for i in ids]
    return max(times) - min(times) if times else 0



