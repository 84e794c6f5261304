"""Redis stopped and started again under a running worker. The new Redis is empty: no
scripts, no registered queues, no heartbeats. The worker must ride it out and go on."""

from __future__ import annotations

import asyncio

import pytest
import redis
from support import depth, wait_until

import obsq


async def test_the_worker_rides_out_a_redis_restart(app, namespace, private_redis,
                                                    start_worker) -> None:
    ran: list[str] = []
    errors: list[str] = []
    app.on_redis_error(lambda operation, exc: errors.append(operation))

    @app.task("t")
    async def handler(task: obsq.Task):
        ran.append(task.payload)
        return task.payload

    client = obsq.Client(private_redis.url, namespace, app=app)
    try:
        worker = await start_worker(redis_url=private_redis.url, queues="default,other")
        running = next(t for t in asyncio.all_tasks() if t.get_coro().__qualname__ ==
                       "Worker.run")
        await client.enqueue("t", "before")
        await wait_until(lambda: ran == ["before"])

        private_redis.stop()
        with pytest.raises(obsq.BrokerError):
            await client.enqueue("t", "while down")
        with pytest.raises(obsq.BrokerError):
            await client.info("anything")
        await wait_until(lambda: errors, timeout=10)  # the worker noticed
        await asyncio.sleep(0.5)  # let the worker fail a few rounds against a dead port
        assert not running.done()

        private_redis.start()  # the same port, empty

        async def enqueued(payload: str, **options) -> obsq.TaskInfo | None:
            try:
                return await client.enqueue("t", payload, **options)
            except obsq.BrokerError:
                return None  # a pooled connection from before the restart

        await wait_until(lambda: enqueued("after"), timeout=10)
        await wait_until(lambda: "after" in ran, timeout=15)
        # scripts were loaded again (NOSCRIPT), and so were the sweeps' queues: a delayed
        # task, and one on the worker's other queue, run too
        delayed = await client.enqueue("t", "delayed", delay=0.2, retention=60)
        other = await client.enqueue("t", "other queue", queue="other", retention=60)
        assert await client.result(delayed, timeout=15) == "delayed"
        assert await client.result(other, timeout=15) == "other queue"
        assert "while down" not in ran
        assert not running.done()
        assert worker.health().redis_ok
    finally:
        await client.close()


async def test_a_producer_gets_broker_error_while_redis_is_down(app, namespace,
                                                              private_redis) -> None:
    client = obsq.Client(private_redis.url, namespace, app=app)
    try:
        first = await client.enqueue("t", 1)
        private_redis.stop()
        for call in (lambda: client.enqueue("t", 2), lambda: client.info(first.id),
                     lambda: client.result(first, timeout=1),
                     lambda: client.enqueue_many([obsq.Job("t", 3, queue="new")])):
            with pytest.raises(obsq.BrokerError) as caught:
                await call()
            assert caught.value.operation
    finally:
        await client.close()


async def test_connections_dropped_under_load_lose_no_task(app, namespace, private_redis,
                                                           start_worker) -> None:
    """Every connection of the worker is killed again and again while it works: replies
    get lost after Redis acted on them. Tasks may be late (a lost fetch reply leaves its
    tasks to lease expiry) but none is lost, and none is left behind."""
    runs: dict[int, int] = {}

    @app.task("t")
    async def handler(task: obsq.Task):
        runs[task.payload] = runs.get(task.payload, 0) + 1
        await asyncio.sleep(0.02)

    total = 1000
    client = obsq.Client(private_redis.url, namespace, app=app)
    killer = redis.Redis.from_url(private_redis.url)
    try:
        await client.enqueue_many([obsq.Job("t", i) for i in range(total)])
        await start_worker(redis_url=private_redis.url, concurrency=10, lease_seconds=2)
        killed = 0
        for _ in range(30):  # while the worker works
            await asyncio.sleep(0.1)
            if len(runs) == total:
                break
            killed += killer.client_kill_filter(_type="normal", skipme=True)
        assert killed >= 10
        await wait_until(lambda: len(runs) == total, timeout=30)
        assert min(runs.values()) >= 1

        async def settled() -> bool:  # the last handlers (counted as they start) finish
            stats = await _stats(client)
            return stats["active"] == stats["pending"] == 0

        await wait_until(settled, timeout=30)
    finally:
        killer.close()
        await client.close()


async def _stats(client: obsq.Client) -> dict[str, int]:
    while True:
        try:
            return await depth(client.broker)
        except obsq.BrokerError:
            await asyncio.sleep(0.05)  # a connection killed by the test


@pytest.mark.parametrize("sync", [False, True], ids=["Client", "SyncClient"])
async def test_a_producer_error_names_the_call_the_user_made(sync: bool, namespace,
                                                             private_redis) -> None:
    """Not the step of it that failed: an enqueue to a queue new to the Client reads its
    partition count before it writes."""
    client = (obsq.SyncClient if sync else obsq.Client)(private_redis.url, namespace,
                                                        call_timeout=2)

    async def enqueue(queue: str) -> object:
        enqueued = client.enqueue("t", 1, queue=queue)
        return enqueued if sync else await enqueued

    try:
        await enqueue("first")
        private_redis.stop()
        with pytest.raises(obsq.BrokerError) as caught:
            await enqueue("second")
        assert caught.value.operation == "enqueue", caught.value
        assert str(caught.value).startswith("Redis call 'enqueue' failed"), caught.value
    finally:
        closed = client.close()
        if not sync:
            await closed


async def test_an_end_refused_because_redis_lost_its_data_says_so(
        app, namespace, private_redis, start_worker, caplog) -> None:
    """Not that its lease was taken over: the task is gone with the rest of Redis's data."""
    release = asyncio.Event()
    lost: list[bool] = []

    @app.task("t")
    async def handler(task: obsq.Task) -> None:
        await release.wait()

    client = obsq.Client(private_redis.url, namespace, app=app)
    try:
        worker = await start_worker(redis_url=private_redis.url)
        worker.data_lost_hooks.append(lambda: lost.append(True))
        info = await client.enqueue("t")
        await wait_until(lambda: worker.slots.busy, what="the task running")
        redis.Redis.from_url(private_redis.url).flushall()
        await wait_until(lambda: lost, timeout=10, what="the heartbeat finding the loss")
        release.set()
        await wait_until(lambda: f"task {info.id} (t) finished after Redis lost its data"
                         in caplog.text, timeout=10)
        assert "taken over" not in caplog.text
    finally:
        await client.close()
