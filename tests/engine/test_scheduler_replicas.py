"""`obsq scheduler` replicas as real processes on a real Redis: three of them fire an
`@every 1s` entry for more than 20 s while two are SIGKILLed mid-fire (one before its
enqueue reached Redis, one after) and started again, and a worker runs every task; then
an outage of all the schedulers over five fires, with an entry of each missed policy. Each
fire's task id is its fire time, so a fire enqueued twice and a fire lost both show."""

from __future__ import annotations

import asyncio
import collections
import itertools
import signal
import urllib.request
from datetime import datetime

import redis
from prometheus_client.parser import text_string_to_metric_families
from support import ObsqProcess, wait_until

import obsq
from obsq.inspector import Inspector
from obsq.redis_server import free_port

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


async def test_an_outage_of_five_fires_follows_each_missed_policy(
        client, spawn_scheduler, raw_redis, redis_url, namespace) -> None:
    """Fires more than OBSQ_MISSED_AFTER (1 s) late when a scheduler is back are missed:
    "skip" enqueues none of them, "once" the latest; both are counted in Redis and in
    obsq_scheduler_missed_total."""
    short = {"OBSQ_LOCK_TTL": "0.5", "OBSQ_MISSED_AFTER": "1"}
    every = 2000
    await client.schedule("skipper", "@every 2s", "tick", missed="skip")
    await client.schedule("catcher", "@every 2s", "tick", missed="once")
    first = [spawn_scheduler(**short) for _ in range(2)]

    def fired(entry: str) -> list[int]:
        ids = decoded(raw_redis.lrange(record_key(namespace, "created"), 0, -1))
        return sorted(_fire_time(i) for i in ids if i.startswith(entry + "@"))

    await wait_until(lambda: len(fired("skipper")) >= 2 and len(fired("catcher")) >= 2,
                     timeout=30)
    for replica in first:
        replica.signal(signal.SIGTERM)
    assert [await asyncio.to_thread(r.wait) for r in first] == [0, 0]
    last = {entry: fired(entry)[-1] for entry in ("skipper", "catcher")}
    # down until five more fires of each are over a second late
    await wait_until(lambda: _now(raw_redis) > max(last.values()) + 5 * every + 1500,
                     timeout=30)
    port = free_port()
    back = spawn_scheduler(http_port=port, **short)
    await wait_until(lambda: all(len([f for f in fired(e) if f > last[e]]) >= 3
                                 for e in last), timeout=30)
    missed = _metric(port, "obsq_scheduler_missed_total")
    back.signal(signal.SIGTERM)
    assert await asyncio.to_thread(back.wait) == 0

    async with Inspector(redis_url, namespace) as inspector:
        counts = {s.name: s.missed_count for s in await inspector.schedules()}
    after = {e: [f for f in fired(e) if f > last[e]] for e in last}
    # skip: the fires go on from a fire after the outage; none in between was enqueued
    skipped = (after["skipper"][0] - last["skipper"]) // every - 1
    assert skipped >= 5
    assert {b - a for a, b in itertools.pairwise(after["skipper"])} == {every}
    assert missed["skipper"] == counts["skipper"] == skipped
    # once: the latest missed fire is enqueued late, once, then the fires go on
    catch_up, *on = after["catcher"]
    gap = (on[0] - last["catcher"]) // every - 1
    assert gap >= 5 and catch_up == on[0] - every
    assert {b - a for a, b in itertools.pairwise(on)} == {every}
    assert missed["catcher"] == counts["catcher"] == gap - 1
    print(f"outage: skip missed {skipped} fires and enqueued none of them; once missed "
          f"{gap}, enqueued the latest and counted {gap - 1}")


# -- helpers -------------------------------------------------------------------------------


def _fire_time(task_id: str) -> int:
    text = task_id.partition("@")[2].replace("Z", "+00:00")
    return round(datetime.fromisoformat(text).timestamp() * 1000)


def _span(ids: list[str]) -> int:
    times = [_fire_time(i) for i in ids]
    return max(times) - min(times) if times else 0


def _now(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return seconds * 1000 + micros // 1000


def _metric(port: int, name: str) -> dict[str, float]:
    """{entry: value} of a counter on the scheduler's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {s.labels["entry"]: s.value for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == name}

