"""Expiry (`expires=`): a task not started by its expiry never runs and ends dead with
TaskExpired as its error, found so by the fetch that would have started it (or, failed, by
the retry that would have started after it); its deadline is written once at enqueue, so a
retry does not move it. On a real Redis; the clock is stepped (obsq.testing) where the test
is about times, the server's own elsewhere."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

import pytest
from support import redis_now_ms

import obsq


async def test_a_task_not_started_by_its_expiry_never_runs(app, client, raw_redis, namespace,
                                                           start_worker, inspector,
                                                           obsq_cli) -> None:
    ran: list[str] = []
    outcomes: list[tuple[str, str, type | None]] = []

    @app.task("late")
    async def late(task: obsq.Task) -> None:
        ran.append(task.id)

    app.on_outcome(lambda task, outcome, error: outcomes.append(
        (task.id, outcome, type(error) if error else None)))
    info = await client.enqueue("late", {"n": 1}, expires=0.2, retention=60)
    fresh = await client.enqueue("late", {"n": 2}, expires=3600, retention=60)
    stored = int(raw_redis.hget(f"{namespace}:{{default}}:t:{info.id}", "exp"))
    assert 150 <= stored - redis_now_ms(raw_redis) <= 200  # on Redis's clock
    await asyncio.sleep(0.3)
    await start_worker()
    with pytest.raises(obsq.TaskExpired) as caught:
        await client.result(info, timeout=10)
    assert isinstance(caught.value, obsq.TaskFailed)
    assert str(caught.value) == f"task {info.id} expired: not started by its expiry"
    assert await client.result(fresh, timeout=10) is None  # not expired: it runs
    assert ran == [fresh.id]
    dead = await client.info(info.id)
    assert (dead.state, dead.retry_count) == ("dead", 0)
    assert dead.error == "TaskExpired: not started by its expiry"
    assert (info.id, "expired", obsq.TaskExpired) in outcomes
    # the tools show it among the dead, with its reason
    assert (await inspector.task(info.id)).error == "TaskExpired: not started by its expiry"
    page = await inspector.tasks("default", "dead")
    assert [t.error for t in page.tasks if t.id == info.id] == [dead.error]
    code, out = await obsq_cli("task", info.id)
    assert code == 0 and "TaskExpired: not started by its expiry" in out, out
    code, out = await obsq_cli("tasks", "default", "dead")
    assert code == 0 and "TaskExpired" in out, out
    # an operator's requeue of it is a wish to run it: its expiry is lifted
    assert (await inspector.requeue("default", "dead", [info.id])).moved == 1
    assert await client.result(info, timeout=10) is None
    assert ran == [fresh.id, info.id]


async def test_a_retry_does_not_move_the_expiry(app, start_env) -> None:
    attempts: list[float] = []

    @app.task("flaky", retry_delay=10)
    async def flaky(task: obsq.Task) -> None:
        attempts.append(env.clock.time())
        raise ValueError("down")

    env = await start_env()
    info = await env.client.enqueue("flaky", max_retry=10, expires=25, retention=3600)
    await env.advance(3600)
    with pytest.raises(obsq.TaskExpired):
        await env.client.result(info, timeout=10)
    # at 0, 10 and 20 s, counted from the enqueue: the one due at 30 s is past the expiry
    assert [round(at - attempts[0]) for at in attempts] == [0, 10, 20]
    dead = await env.client.info(info.id)
    assert (dead.state, dead.retry_count) == ("dead", 2)
    assert dead.error == ("TaskExpired: its retry would have started after its expiry; its "
                          "last attempt failed: ValueError: down")


async def test_a_delayed_task_due_after_its_expiry_never_runs(app, start_env) -> None:
    ran: list[str] = []

    @app.task("later")
    async def later(task: obsq.Task) -> None:
        ran.append(task.id)

    env = await start_env()
    now = datetime.fromtimestamp(env.clock.time(), timezone.utc)
    gone = await env.client.enqueue("later", delay=120, expires=timedelta(seconds=60),
                                    retention=3600)
    kept = await env.client.enqueue("later", delay=30, expires=now + timedelta(minutes=1),
                                    retention=3600)
    await env.advance(3600)
    assert ran == [kept.id]
    assert (await env.client.info(gone.id)).error == "TaskExpired: not started by its expiry"


async def test_a_routes_expiry_is_its_tasks_default(app, start_env) -> None:
    @app.task("stale", expires=timedelta(seconds=5))
    async def stale(task: obsq.Task) -> None: ...

    env = await start_env()
    default = await env.client.enqueue("stale", delay=10, retention=3600)
    longer = await env.client.enqueue("stale", delay=10, expires=60, retention=3600)
    await env.advance(60)
    assert (await env.client.info(default.id)).state == "dead"
    assert (await env.client.info(longer.id)).state == "completed"


@pytest.mark.parametrize(("expires", "error", "said"), [
    (0, ValueError, "expires must be"),
    (-1, ValueError, "expires must be"),
    (float("nan"), ValueError, "expires must be"),
    (timedelta(0), ValueError, "expires must be"),
    (datetime(2020, 1, 1, tzinfo=timezone.utc), ValueError, "has passed already"),
    (datetime(2099, 1, 1), ValueError, "must be an aware datetime"),
    ("60", TypeError, "expires must be seconds, a timedelta or an aware datetime"),
    (True, TypeError, "expires must be seconds"),
])
async def test_an_expiry_that_cannot_be_is_refused_and_nothing_written(
        client, raw_redis, namespace, expires, error, said) -> None:
    with pytest.raises(error, match=said):
        await client.enqueue("x", expires=expires)
    with pytest.raises(error, match=said):
        await client.enqueue_many([obsq.Job("x"), obsq.Job("y", expires=expires)])
    assert raw_redis.keys(f"{namespace}:*t:*") == []


def test_a_route_expiry_is_a_length_of_time(app) -> None:
    with pytest.raises(TypeError, match="a route's expires is a length of time"):
        app.task("r", expires=datetime(2099, 1, 1, tzinfo=timezone.utc))
    with pytest.raises(ValueError, match="expires must be"):
        app.task("r", expires=-5)


async def test_the_sync_client_takes_an_expiry(redis_url, namespace, raw_redis) -> None:
    def enqueue() -> obsq.TaskInfo:
        with obsq.SyncClient(redis_url, namespace=namespace) as sync:
            with pytest.raises(ValueError, match="expires must be"):
                sync.enqueue("x", expires=-1)
            return sync.enqueue("x", expires=timedelta(minutes=5))

    info = await asyncio.to_thread(enqueue)
    keys = raw_redis.keys(f"{namespace}:*t:*")
    assert [k.decode().rsplit(":", 1)[1] for k in keys] == [info.id]  # the refused one: none
    left = int(raw_redis.hget(keys[0], "exp")) - redis_now_ms(raw_redis)
    assert 295_000 <= left <= 300_000


def test_a_flow_step_keeps_its_expiry() -> None:
    from obsq.flow import decode_message, encode_message
    from obsq.task import build_message

    message = build_message(obsq.Job("step", expires=90))
    assert decode_message(encode_message(message)).expires == 90.0


async def test_expiry_holds_in_each_partition_of_a_queue(app, client, start_worker) -> None:
    app.queue("parts", partitions=3)
    ran: list[int] = []

    @app.task("part", queue="parts")
    async def part(task: obsq.Task) -> None:
        ran.append(task.payload)

    stale = await client.enqueue_many([obsq.Job("part", i, expires=0.05, retention=60)
                                       for i in range(6)])
    fresh = await client.enqueue_many([obsq.Job("part", 100 + i, retention=60)
                                       for i in range(6)])
    assert len({info.partition for info in stale}) > 1
    await asyncio.sleep(0.1)
    await start_worker()
    for info in stale:
        with pytest.raises(obsq.TaskExpired):
            await client.result(info, timeout=10)
    for info in fresh:
        await client.result(info, timeout=10)
    assert sorted(ran) == [100 + i for i in range(6)]
