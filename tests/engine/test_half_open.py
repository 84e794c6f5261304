"""Connections the network drops silently: a NAT, conntrack or load balancer that forgot
them keeps both TCP connections open and forwards nothing (StallingProxy), so neither TCP
keepalive nor a reset tells the worker; only its calls' deadlines do. Each call ends within
its deadline on a connection then closed, is tried again on a fresh one, and the worker
goes on within seconds of the network coming back."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from support import SHORT_INTERVALS, StallingProxy, depth, ended, wait_until

import obsq
from obsq.broker import Broker, QueueKeys
from obsq.engine.liveness import LIVENESS, READINESS, Check, first_problem

STALL = 5.0  # seconds the network forwards nothing
# A deadline of 1 s keeps the tests short; a worker's heartbeat TTL and leases outlast the
# stall, so that nothing is taken from it meanwhile and no task runs twice.
DEADLINES = {"call_timeout": 1.0, "heartbeat_ttl": 10.0, "lease_seconds": 15.0}


@contextlib.asynccontextmanager
async def running(app: obsq.App, url: str, **options: Any) -> AsyncIterator[obsq.Worker]:
    """A worker of `app` on `url` (a proxy's), drained before the proxy closes."""
    worker = obsq.Worker(app, redis_url=url, handle_signals=False, concurrency=10,
                         **{**SHORT_INTERVALS, **DEADLINES, **options})
    run = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        worker.stop()
        await asyncio.wait_for(run, 30)


async def test_a_worker_drains_on_after_its_connections_were_dropped_silently(
        app, namespace, redis_url, broker) -> None:
    ran: collections.Counter[int] = collections.Counter()

    @app.task("t")
    async def handler(task: obsq.Task) -> None:
        await asyncio.sleep(0.05)
        ran[task.payload] += 1

    client = obsq.Client(redis_url, namespace, app=app)
    try:
        await client.enqueue_many([obsq.Job("t", n) for n in range(300)])
        with StallingProxy(redis_url) as proxy:
            async with running(app, proxy.url) as worker:
                await drain_through_a_stall(worker, proxy, ran, broker)
        assert set(ran) == set(range(300))
        assert max(ran.values()) == 1, {n: c for n, c in ran.items() if c > 1}
    finally:
        await client.close()


async def drain_through_a_stall(worker: obsq.Worker, proxy: StallingProxy,
                                ran: collections.Counter[int], broker: Broker) -> None:
    """Stall the network for STALL seconds mid-drain: readiness fails meanwhile, and the
    drain goes on once the network is back."""
    await wait_until(worker.started.is_set, timeout=10, what="the worker started")
    await wait_until(lambda: len(ran) >= 50, what="the drain under way")
    proxy.stall()
    stalled_at = time.monotonic()
    problems = set()
    while time.monotonic() - stalled_at < STALL:
        problems.add(first_problem(worker.health(), READINESS))
        await asyncio.sleep(0.2)
    proxy.resume()
    resumed_at = time.monotonic()
    assert problems - {None}, "readiness never failed while the network was down"
    done_during = len(ran)
    # a fetch whose reply the network dropped left its tasks leased to the worker: it
    # hands them back once Redis answers, so none waits for its lease (15 s) to run out
    await wait_until(lambda: len(ran) == 300, timeout=DEADLINES["lease_seconds"] / 2,
                     what="every task run after the network came back")
    print(f"the rest ran within {time.monotonic() - resumed_at:.1f} s of the network's return")
    assert len(ran) > done_during
    await wait_until(lambda: first_problem(worker.health(), READINESS) is None, timeout=5,
                     what="ready again")
    await wait_until(lambda: settled(broker), timeout=5, what="every end recorded")


async def settled(broker: Broker) -> bool:
    stats = await depth(broker)
    return not any(stats[state] for state in ("pending", "active", "scheduled", "retry"))


async def test_readiness_then_liveness_fail_while_the_fetch_loop_does_not_come_round(
        app, namespace, redis_url, start_worker, monkeypatch, caplog) -> None:
    """A fetch that never returns (as every fetch on a dropped connection did before its
    calls had deadlines) is found by the watchdog: readiness fails past the longest a round
    lasts, liveness past that and the blocked-loop limit, the metric's hook hears it, and
    the log says it once."""
    ran: list[str] = []

    @app.task("t")
    async def handler(task: obsq.Task) -> None:
        ran.append(task.payload)

    worker = await start_worker(call_timeout=1.0, blocked_loop_limit=1.0)
    stalls: list[float] = []
    worker.fetch_stall_hooks.append(stalls.append)
    assert worker.fetching.limit == SHORT_INTERVALS["wait_timeout"] + 1.0 + 2.0
    release = asyncio.Event()
    dequeue = worker.broker.dequeue

    async def hung(*args, **kwargs):
        await release.wait()
        return await dequeue(*args, **kwargs)

    client = obsq.Client(redis_url, namespace, app=app)
    try:
        with caplog.at_level(logging.WARNING, "obsq"):
            monkeypatch.setattr(worker.broker, "dequeue", hung)  # once the idle wait ends
            unready = await wait_until(lambda: fetch_problem(worker, READINESS),
                                       timeout=10, what="readiness failing")
            assert "(a round lasts 3.5 s at most)" in unready, unready
            dead = await wait_until(lambda: fetch_problem(worker, LIVENESS), timeout=10,
                                    what="liveness failing")
            assert "(limit 4.5 s)" in dead, dead
            await wait_until(lambda: any(s > 0 for s in stalls), timeout=5)
            await client.enqueue("t", "waits")
            await asyncio.sleep(1)
            assert not ran
            release.set()
            await wait_until(lambda: ran == ["waits"], timeout=10)
            await wait_until(lambda: first_problem(worker.health(), READINESS) is None
                             and first_problem(worker.health(), LIVENESS) is None, timeout=5)
            await wait_until(lambda: stalls[-1] == 0, timeout=5)
        said = [r.getMessage() for r in caplog.records if "fetch loop" in r.getMessage()]
        assert len(said) == 2, said
        assert said[0].startswith("the fetch loop has not come round for")
        assert said[1].startswith("the fetch loop comes round again after")
    finally:
        release.set()
        await client.close()


def fetch_problem(worker: obsq.Worker, checks: list[Check]) -> str | None:
    """The probe's reason when it is the fetch loop's (on a loaded host an event loop late
    past the test's short blocked-loop limit may come first)."""
    problem = first_problem(worker.health(), checks)
    return problem if problem and problem.startswith("the fetch loop has not come round for") \
        else None


async def test_the_heartbeat_stops_extending_an_attempt_whose_end_does_not_reach_redis(
        app, namespace, redis_url, raw_redis, start_worker, monkeypatch, caplog) -> None:
    """A settle that cannot get through (it hung for as long as the worker lived on a
    dropped connection) must not hold its task and its flow: its lease lapses a lease after
    the handler ended, and the task runs again."""
    runs: list[str] = []

    @app.task("t")
    async def handler(task: obsq.Task) -> None:
        runs.append(task.id)
        if len(runs) == 1:
            raise RuntimeError("fails, and its retry is never recorded")

    worker = await start_worker(lease_seconds=2.0, settle_timeout=0.5)
    release = asyncio.Event()
    retry = worker.broker.retry

    async def hung(*args, **kwargs):
        await release.wait()
        return await retry(*args, **kwargs)

    monkeypatch.setattr(worker.broker, "retry", hung)
    client = obsq.Client(redis_url, namespace, app=app)
    lease = QueueKeys(namespace, "default").lease
    try:
        with caplog.at_level(logging.WARNING, "obsq"):
            task = await client.enqueue("t", retention=60)
            await wait_until(lambda: runs, what="the first run")
            ended_at = time.monotonic()
            await wait_until(lambda: len(runs) == 2, timeout=15,
                             what="the task taken back and run again")
            # its lease ran out: it was extended at most a lease past the handler's end
            assert time.monotonic() - ended_at >= 2.0
            info = await wait_until(lambda: ended(client, task.id), timeout=10)
            assert info.state == "completed"
            assert raw_redis.zscore(lease, task.id) is None
        assert any(f"task {task.id} of queue default ended" in r.getMessage()
                   and "no longer extended" in r.getMessage() for r in caplog.records)
    finally:
        release.set()
        await client.close()


async def test_a_worker_started_while_the_network_drops_everything_tries_until_it_goes_on(
        app, namespace, redis_url, caplog) -> None:
    ran: list[str] = []

    @app.task("t")
    async def handler(task: obsq.Task) -> None:
        ran.append(task.payload)

    client = obsq.Client(redis_url, namespace, app=app)
    try:
        with StallingProxy(redis_url) as proxy, caplog.at_level(logging.INFO, "obsq"):
            proxy.stall()
            async with running(app, proxy.url) as worker:
                def tries() -> list[str]:
                    return [r.getMessage() for r in caplog.records
                            if "cannot reach Redis yet" in r.getMessage()]

                await wait_until(lambda: len(tries()) >= 2, timeout=10, what="two tries said")
                assert "(try 1): cannot reach Redis at " in tries()[0]
                assert "no answer within 1 s" in tries()[0]
                assert "(try 2)" in tries()[1]
                assert not worker.started.is_set()
                proxy.resume()
                await wait_until(worker.started.is_set, timeout=10, what="the worker started")
                assert any("reached Redis at" in r.getMessage() and "failed tries" in
                           r.getMessage() for r in caplog.records)
                await client.enqueue("t", "after")
                await wait_until(lambda: ran == ["after"], timeout=10)
    finally:
        await client.close()


async def test_a_client_call_ends_within_its_deadline_on_a_dropped_connection(
        app, namespace, redis_url) -> None:
    with StallingProxy(redis_url) as proxy:
        client = obsq.Client(proxy.url, namespace, app=app, call_timeout=1)
        try:
            await client.enqueue("t", "before")
            proxy.stall()
            started = time.monotonic()
            with pytest.raises(obsq.BrokerTimeout, match="within the call deadline of 1 s"):
                await asyncio.wait_for(client.enqueue("t", "dropped"), 30)
            assert time.monotonic() - started < 2
            proxy.resume()
            assert (await client.enqueue("t", "after", task_id="after")).id == "after"
        finally:
            await client.close()


async def test_a_scheduler_fires_on_after_its_connections_were_dropped_silently(
        app, namespace, redis_url) -> None:
    """The scheduler's calls (its lock, its reads of the due fires, its wait for a change)
    have a deadline as a worker's do, and their failures reach its Client's Redis-error
    hooks (the metrics): without it the call under way when the network dropped waited for
    ever, and no fire came after the network was back."""
    from obsq.engine.scheduler import Scheduler
    from obsq.settings import SchedulerSettings

    @app.task("tick")
    async def tick(task: obsq.Task) -> None:
        pass

    app.periodic("@every 0.5s", "tick", name="ticker")
    fired: list[float] = []
    with StallingProxy(redis_url) as proxy:
        scheduler = Scheduler(app, proxy.url, namespace, handle_signals=False,
                              settings=SchedulerSettings(lock_ttl=3.0, call_timeout=1.0))
        scheduler.on_fire(lambda entry, outcome, count: fired.append(time.monotonic())
                          if outcome == "fired" else None)
        timeouts: list[str] = []  # the Client's hooks hear of its broker's failed calls
        scheduler.client.redis_error_hooks.append(
            lambda operation, exc: isinstance(exc, obsq.BrokerTimeout)
            and timeouts.append(operation))
        run = asyncio.create_task(scheduler.run())
        try:
            await wait_until(lambda: len(fired) >= 2, timeout=10, what="the first fires")
            proxy.stall()
            await asyncio.sleep(STALL)
            proxy.resume()
            resumed_at = time.monotonic()
            await wait_until(lambda: fired[-1] > resumed_at, timeout=10,
                             what="a fire after the network came back")
            await wait_until(lambda: scheduler.ready() is None, timeout=5, what="ready again")
            assert {"lock", "due_fires", "wait_schedule_change"} & set(timeouts), timeouts
        finally:
            scheduler.stop()
            await asyncio.wait_for(run, 30)


async def test_tasks_a_lost_fetch_took_are_handed_back_once_redis_answers_again(
        app, namespace, redis_url, raw_redis, caplog) -> None:
    """An idle worker's wait is woken while the network drops its replies: Redis leases
    the tasks to it and the reply never comes. Once the network is back the worker hands
    them back at once rather than leaving them to their lease (30 s here); the task a slot
    ran through the drop is not among them, and none runs twice."""
    ran: collections.Counter[str] = collections.Counter()
    long_started = asyncio.Event()

    @app.task("t")
    async def handler(task: obsq.Task) -> None:
        if task.payload == "long":
            long_started.set()
            await asyncio.sleep(STALL + 3)
        ran[task.payload] += 1

    lease = 30.0
    client = obsq.Client(redis_url, namespace, app=app)
    active = QueueKeys(namespace, "default").active
    try:
        with StallingProxy(redis_url) as proxy, caplog.at_level(logging.INFO, "obsq"):
            async with running(app, proxy.url, lease_seconds=lease) as worker:
                await wait_until(worker.started.is_set, timeout=10, what="the worker started")
                await client.enqueue("t", "long")
                await asyncio.wait_for(long_started.wait(), 10)
                await asyncio.sleep(1)  # into its idle wait again
                proxy.stall()
                await client.enqueue_many([obsq.Job("t", f"n{n}") for n in range(20)])

                def leased() -> int:
                    owners = raw_redis.hvals(active)
                    return sum(o.decode().endswith(":" + worker.id) for o in owners)

                # the wait's dequeue ran in Redis: as many as the free slots are the
                # worker's, unread
                await wait_until(lambda: leased() == 10, timeout=5,
                                 what="the tasks leased by the fetch whose reply is lost")
                await asyncio.sleep(STALL)
                proxy.resume()
                resumed_at = time.monotonic()
                await wait_until(lambda: len(ran) == 21, timeout=lease / 3,
                                 what="every task run, well before their lease ran out")
                print(f"the tasks of the lost fetch ran within "
                      f"{time.monotonic() - resumed_at:.1f} s of the network's return")
                await wait_until(lambda: leased() == 0, timeout=5, what="every end recorded")
        assert max(ran.values()) == 1, {n: c for n, c in ran.items() if c > 1}
        said = [r.getMessage() for r in caplog.records if "whose reply was lost" in
                r.getMessage()]
        assert said and "handed 9 task(s) back to queue default" in said[0], said
    finally:
        await client.close()
