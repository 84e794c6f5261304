"""A Redis at maxmemory with noeviction refuses every write that may grow memory. Producers
must be told so clearly, and workers must still start, heartbeat, fetch, extend their
leases and settle, so that they drain the queue and free the memory: otherwise a full
Redis never heals."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator

import pytest
import redis
from support import missing_tool, wait_until

import obsq
from obsq.broker import Attempt, Broker, Completion, QueueKeys
from obsq.broker.keeping import BlockingKeeping
from obsq.broker.scripts import FULL_ERROR_BYTES, FULL_NOTE
from obsq.redis_server import RedisServer
from obsq.settings import MEMORY_LOOK_MS

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
    keeping = BlockingKeeping(broker)  # the worker's heartbeat thread calls Redis this way
    try:
        assert await fill_with_tasks(client) > 0
        calls = {
            "register queues": lambda: broker.register_queues(["default", "other"]),
            "heartbeat": lambda: asyncio.to_thread(keeping.heartbeat, "w1",
                                                   {"queues": {"default": 1}}, 10),
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
        assert await asyncio.to_thread(keeping.extend, {"default": attempts}, 30, "w1") == {
            "default": []}
        top_up(raw)
        acked = await broker.ack({"default": [Completion(a, 0, b"null") for a in attempts]},
                                 "w1")
        assert acked == {"default": [True, True]}
        top_up(raw)  # a prefetch buffer given back (or a drain's), in its order
        _, ahead = await broker.dequeue("default", 2, "w1", 30)
        top_up(raw)
        given = [Attempt(t.id, t.fence, t.type) for t in ahead.tasks]
        assert await broker.hand_back("default", given, "w1") == [True, True]
        top_up(raw)
        _, again = await broker.dequeue("default", 2, "w1", 30)
        assert [t.id for t in again.tasks] == [a.task_id for a in given]
        top_up(raw)
        with pytest.raises(obsq.BrokerError, match="Redis is full"):
            await client.enqueue("t", {"refused": True})
    finally:
        raw.close()
        keeping.close()
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


async def test_failing_tasks_keep_a_full_redis_within_its_limit(namespace, app,
                                                                start_worker) -> None:
    """Producers fill an 8 MB Redis to their share; then its tasks fail with long errors and
    tracebacks, are retried and dead-lettered, while others write small things of their own
    to the same Redis. What the workers write stays within 10 % of maxmemory (sampled all
    along) and the queue drains."""
    if not shutil.which("redis-server"):
        missing_tool("redis-server is not on PATH")
    server = RedisServer(config={"maxmemory": "8mb", "maxmemory-policy": "noeviction"}).start()
    raw = redis.Redis.from_url(server.url)
    client = obsq.Client(server.url, namespace, app=app)
    written: set[int] = set()

    @app.task("fails", max_retry=1, retry_delay=0.1)
    async def fails(task: obsq.Task) -> None:
        raise ValueError("too long " * 5000)

    @app.task("writes", max_retry=10, retry_delay=0.1)
    async def writes(task: obsq.Task) -> None:
        raw.sadd(f"{namespace}-app:written", task.payload["n"])  # the app's own small write
        written.add(task.payload["n"])

    peak = 0

    async def sample() -> None:
        nonlocal peak
        while True:
            peak = max(peak, raw.info("memory")["used_memory"])
            await asyncio.sleep(0.02)

    sampler = asyncio.create_task(sample())
    try:
        enqueued = 0
        with pytest.raises(obsq.BrokerError, match="Redis is full"):
            while True:
                await client.enqueue_many([
                    obsq.Job("fails" if (enqueued + i) % 2 else "writes",
                             {"n": enqueued + i, "pad": "x" * 8000}) for i in range(10)])
                enqueued += 10
        limit = raw.info("memory")["maxmemory"]
        await start_worker(redis_url=server.url, concurrency=4)
        keys = QueueKeys(namespace, "default")
        await wait_until(lambda: raw.zcard(keys.dead) == enqueued // 2, timeout=240,
                         what=f"{enqueued // 2} failing tasks dead")
        await wait_until(lambda: len(written) == enqueued // 2, timeout=60,
                         what="every writing task done")
        assert raw.llen(keys.pending) == raw.zcard(keys.retry) == 0
        print(f"{enqueued} tasks, used memory at most {peak / limit:.2f} x maxmemory")
        assert peak <= 1.1 * limit, f"used memory reached {peak / limit:.2f} x maxmemory"
        dead = raw.hgetall(keys.task(raw.zrange(keys.dead, -1, -1)[0].decode()))
        assert dead[b"error"].startswith(b"ValueError: too long")
    finally:
        sampler.cancel()
        raw.close()
        await client.close()
        server.close()


async def test_above_the_share_long_errors_and_results_are_not_kept(full_redis, namespace,
                                                                    app) -> None:
    raw = redis.Redis.from_url(full_redis.url)
    client = obsq.Client(full_redis.url, namespace, app=app)
    broker = Broker(full_redis.url, namespace)
    keys = QueueKeys(namespace, "default")
    try:
        await fill_with_tasks(client)  # to the producers' share
        _, fetched = await broker.dequeue("default", 3, "w1", 30)
        done, failed, retried = (Attempt(t.id, t.fence, t.type) for t in fetched.tasks)
        top_up(raw)  # whatever the dequeue freed: above the share for sure
        result = b'"' + b"r" * 1000 + b'"'
        assert await broker.ack({"default": [Completion(done, 60, result)]}, "w1")
        assert await broker.fail("default", failed, "w1", "ValueError: " + "e" * 3000,
                                 "Traceback " * 800)
        assert await broker.retry("default", retried, "w1", 0, "é" * 3000, "tb " * 3000)
        kept = raw.hgetall(keys.task(done.task_id))
        assert (kept[b"result"], kept[b"error"]) == (b"null", b"result not kept: Redis full")
        dead = raw.hgetall(keys.task(failed.task_id))
        assert dead[b"error"].startswith(b"ValueError: eee")
        assert dead[b"error"].endswith(FULL_NOTE.encode()) and b"tb" not in dead
        assert len(dead[b"error"]) <= FULL_ERROR_BYTES
        again = raw.hgetall(keys.task(retried.task_id))
        assert again[b"error"].decode().endswith(FULL_NOTE)  # cut between characters
        assert b"tb" not in again
    finally:
        raw.close()
        await broker.close()
        await client.close()


async def test_a_suspect_runs_on_a_full_redis(full_redis, namespace, app, start_worker
                                              ) -> None:
    """A full Redis refuses the mark of a suspect's run alone: it runs unmarked, as the
    worker's runs are what drain Redis."""
    ran: list[str] = []

    @app.task("t")
    async def handler(task: obsq.Task) -> None:
        ran.append(task.id)

    raw = redis.Redis.from_url(full_redis.url)
    client = obsq.Client(full_redis.url, namespace, app=app)
    try:
        info = await client.enqueue("t", {"n": 0})
        raw.hset(QueueKeys(namespace, "default").task(info.id), "sus", "1")  # as recovered
        top_up(raw)
        await start_worker(redis_url=full_redis.url)
        await wait_until(lambda: ran == [info.id], what="the suspect ran")
    finally:
        raw.close()
        await client.close()


