"""A Redis at maxmemory with noeviction refuses every write that may grow memory. Producers
must be told so clearly, and workers must still start, heartbeat, fetch, extend their
leases and settle, so that they drain the queue and free the memory: otherwise a full
Redis never heals."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
import redis
from support import missing_tool, wait_until

import obsq
from obsq.broker import Attempt, Broker, Completion
from obsq.redis_server import RedisServer

FILLER = "filler"  # a list outside the namespace that tops Redis up to its limit


@pytest.fixture
def full_redis() -> Iterator[RedisServer]:
    if not shutil.which("redis-server"):
        missing_tool("redis-server is not on PATH")
    server = RedisServer(config={"maxmemory": "4mb", "maxmemory-policy": "noeviction"}).start()
    yield server
    server.close()


def top_up(raw: redis.Redis) -> None:
    """Fill Redis until it refuses a plain write, so the next call meets a full Redis."""
    while True:
        try:
            raw.lpush(FILLER, "x" * 200)
        except redis.exceptions.ResponseError as exc:
            assert "maxmemory" in str(exc)
            return


async def fill_with_tasks(client: obsq.Client) -> int:
    """Enqueue until Redis refuses; the refusal must say why. -> tasks enqueued."""
    enqueued = 0
    while True:
        try:
            await client.enqueue_many([obsq.Job("t", {"n": enqueued + i, "pad": "x" * 300})
                                       for i in range(50)])
            enqueued += 50
        except obsq.BrokerError as exc:
            assert exc.out_of_memory and "Redis is full" in str(exc), exc
            return enqueued


async def test_every_call_a_worker_needs_passes_on_a_full_redis(full_redis, namespace,
                                                                app) -> None:
    raw = redis.Redis.from_url(full_redis.url)
    client = obsq.Client(full_redis.url, namespace, app=app)
    broker = Broker(full_redis.url, namespace)
    try:
        assert await fill_with_tasks(client) > 0
        calls = {
            "register queues": lambda: broker.register_queues(["default", "other"]),
            "heartbeat": lambda: broker.heartbeat("w1", {"queues": {"default": 1}}, 10),
            "take a free lock": lambda: broker.try_lock("recoverer", "w1", 5),
            "keep the lock": lambda: broker.try_lock("recoverer", "w1", 5),
            "interrupt the wait": lambda: broker.interrupt_wait("w1"),
        }
        for what, call in calls.items():
            top_up(raw)
            try:
                await call()
            except obsq.BrokerError as exc:
                pytest.fail(f"{what} refused on a full Redis: {exc}")
        top_up(raw)
        _, fetched = await broker.dequeue("default", 2, "w1", 30)
        assert len(fetched.tasks) == 2
        attempts = [Attempt(t.id, t.fence, t.type) for t in fetched.tasks]
        top_up(raw)
        assert await broker.extend({"default": attempts}, 30, "w1") == {"default": []}
        top_up(raw)
        acked = await broker.ack({"default": [Completion(a, 0, b"null") for a in attempts]},
                                 "w1")
        assert acked == {"default": [True, True]}
        top_up(raw)
        with pytest.raises(obsq.BrokerError, match="Redis is full"):
            await client.enqueue("t", {"refused": True})
    finally:
        raw.close()
        await broker.close()
        await client.close()


async def test_a_worker_starts_on_a_full_redis_and_drains_it(full_redis, namespace, app,
                                                             start_worker) -> None:
    done: set[int] = set()

    @app.task("t")
    async def handler(task: obsq.Task) -> None:
        done.add(task.payload["n"])

    raw = redis.Redis.from_url(full_redis.url)
    client = obsq.Client(full_redis.url, namespace, app=app)
    try:
        enqueued = await fill_with_tasks(client)
        top_up(raw)
        await start_worker(redis_url=full_redis.url, concurrency=20)
        await wait_until(lambda: len(done) == enqueued, timeout=60,
                         what=f"all {enqueued} queued tasks run")
        await client.enqueue("t", {"n": -1})  # the drain freed the memory
        await wait_until(lambda: -1 in done, what="a task enqueued after the drain run")
    finally:
        raw.close()
        await client.close()


async def test_producers_are_refused_above_their_share_of_maxmemory(full_redis, namespace,
                                                                    app) -> None:
    """Producers stop at their share, leaving the rest to the workers; a Client allowed the
    whole of it goes on until Redis itself refuses."""
    raw = redis.Redis.from_url(full_redis.url)
    half = obsq.Client(full_redis.url, namespace, app=app, memory_share=0.5)
    whole = obsq.Client(full_redis.url, namespace, app=app, memory_share=1)
    try:
        with pytest.raises(obsq.BrokerError) as refused:
            while True:
                await half.enqueue_many([obsq.Job("t", {"pad": "x" * 300})] * 50)
        assert refused.value.out_of_memory
        assert "above the 50% producers may fill" in str(refused.value), refused.value
        memory = raw.info("memory")
        assert memory["used_memory"] < 0.6 * memory["maxmemory"]
        await whole.enqueue("t", {"pad": "x"})  # room is left above the share
        with pytest.raises(ValueError, match="memory_share"):
            obsq.Client(full_redis.url, namespace, memory_share=1.5)
    finally:
        raw.close()
        await half.close()
        await whole.close()
