"""The maintenance sweeps: forwarder (due tasks to pending), janitor (retention) and the
lock that lets one process at a time run each sweep."""

from __future__ import annotations

import asyncio

from support import depth, wait_until

import obsq
from obsq.broker import Broker, GlobalKeys, QueueKeys
from obsq.maintenance import Forwarder, Janitor


async def test_the_forwarder_runs_delayed_tasks_once_due_in_order(app, client, raw_redis,
                                                                  start_worker) -> None:
    """Each runs once Redis's clock has passed its due time, in the order they fall due
    (when the forwarder is late is the benchmark's business, not a test's)."""
    ran: list[int] = []
    early: list[int] = []

    @app.task("later")
    async def later(task: obsq.Task):
        seconds, micros = raw_redis.time()
        due = int(raw_redis.hget(QueueKeys(client.namespace, "default").task(task.id), "due"))
        if seconds * 1000 + micros // 1000 < due:
            early.append(task.payload)
        ran.append(task.payload)

    await start_worker()
    infos = await client.enqueue_many([obsq.Job("later", n, delay=0.3 * n, retention=60)
                                       for n in (4, 1, 3, 2)])
    assert all(i.state == "scheduled" for i in infos)
    await wait_until(lambda: len(ran) == 4, timeout=10)
    assert ran == [1, 2, 3, 4]
    assert early == []


async def test_the_forwarder_moves_due_retries_and_scheduled_tasks(client, broker: Broker,
                                                                   namespace) -> None:
    info = await client.enqueue("t", delay=0.05)
    forwarder = Forwarder(broker, "test-forwarder", 0.05, lock_ttl=1)
    forwarder.start()
    try:
        await wait_until(lambda: _state(client, info.id, "pending"), timeout=5)
    finally:
        await forwarder.stop()
    stats = await depth(broker)
    assert (stats["scheduled"], stats["pending"]) == (0, 1)


async def test_the_janitor_deletes_completed_tasks_after_retention(app, client, broker: Broker,
                                                                   start_worker, raw_redis,
                                                                   namespace) -> None:
    @app.task("t")
    async def handler(task: obsq.Task):
        if task.payload == "fail":
            raise obsq.SkipRetry("dead on purpose")
        return task.payload

    worker = await start_worker()
    short = await client.enqueue("t", "short", retention=0.5)
    long = await client.enqueue("t", "long", retention=600)
    assert await client.result(short, timeout=10) == "short"
    assert await client.result(long, timeout=10) == "long"
    dead = []
    for _ in range(3):  # one after the other, so they die in this order
        dead.append(await client.enqueue("t", "fail"))
        await wait_until(lambda: _state(client, dead[-1].id, "dead"))
    worker.stop()  # it releases its janitor lock
    await wait_until(lambda: not raw_redis.exists(GlobalKeys(namespace).lock("janitor")))

    janitor = Janitor(broker, "test-janitor", 0.1, lock_ttl=1, dead_max_age=3600,
                      dead_max_count=2)
    janitor.start()
    keys = QueueKeys(namespace, "default")
    try:
        await wait_until(lambda: not raw_redis.exists(keys.task(short.id)), timeout=10)
        await wait_until(lambda: _depth(broker, "dead", 2))
    finally:
        await janitor.stop()
    assert not raw_redis.zscore(keys.completed, short.id)
    assert (await client.info(long.id)).result == "long"  # still within its retention
    # the oldest dead task went first
    assert [i.id.encode() for i in dead[1:]] == raw_redis.zrange(keys.dead, 0, -1)
    assert not raw_redis.exists(keys.task(dead[0].id))


async def test_only_one_worker_holds_the_recoverer_lock(app, raw_redis, namespace,
                                                        start_worker) -> None:
    first = await start_worker()
    second = await start_worker()
    locks = GlobalKeys(namespace)
    lock = locks.lock("recoverer")
    holder = await wait_until(lambda: raw_redis.get(lock))
    assert holder in (first.id.encode(), second.id.encode())
    for _ in range(20):  # it stays with that one while it lives
        assert raw_redis.get(lock) == holder
        assert 0 < raw_redis.pttl(lock) <= 1000  # the tests' lock_ttl
        await asyncio.sleep(0.05)
    for name in ("forwarder", "janitor"):
        assert raw_redis.get(locks.lock(name)) in (first.id.encode(), second.id.encode())

    # the holder stops (and releases its locks): the other takes over
    leaving, staying = (first, second) if holder == first.id.encode() else (second, first)
    leaving.stop()
    await wait_until(lambda: raw_redis.get(lock) == staying.id.encode(), timeout=10)


async def test_a_lock_is_taken_by_one_owner_at_a_time(broker: Broker) -> None:
    assert await broker.try_lock("sweep", "a", 5)
    assert not await broker.try_lock("sweep", "b", 5)
    assert await broker.try_lock("sweep", "a", 5)  # the holder keeps it
    await broker.release_lock("sweep", "b")  # not b's to release
    assert not await broker.try_lock("sweep", "b", 5)
    await broker.release_lock("sweep", "a")
    assert await broker.try_lock("sweep", "b", 0.1)
    await wait_until(lambda: broker.try_lock("sweep", "a", 5), timeout=5)  # b's lapsed


async def _state(client: obsq.Client, task_id: str, state: str) -> bool:
    return (await client.info(task_id)).state == state


async def _depth(broker: Broker, state: str, expected: int) -> bool:
    return (await depth(broker))[state] == expected