def fill_to(raw: redis.Redis, share: float) -> None:
    """Push filler until Redis's used memory passes `share` of its maxmemory."""
    while True:
        memory = raw.info("memory")
        if memory["used_memory"] > share * memory["maxmemory"]:
            return
        raw.lpush(FILLER, *["x" * 200] * 50)


async def test_a_flow_accepted_runs_to_its_end_above_the_share_and_a_new_one_is_refused(
        full_redis, namespace, app, start_worker) -> None:
    """A flow's next steps continue accepted work, as a worker's writes do: a Redis filled
    past the producers' share by other data does not freeze a flow half done. A new flow
    above the share is refused before anything of it is written."""
    release = asyncio.Event()
    ran: list[str] = []

    @app.task("step")
    async def step(task: obsq.Task) -> str:
        if task.payload == "first":
            await release.wait()
        ran.append(task.payload)
        return task.payload

    raw = redis.Redis.from_url(full_redis.url)
    client = obsq.Client(full_redis.url, namespace, app=app, memory_share=0.5)
    try:
        await start_worker(redis_url=full_redis.url)
        flow = await client.enqueue(obsq.chain(*[obsq.Job("step", name) for name in
                                                 ("first", "second", "third")]))
        await wait_until(lambda: client.info(flow), what="the flow written")
        fill_to(raw, 0.95)  # past the 90 % a worker's broker lets producers fill
        await asyncio.sleep(MEMORY_LOOK_MS / 1000 + 0.05)  # the memory read again
        with pytest.raises(obsq.BrokerError) as refused:
            await client.enqueue(obsq.chain(obsq.Job("step", "a"), obsq.Job("step", "b")))
        assert refused.value.out_of_memory, refused.value
        release.set()
        assert await client.result(flow, timeout=30) == "third"
        assert ran == ["first", "second", "third"]
        flows = [key for key in raw.scan_iter(f"{namespace}:*") if b":flow" in key
                 and flow.id.encode() not in key]
        assert not [key for key in flows if raw.type(key) == b"hash"], flows  # none written
    finally:
        raw.close()
        await client.close()
