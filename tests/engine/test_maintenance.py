"""The maintenance sweeps: forwarder (due tasks to pending), janitor (retention) and the
lock that lets one process at a time run each sweep. Due times and retention are checked on
a clock the test steps; the locks expire on Redis's own clock, in real time."""

from __future__ import annotations

import asyncio

from support import depth, wait_until

import obsq
from obsq.broker import Broker, FlowKeys, GlobalKeys, QueueKeys
from obsq.clock import ManualClock
from obsq.engine.maintenance import Forwarder


async def test_the_forwarder_runs_delayed_tasks_once_due_in_order(app, start_env) -> None:
    """Each runs at its due time, not a millisecond before, in the order they fall due."""
    ran: list[tuple[int, float]] = []

    @app.task("later")
    async def later(task: obsq.Task):
        ran.append((task.payload, env.clock.time() - start))

    env = await start_env()
    start = env.clock.time()
    infos = await env.client.enqueue_many([obsq.Job("later", n, delay=30 * n, retention=600)
                                           for n in (4, 1, 3, 2)])
    assert all(i.state == "scheduled" for i in infos)
    await env.advance(29.999)
    assert ran == []
    await env.advance(120)
    assert ran == [(1, 30), (2, 60), (3, 90), (4, 120)]


async def test_the_forwarder_moves_due_retries_and_scheduled_tasks(redis_url, namespace
                                                                   ) -> None:
    clock = ManualClock()
    async with obsq.Client(redis_url, namespace, clock=clock) as client:
        broker = client.broker
        info = await client.enqueue("t", delay=5)
        forwarder = Forwarder(broker, "test-forwarder", 60, lock_ttl=1)
        assert await forwarder.work() == 5  # it sleeps until the task is due
        assert (await client.info(info.id)).state == "scheduled"
        clock.set(clock.now_ms + 4999)
        assert await forwarder.work() == 0.001
        assert (await client.info(info.id)).state == "scheduled"
        clock.set(clock.now_ms + 1)
        assert await forwarder.work() == 60  # nothing left: its interval
        stats = await depth(broker)
    assert (stats["scheduled"], stats["pending"]) == (0, 1)


async def test_the_janitor_deletes_completed_tasks_after_retention(app, broker: Broker,
                                                                   start_env, raw_redis,
                                                                   namespace) -> None:
    @app.task("t")
    async def handler(task: obsq.Task):
        if task.payload == "fail":
            raise obsq.SkipRetry("dead on purpose")
        return task.payload

    env = await start_env(dead_max_age=3600, dead_max_count=2)
    client = env.client
    short = await client.enqueue("t", "short", retention=0.5)
    long = await client.enqueue("t", "long", retention=600)
    dead = []
    for _ in range(3):  # one after the other, so they die in this order
        dead.append(await client.enqueue("t", "fail"))
        await env.advance(0.001)
    assert await client.result(short, timeout=10) == "short"
    assert await client.result(long, timeout=10) == "long"
    keys = QueueKeys(namespace, "default")
    await env.advance(0.496)
    assert raw_redis.exists(keys.task(short.id))  # its retention is not over yet
    await env.advance(0.001)
    assert not raw_redis.exists(keys.task(short.id))
    assert (await depth(broker))["dead"] == 2
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



async def test_the_janitor_deletes_the_junk_with_the_dead_tasks_keeping(
        app, start_env, raw_redis, namespace) -> None:
    """What the workers set aside (a queue's junk, the flows set aside) is kept as long as
    the dead tasks, then deleted with its records; a junk entry naming no record of the
    kinds set aside goes alone."""
    env = await start_env(dead_max_age=3600)
    k, g = QueueKeys(namespace, "default"), GlobalKeys(namespace)
    await env.client.enqueue("t", delay=7200)  # the queue exists
    now = int(env.client.broker.clock.time() * 1000)
    raw_redis.set(k.task("old"), "a string")
    raw_redis.set(k.task("new"), "a string")
    raw_redis.rpush(k.pending + ":x", "stray")
    raw_redis.rpush(k.prefix + "held:x", "by hand")
    raw_redis.hset(k.junk, mapping={"t:old": f"{now} why", "pending:x": f"{now} why",
                                    "held:x": f"{now} by hand", "t:new": f"{now + 60_000} why"})
    flow = FlowKeys(namespace, "0" * 32)
    raw_redis.set(flow.flow, "a string")
    raw_redis.hset(g.flow_junk, mapping={"0" * 32: f"{now} why", b"\xff": f"{now} why"})
    await env.advance(3599)
    assert raw_redis.hlen(k.junk) == 4 and raw_redis.hlen(g.flow_junk) == 2
    await env.advance(2)
    assert raw_redis.hkeys(k.junk) == [b"t:new"] and raw_redis.exists(k.task("new"))
    assert not raw_redis.exists(k.task("old"), k.pending + ":x", flow.flow)
    assert raw_redis.exists(k.prefix + "held:x")  # named by hand: no record set aside
    assert not raw_redis.hlen(g.flow_junk)
