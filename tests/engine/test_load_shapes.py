"""Load shapes of ordinary apps: thousands of concurrent calls on one Client, a worker with a
thousand slots whose handlers talk to Redis, thousands of running attempts to keep leased.
Each must work without Redis errors and without the user tuning connection pools, and
leave its namespace as `obsq doctor` finds it clean: a counter that drifted under load, or
an id left behind, fails the test.

Run with `-s` to see the connections each holds."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis
from support import wait_until

import obsq
from obsq.broker import Broker, QueueKeys
from obsq.ops.doctor import Doctor
from obsq.settings import REDIS_MAX_CONNECTIONS

KEEPER_CONNECTIONS = 1  # the heartbeat thread's own, beside the worker's pool


@pytest.fixture(autouse=True)
async def checked_by_doctor(redis_url: str, namespace: str) -> AsyncIterator[None]:
    """After the test, its workers stopped: what `obsq doctor` finds in the namespace."""
    yield
    broker = Broker(redis_url, namespace)
    try:
        problems = [p.line() for p in (await Doctor(broker).diagnose()).problems]
    finally:
        await broker.close()
    assert problems == []


def connections(raw_redis: redis.Redis) -> int:
    return len(raw_redis.client_list())


class PeakConnections:
    """The most connections Redis saw while the block ran, sampled from a thread."""

    def __init__(self, raw_redis: redis.Redis) -> None:
        self.raw_redis = raw_redis
        self.baseline = connections(raw_redis)
        self.peak = 0
        self._sampling: asyncio.Task[None] | None = None

    async def _sample(self) -> None:
        while True:
            self.peak = max(self.peak, await asyncio.to_thread(connections, self.raw_redis))
            await asyncio.sleep(0.05)

    async def __aenter__(self) -> PeakConnections:
        self._sampling = asyncio.create_task(self._sample())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._sampling is not None
        self._sampling.cancel()

    @property
    def added(self) -> int:
        return self.peak - self.baseline


async def test_one_client_serves_2000_result_waits_on_a_few_connections(
        app, redis_url, namespace, raw_redis, start_worker) -> None:
    gate = asyncio.Event()

    @app.task("gated")
    async def gated(task: obsq.Task):
        await gate.wait()
        return task.payload * 2

    await start_worker(concurrency=200)
    async with obsq.Client(redis_url, app=app) as client:
        infos = await client.enqueue_many([obsq.Job("gated", i) for i in range(2000)])
        async with PeakConnections(raw_redis) as seen:
            waits = [asyncio.ensure_future(client.result(info, timeout=60)) for info in infos]
            watched = QueueKeys(namespace, "default").watched
            await wait_until(lambda: raw_redis.hlen(watched) == 2000, timeout=30)
            await asyncio.sleep(0.3)  # a sample while every waiter is parked
            gate.set()
            results = await asyncio.gather(*waits)
    assert results == [i * 2 for i in range(2000)]
    print(f"\nconnections added by one Client with 2,000 result() waiters (and a worker at "
          f"concurrency 200): {seen.added}")
    assert seen.added <= 2 * REDIS_MAX_CONNECTIONS


async def test_one_client_takes_2000_concurrent_enqueues(app, redis_url, raw_redis,
                                                         namespace) -> None:
    errors: list[BaseException] = []
    async with obsq.Client(redis_url, app=app) as client:
        client.redis_error_hooks.append(lambda operation, exc: errors.append(exc))
        async with PeakConnections(raw_redis) as seen:
            infos = await asyncio.gather(*(client.enqueue("t", {"n": i}) for i in range(2000)))
    assert len({info.id for info in infos}) == 2000
    assert raw_redis.llen(QueueKeys(namespace, "default").pending) == 2000
    assert errors == []
    print(f"\nconnections added by one Client with 2,000 concurrent enqueues: {seen.added}")
    assert seen.added <= REDIS_MAX_CONNECTIONS


async def test_a_worker_at_concurrency_1000_publishing_progress_has_no_redis_errors(
        app, client, raw_redis, start_worker) -> None:
    errors: list[tuple[str, BaseException]] = []
    app.on_redis_error(lambda operation, exc: errors.append((operation, exc)))
    done: list[int] = []

    @app.task("busy")
    async def busy(task: obsq.Task):
        await task.update_state({"step": 1})
        await asyncio.sleep(0.01)
        await task.update_state({"step": 2})
        done.append(task.payload)

    await client.enqueue_many([obsq.Job("busy", i) for i in range(3000)])
    async with PeakConnections(raw_redis) as seen:
        worker = await start_worker(concurrency=1000)
        await wait_until(lambda: len(done) == 3000, timeout=60)
        await wait_until(lambda: worker.busy == 0, timeout=10)
    assert sorted(done) == list(range(3000))
    assert errors == []
    print(f"\nconnections held by a worker at concurrency 1,000: {seen.added}")
    assert seen.added <= REDIS_MAX_CONNECTIONS + KEEPER_CONNECTIONS


@pytest.mark.slow
async def test_a_worker_holding_5000_attempts_keeps_every_lease(app, client, start_worker
                                                                ) -> None:
    """Lease extension of 5,000 attempts at once (past Lua's unpack limit of ~8,000 values
    per call) with 3 s leases: every task runs once, none is taken back."""
    runs: dict[int, int] = {}
    outcomes: list[str] = []
    recoveries: list[str] = []
    app.on_outcome(lambda task, outcome, error: outcomes.append(outcome))
    app.on_recovery(lambda queue, reason, count: recoveries.append(reason))

    @app.task("long")
    async def long(task: obsq.Task):
        runs[task.payload] = runs.get(task.payload, 0) + 1
        await asyncio.sleep(7)  # more than two leases

    await client.enqueue_many([obsq.Job("long", i) for i in range(5000)])
    worker = await start_worker(concurrency=5000, lease_seconds=3)
    await wait_until(lambda: worker.busy == 5000, timeout=30)
    await wait_until(lambda: len(outcomes) == 5000, timeout=60)
    assert recoveries == []
    assert set(outcomes) == {"success"}
    assert runs == dict.fromkeys(range(5000), 1)
