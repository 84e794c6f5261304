"""The producer's round trips: concurrent enqueues share script calls (counted with the
server's own INFO commandstats on a private Redis), each caller still gets its own answer;
the SyncClient enqueues in the caller's thread; the enqueue script checks an id only when
the producer chose it; tasks stored before this layout of the script's arguments still
run."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster
from support import redis_now_ms, sync_redis

import obsq
from obsq.broker import QueueKeys
from obsq.producer.enqueue import sync_safe
from obsq.redis_server import RedisServer
from obsq.settings import MEMORY_LOOK_MS


def calls(r: Any, command: str) -> int:
    """How many times `command` ran on the server (or on every node of a cluster), scripts'
    own redis.call()s included."""
    if isinstance(r, RedisCluster):
        return sum(r.info("commandstats", target_nodes=node).get(f"cmdstat_{command}", {})
                   .get("calls", 0) for node in r.get_primaries())
    return r.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0)


@pytest.fixture
def private_url(private_redis: RedisServer) -> str:
    return private_redis.url


@pytest.fixture
def counted(private_url: str) -> Iterator[redis.Redis]:
    r = redis.Redis.from_url(private_url)
    yield r
    r.close()


@pytest.fixture
async def private_client(private_url: str, namespace: str, app: obsq.App
                         ) -> AsyncIterator[obsq.Client]:
    c = obsq.Client(private_url, namespace=namespace, app=app)
    yield c
    await c.close()


async def test_1000_concurrent_enqueues_take_a_handful_of_script_calls(
        private_client, counted, namespace) -> None:
    await private_client.enqueue("warm-up")  # the queue registered, the script loaded
    before = calls(counted, "evalsha")
    infos = await asyncio.gather(*(private_client.enqueue("job", {"i": i})
                                   for i in range(1000)))
    script_calls = calls(counted, "evalsha") - before
    print(f"1,000 concurrent enqueues: {script_calls} script calls")
    assert script_calls <= 5
    assert len({info.id for info in infos}) == 1000
    assert counted.llen(QueueKeys(namespace, "default").pending) == 1001
    stored = counted.hget(QueueKeys(namespace, "default").task(infos[777].id), "payload")
    assert stored == b'{"i":777}'  # each caller's own task, not a neighbour's


async def test_a_duplicate_or_a_bad_payload_in_a_batch_fails_only_its_caller(
        private_client, counted, namespace) -> None:
    taken = await private_client.enqueue("job", task_id="taken")
    await private_client.enqueue("job", "unique", unique_for=60)
    before = calls(counted, "evalsha")

    async def one(i: int) -> obsq.TaskInfo:
        if i == 10:
            return await private_client.enqueue("job", task_id="taken")
        if i == 20:
            return await private_client.enqueue("job", "unique", unique_for=60)
        if i == 30:
            return await private_client.enqueue("job", float("nan"))
        if i in (40, 41):  # two callers naming the same new id: the first one wins
            return await private_client.enqueue("job", i, task_id="shared")
        return await private_client.enqueue("job", i)

    results = await asyncio.gather(*(one(i) for i in range(200)), return_exceptions=True)
    assert calls(counted, "evalsha") - before <= 4  # they went together
    assert isinstance(results[10], obsq.DuplicateTask) and results[10].existing_id == taken.id
    assert isinstance(results[20], obsq.DuplicateTask)
    assert isinstance(results[30], ValueError)
    assert results[40].id == "shared" and isinstance(results[41], obsq.DuplicateTask)
    fine = [r for i, r in enumerate(results) if i not in (10, 20, 30, 41)]
    assert all(isinstance(r, obsq.TaskInfo) and not r.duplicate for r in fine)
    # 196 new tasks, plus the two enqueued first
    assert counted.llen(QueueKeys(namespace, "default").pending) == 198
    assert counted.hget(QueueKeys(namespace, "default").task("shared"), "payload") == b"40"


async def test_a_failed_round_trip_fails_the_callers_that_rode_in_it(
        private_redis, namespace, app) -> None:
    client = obsq.Client(private_redis.url, namespace=namespace, app=app)
    await client.enqueue("warm-up")
    private_redis.stop()
    try:
        results = await asyncio.gather(*(client.enqueue("job", i) for i in range(50)),
                                       return_exceptions=True)
        assert all(isinstance(r, obsq.BrokerError) for r in results)
        private_redis.start()
        # at once, whatever broke: the connection kept for enqueues is made again
        infos = await asyncio.gather(*(client.enqueue("job", i) for i in range(50)))
        assert len({info.id for info in infos}) == 50  # nothing stuck behind the failure
    finally:
        await client.close()


async def test_the_script_checks_an_id_only_when_the_producer_chose_it(
        private_url, namespace, counted) -> None:
    # without the memory check, whose reading is kept in a key it looks for
    async with obsq.Client(private_url, namespace=namespace, memory_share=1) as client:
        await client.enqueue("warm-up")
        before = calls(counted, "exists")
        await client.enqueue_many([obsq.Job("job", i) for i in range(20)])
        assert calls(counted, "exists") == before  # 128 random bits: free without looking
        await client.enqueue("job", task_id="mine")
        assert calls(counted, "exists") == before + 1


async def test_the_memory_check_reads_redis_memory_once_in_a_while(
        private_client, counted) -> None:
    """INFO memory costs more Redis time than a small enqueue: with no maxmemory, or far
    below the producers' share of it, one reading serves the enqueues of MEMORY_LOOK_MS;
    near the share, a reading serves only the enqueues that fit in half the room left."""
    async def looks_at_memory(enqueues: int, payload: Any = None) -> tuple[int, float]:
        """INFO calls of the enqueues (not the one reading the count), and the most there
        would be with one reading per MEMORY_LOOK_MS."""
        before, started = calls(counted, "info"), time.monotonic()
        for i in range(enqueues):
            await private_client.enqueue("job", payload or i)
        most = (time.monotonic() - started) * 1000 / MEMORY_LOOK_MS + 1
        return calls(counted, "info") - before - 1, most

    await private_client.enqueue("warm-up")
    looks, most = await looks_at_memory(200)  # no maxmemory
    assert looks <= most
    counted.config_set("maxmemory", str(50 * 2**20))  # used memory far below 90 % of it
    looks, most = await looks_at_memory(200)
    assert looks <= most
    used = counted.info("memory")["used_memory"]
    counted.config_set("maxmemory", str(int((used + 400_000) / 0.9)))  # 400 kB below the share
    await asyncio.sleep(2 * MEMORY_LOOK_MS / 1000)  # the last reading is gone
    # 10 kB each, 300 kB: more than the first budget (200 kB), less than the room, with
    # 100 kB either side for what else moves Redis's used memory meanwhile (tens of kB)
    looks, _ = await looks_at_memory(30, "x" * 10_000)
    assert looks >= 2


async def test_enqueues_of_several_queues_at_once_each_reach_their_queue(
        private_client, counted, namespace) -> None:
    infos = await asyncio.gather(*(private_client.enqueue("job", i, queue=f"q{i % 3}")
                                   for i in range(300)))
    assert {info.queue for info in infos} == {"q0", "q1", "q2"}
    for q in ("q0", "q1", "q2"):
        assert counted.llen(QueueKeys(namespace, q).pending) == 100
    assert {m.decode() for m in counted.smembers(f"{namespace}:queues")} == {"q0", "q1", "q2"}


async def test_a_cancelled_enqueue_that_waits_for_the_next_round_trip_is_not_written(
        private_client, counted, namespace) -> None:
    await private_client.enqueue("warm-up")
    first = asyncio.ensure_future(private_client.enqueue("job", "first"))
    await asyncio.sleep(0)  # its round trip is in flight
    waiting = asyncio.ensure_future(private_client.enqueue("job", "waiting"))
    await asyncio.sleep(0)
    waiting.cancel()
    await first
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await private_client.enqueue("job", "after")
    payloads = [counted.hget(QueueKeys(namespace, "default").task(i.decode()), "payload")
                for i in counted.lrange(QueueKeys(namespace, "default").pending, 0, -1)]
    assert b'"waiting"' not in payloads and b'"after"' in payloads


async def test_an_enqueue_cancelled_in_flight_leaves_the_next_ones_their_own_replies(
        private_client, counted, namespace) -> None:
    """Cancelled at every point of its round trip, an enqueue may or may not be written,
    but no later call reads its reply in place of its own."""
    await private_client.enqueue("warm-up")
    keys = QueueKeys(namespace, "default")
    for steps in range(12):
        first = asyncio.ensure_future(private_client.enqueue("job", task_id=f"c{steps}"))
        for _ in range(steps):
            await asyncio.sleep(0)
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        taken = await private_client.enqueue("job", "taken", task_id=f"t{steps}")
        assert taken.id == f"t{steps}" and not taken.duplicate
        with pytest.raises(obsq.DuplicateTask):  # a refusal reaches its own caller
            await private_client.enqueue("job", task_id=f"t{steps}")
        fresh = await private_client.enqueue("job", steps)
        assert counted.hget(keys.task(fresh.id), "payload") == str(steps).encode()


async def test_1000_concurrent_enqueues_on_a_cluster_take_a_handful_of_script_calls(
        redis_cluster, namespace) -> None:
    app = obsq.App(namespace=namespace)
    client = obsq.Client(redis_cluster, namespace=namespace, app=app)
    raw = sync_redis(redis_cluster)
    try:
        for queue in ("alpha", "beta"):  # on different nodes
            await client.enqueue("warm-up", queue=queue)
        before = calls(raw, "evalsha")
        infos = await asyncio.gather(*(client.enqueue("job", i, queue=("alpha", "beta")[i % 2])
                                       for i in range(1000)))
        script_calls = calls(raw, "evalsha") - before
        print(f"1,000 concurrent enqueues on two slots of a cluster: {script_calls} calls")
        assert script_calls <= 10
        assert len({info.id for info in infos}) == 1000
        for queue in ("alpha", "beta"):
            assert raw.llen(QueueKeys(namespace, queue).pending) == 501
    finally:
        await client.close()
        raw.close()


def test_sync_client_enqueues_in_the_callers_thread(redis_url, namespace, raw_redis) -> None:
    app = obsq.App(namespace=namespace)
    threads: list[str] = []

    @app.use_producer
    @sync_safe
    async def marked(messages, call_next):
        threads.append(threading.current_thread().name)
        return await call_next(messages)

    with obsq.SyncClient(redis_url, namespace=namespace, app=app) as client:
        info = client.enqueue("job", {"n": 1})
        client.enqueue_many([obsq.Job("job", 2), obsq.Job("job", 3, queue="other")])
        with pytest.raises(obsq.DuplicateTask):
            client.enqueue("job", task_id=info.id)
        assert threads == [threading.current_thread().name] * 3

        @client.use
        async def unmarked(messages, call_next):  # may await anything: the loop thread
            await asyncio.sleep(0)
            threads.append(threading.current_thread().name)
            return await call_next(messages)

        client.enqueue("job", 4)
        assert threads[-1] == "obsq-sync-client"
    keys = QueueKeys(namespace, "default")
    assert raw_redis.llen(keys.pending) == 3
    assert raw_redis.hget(keys.task(info.id), "payload") == b'{"n":1}'


def test_sync_client_keeps_one_connection_and_makes_it_again_after_a_restart(
        private_redis, namespace) -> None:
    """One thread's enqueues take the connection kept beside the pool; a Redis restarted
    while it sat idle, or one that forgot its scripts, costs the next enqueue nothing; a
    Redis that is away fails the enqueue with a BrokerError and the next one, once it is
    back, succeeds."""
    raw = redis.Redis.from_url(private_redis.url)
    with obsq.SyncClient(private_redis.url, namespace=namespace) as client:
        client.enqueue("job", 0)
        before = raw.info("clients")["connected_clients"]
        for i in range(50):
            client.enqueue("job", i)
        assert raw.info("clients")["connected_clients"] == before
        raw.script_flush()
        client.enqueue("job", "after SCRIPT FLUSH")
        private_redis.stop()
        private_redis.start()
        client.enqueue("job", "after a restart")  # the kept connection was closed idle
        private_redis.stop()
        with pytest.raises(obsq.BrokerError):
            client.enqueue("job", "while Redis is away")
        private_redis.start()
        client.enqueue("job", "back")
    raw.close()


def test_sync_client_enqueues_on_a_cluster(redis_cluster, namespace) -> None:
    raw = sync_redis(redis_cluster)
    try:
        with obsq.SyncClient(redis_cluster, namespace=namespace) as client:
            infos = [client.enqueue("job", i, queue=("alpha", "beta")[i % 2])
                     for i in range(10)]
            listed = client.enqueue_many([obsq.Job("job", q, queue=q) for q in
                                          ("alpha", "beta", "delta")])
            with pytest.raises(obsq.DuplicateTask):
                client.enqueue("job", queue="beta", task_id=infos[1].id)
        assert [info.queue for info in listed] == ["alpha", "beta", "delta"]
        for queue, count in (("alpha", 6), ("beta", 6), ("delta", 1)):
            assert raw.llen(QueueKeys(namespace, queue).pending) == count
    finally:
        raw.close()


def test_sync_client_enqueues_from_many_threads_and_waits_for_results(
        redis_url, namespace, app) -> None:
    @app.task("double")
    async def double(task: obsq.Task):
        return task.payload * 2

    worker_loop = asyncio.new_event_loop()
    worker = obsq.Worker(app, redis_url=redis_url, concurrency=10, handle_signals=False,
                         wait_timeout=0.5)
    runner = threading.Thread(target=worker_loop.run_until_complete, args=(worker.run(),))
    runner.start()
    try:
        with obsq.SyncClient(redis_url, namespace=namespace, app=app) as client:
            infos: list[obsq.TaskInfo] = []

            def produce(base: int) -> None:
                for i in range(25):
                    infos.append(client.enqueue("double", base + i, retention=60))

            producers = [threading.Thread(target=produce, args=(b * 100,)) for b in range(8)]
            for t in producers:
                t.start()
            for t in producers:
                t.join()
            assert len({i.id for i in infos}) == 200
            for info in infos[:20]:
                assert client.result(info, timeout=20) == int(
                    client.info(info.id).payload) * 2
    finally:
        worker_loop.call_soon_threadsafe(worker.stop)
        runner.join(timeout=30)
        worker_loop.close()


async def test_a_task_stored_in_the_earlier_layout_still_runs(
        app, client, raw_redis, namespace, start_worker) -> None:
    """As the enqueue script of earlier releases wrote it: options as JSON with '{}' left
    out, headers as JSON; the worker reads the same fields."""
    @app.task("legacy")
    async def legacy(task: obsq.Task):
        return {"payload": task.payload, "headers": task.headers, "max_retry": task.max_retry}

    keys = QueueKeys(namespace, "default")
    now = redis_now_ms(raw_redis)
    raw_redis.hset(keys.task("old-1"), mapping={
        "type": "legacy", "payload": b'{"kept":[1,2]}', "state": "pending", "enq": now,
        "due": now, "headers": b'{"x":"y"}', "opts": b'{"max_retry":2,"retention":60}'})
    raw_redis.sadd(f"{namespace}:queues", "default")
    raw_redis.lpush(keys.pending, "old-1")
    await start_worker()
    assert await client.result("old-1", timeout=15) == {
        "payload": {"kept": [1, 2]}, "headers": {"x": "y"}, "max_retry": 2}
