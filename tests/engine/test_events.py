"""Fan-out events across worker processes (tests/engine/fanout_apps.py is their App): three
subscribers over three workers, one failing twice per event, each get every event exactly
once; a subscriber that starts later gets only later events; a SIGKILLed worker loses no
copy; a subscription that no live worker renews lapses."""

from __future__ import annotations

import collections
import signal

from support import depth, wait_until

import obsq

from .helpers import decoded, record_key

APP = "tests.engine.fanout_apps:app"
LATE = "tests.engine.fanout_apps:late"
SUBSCRIBERS = ["audit", "billing", "email"]


def delivered(raw_redis, namespace: str) -> collections.Counter:
    return collections.Counter(decoded(raw_redis.lrange(record_key(namespace, "delivered"),
                                                        0, -1)))


async def subscribers(broker) -> list[str]:
    return [name for name, _ in await broker.subscribers("order.created")]


async def test_every_subscriber_gets_every_event_once(spawn_worker, broker, redis_url,
                                                      namespace, raw_redis) -> None:
    for _ in range(3):
        spawn_worker(app=APP)
    await wait_until(lambda: subscribers(broker), timeout=30)
    assert await subscribers(broker) == SUBSCRIBERS
    async with obsq.Client(redis_url, namespace=namespace) as producer:  # without the App
        for n in range(35):
            infos = await producer.publish("order.created", {"n": n}, event_id=f"e{n}")
            assert sorted(i.id for i in infos) == [f"e{n}.{s}" for s in SUBSCRIBERS]
        spawn_worker("--queues", "late", app=LATE)
        await wait_until(lambda: _has(broker, "late"), timeout=30)
        for n in range(35, 70):
            await producer.publish("order.created", {"n": n}, event_id=f"e{n}")
        again = await producer.publish("order.created", {"n": 69}, event_id="e69")
        assert all(i.duplicate for i in again)  # a publish sent again delivers nothing twice
    expected = collections.Counter(
        [f"{s} {n}" for s in SUBSCRIBERS for n in range(70)] +
        [f"late {n}" for n in range(35, 70)])
    await wait_until(lambda: delivered(raw_redis, namespace) == expected, timeout=60,
                     what="each copy delivered once")
    attempts = raw_redis.mget([record_key(namespace, f"attempts:e{n}.audit")
                               for n in range(70)])
    assert set(attempts) == {b"3"}  # failed twice, then succeeded
    assert (await depth(broker))["dead"] == 0


async def _has(broker, name: str) -> bool:
    return name in await subscribers(broker)


async def test_sigkill_loses_no_copy_and_unrenewed_subscriptions_lapse(
        spawn_worker, broker, redis_url, namespace, raw_redis) -> None:
    ttl = {"OBSQ_SUBSCRIPTION_TTL": "2"}
    workers = [spawn_worker(app=APP, **ttl) for _ in range(3)]
    await wait_until(lambda: subscribers(broker), timeout=30)
    async with obsq.Client(redis_url, namespace=namespace) as producer:
        for n in range(40):
            await producer.publish("order.created", {"n": n})
            if n == 10:
                workers[0].signal(signal.SIGKILL)
        got = await wait_until(
            lambda: set(delivered(raw_redis, namespace)) >= {f"{s} {n}" for s in SUBSCRIBERS
                                                            for n in range(40)},
            timeout=60, what="every copy delivered")
        assert got
        for worker in workers[1:]:
            worker.signal(signal.SIGKILL)
        await wait_until(lambda: _none(broker), timeout=15, what="subscriptions lapsed")
        assert await producer.publish("order.created", {"n": 99}) == []
    assert (await depth(broker))["dead"] == 0


async def _none(broker) -> bool:
    return not await subscribers(broker)
