"""Cancelling and deleting tasks, in every state, on a real Redis: a waiting task never
runs; a running one is stopped by whichever worker holds it (an async handler gets
CancelledError, a plain function sees `task.cancelled`); the next task of its ordering key
gets its turn; a worker that dies running a cancelled task does not get it run again."""

from __future__ import annotations

import asyncio
import signal
import threading
import time

import pytest
from support import depth, equal, wait_until

import obsq
from obsq import cli
from obsq.broker import QueueKeys
from obsq.inspection.inspector import Inspector

from .helpers import decoded, record_key


async def _state(client: obsq.Client, task_id: str) -> str:
    return (await client.info(task_id)).state


async def test_a_waiting_task_never_runs(app, client, start_worker) -> None:
    ran: list[object] = []

    @app.task("t")
    async def handler(task: obsq.Task):
        ran.append(task.payload)

    pending = await client.enqueue("t", "pending", retention=60)
    later = await client.enqueue("t", "scheduled", delay=60)
    assert await client.cancel(pending.id) == "cancelled"
    assert await client.cancel(later.id) == "cancelled"
    assert await client.cancel(later.id) == "cancelled"  # again: nothing changes
    assert (await _state(client, pending.id), await _state(client, later.id)) == (
        "cancelled", "cancelled")
    with pytest.raises(obsq.TaskCancelled):
        await client.result(pending, timeout=5)
    await client.enqueue("t", "other")
    await start_worker()
    await wait_until(lambda: ran == ["other"], what="the other task run")
    assert ran == ["other"]
    with pytest.raises(obsq.TaskNotFound):
        await client.cancel("no-such-task")


async def test_a_running_async_handler_is_cancelled(app, client, start_worker) -> None:
    outcomes: list[str] = []
    app.on_outcome(lambda task, outcome, error: outcomes.append(outcome))
    started, stopped = asyncio.Event(), asyncio.Event()

    @app.task("long")
    async def long(task: obsq.Task):
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            stopped.set()
            raise

    await start_worker()
    info = await client.enqueue("long", retention=60)
    waiting = asyncio.ensure_future(client.result(info, timeout=30))
    await asyncio.wait_for(started.wait(), 10)
    asked = time.monotonic()
    assert await client.cancel(info.id) == "running"
    await asyncio.wait_for(stopped.wait(), 10)
    print(f"\nthe handler saw the cancel {1000 * (time.monotonic() - asked):.1f} ms after it")
    with pytest.raises(obsq.TaskCancelled):
        await waiting
    await wait_until(lambda: outcomes == ["cancelled"], what="the outcome counted")
    assert await _state(client, info.id) == "cancelled"


async def test_a_cancelled_async_handler_ends_and_frees_its_slot(app, client,
                                                                 start_worker) -> None:
    """On every Python obsq supports (3.10's tasks cannot uncancel()), the cancelled attempt
    is recorded `cancelled` and its worker's only slot goes on to the next task."""
    started = asyncio.Event()
    ran: list[str] = []

    @app.task("long")
    async def long(task: obsq.Task):
        started.set()
        await asyncio.sleep(60)

    @app.task("next")
    async def next_one(task: obsq.Task):
        ran.append(task.id)

    await start_worker(concurrency=1)
    info = await client.enqueue("long", retention=60)
    await asyncio.wait_for(started.wait(), 10)
    assert await client.cancel(info.id) == "running"
    after = await client.enqueue("next")
    await wait_until(lambda: _state_is(client, info.id, "cancelled"), what="cancelled")
    await wait_until(lambda: ran == [after.id], what="the next task run in the freed slot")


async def test_a_running_plain_function_sees_task_cancelled(app, client, start_worker) -> None:
    outcomes: list[str] = []
    app.on_outcome(lambda task, outcome, error: outcomes.append(outcome))
    running = threading.Event()

    @app.task("crunch")
    def crunch(task: obsq.Task):
        running.set()
        while not task.cancelled:  # a long computation that looks now and then
            time.sleep(0.01)
        return "stopped early"

    await start_worker()
    info = await client.enqueue("crunch", retention=60)
    await asyncio.to_thread(running.wait, 10)
    assert await client.cancel(info.id) == "running"
    await wait_until(lambda: outcomes == ["cancelled"], what="the plain function stopped")
    assert await _state(client, info.id) == "cancelled"


async def test_cancelling_in_an_ordering_key_lets_the_next_one_run(app, client,
                                                                   start_worker) -> None:
    ran: list[int] = []
    gate = asyncio.Event()

    @app.task("ordered")
    async def ordered(task: obsq.Task):
        ran.append(task.payload)
        if task.payload == 0:
            await gate.wait()

    infos = [await client.enqueue("ordered", n, ordering_key="k", retention=60)
             for n in range(4)]
    await start_worker()
    await wait_until(lambda: ran == [0], what="the first of the key running")
    assert await client.cancel(infos[2].id) == "cancelled"  # one waiting behind the first
    assert await client.cancel(infos[0].id) == "running"  # the first, while it runs
    await wait_until(lambda: ran == [0, 1, 3], what="the rest of the key, in order")
    assert await _state(client, infos[2].id) == "cancelled"


async def test_purging_ended_tasks_of_an_ordering_key_leaves_the_depth_true(
        app, client, broker, start_worker, redis_url, namespace) -> None:
    """Tasks that ended leave their key's list; deleting or purging them afterwards must
    not count them out of the waiting tasks again (the pending depth went below 0)."""
    @app.task("ordered")
    async def ordered(task: obsq.Task):
        pass

    infos = [await client.enqueue("ordered", n, ordering_key="k", retention=600)
             for n in range(5)]
    await start_worker()
    await wait_until(lambda: _all_completed(client, infos), what="the key's tasks done")
    async with Inspector(redis_url, namespace) as inspector:
        await inspector.delete(infos[0].id)
        assert await inspector.purge("default", "completed") == 4
    assert (await depth(broker))["pending"] == 0


async def _all_completed(client: obsq.Client, infos: list[obsq.TaskInfo]) -> bool:
    return all([await _state_is(client, i.id, "completed") for i in infos])


async def test_a_held_task_is_cancelled_where_it_waits(app, client, broker, start_worker
                                                       ) -> None:
    gate = asyncio.Event()

    @app.task("one", concurrency=1)
    async def one(task: obsq.Task):
        await gate.wait()

    first = await client.enqueue("one", 1)
    second = await client.enqueue("one", 2, retention=60)
    await start_worker()
    await wait_until(lambda: _state_is(client, first.id, "active"), what="the first running")
    await wait_until(lambda: broker.redis.zcard(broker.keys("default").held("one")),
                     what="the second held back")
    assert await client.cancel(second.id) == "cancelled"
    gate.set()
    await wait_until(lambda: _depth_zero(broker), what="nothing left waiting")
    assert await _state(client, second.id) == "cancelled"


async def test_purging_pending_takes_the_tasks_held_back_and_waiting_on_a_key(
        app, client, broker, redis_url, namespace, start_worker) -> None:
    """Held tasks and those behind an ordering key count as pending (obsq stats), so an
    operator purging pending expects them gone: only the running task is left to finish."""
    gate = asyncio.Event()
    ran = []

    @app.task("one", concurrency=1)
    async def one(task: obsq.Task):
        ran.append(task.payload)
        await gate.wait()

    held = [await client.enqueue("one", i) for i in range(6)]
    keyed = [await client.enqueue("one", 10 + i, ordering_key="k") for i in range(4)]
    await start_worker()
    expected = sorted(i.id for i in held[1:] + keyed)
    async with Inspector(redis_url, namespace) as inspector:
        async def listed() -> list[str]:
            # listed as pending too, in pages: those held back after the pending list, then
            # those behind their key (the worker takes tasks in batches, so a page may be
            # read while some still move)
            return sorted([t.id for offset in (0, 3, 6, 9)
                           for t in (await inspector.tasks("default", "pending", 3, offset)).tasks])

        await wait_until(lambda: equal(listed(), expected), what="the pending pages")
        assert await broker.redis.zcard(broker.keys("default").held("one"))
        assert await inspector.purge("default", "pending") == 5 + 4
    assert (await depth(broker))["pending"] == 0
    gate.set()
    await wait_until(lambda: _depth_zero(broker), what="the running task done")
    assert ran == [0]
    for info in held[1:] + keyed:
        with pytest.raises(obsq.TaskNotFound):
            await client.info(info.id)


async def _state_is(client: obsq.Client, task_id: str, state: str) -> bool:
    return await _state(client, task_id) == state


async def _depth_zero(broker) -> bool:
    depth = (await broker.queue_stats(["default"]))["default"].depth
    return depth["pending"] == 0 and depth["active"] == 0


async def test_a_cancelled_task_whose_worker_dies_is_not_run_again(
        client, broker, raw_redis, namespace, spawn_worker) -> None:
    doomed = spawn_worker()
    info = await client.enqueue("sleep", {"first": 60}, retention=60)
    await wait_until(lambda: raw_redis.llen(record_key(namespace, "started")) == 1,
                     timeout=20, what="the task running")
    doomed.signal(signal.SIGSTOP)  # frozen: it cannot stop the handler itself
    assert await client.cancel(info.id) == "running"
    doomed.signal(signal.SIGKILL)
    spawn_worker()
    await wait_until(lambda: _state_is(client, info.id, "cancelled"), timeout=20,
                     what="cancelled once its worker was known lost")
    assert decoded(raw_redis.lrange(record_key(namespace, "started"), 0, -1)) == [info.id]
    assert not raw_redis.llen(QueueKeys(namespace, "default").pending)


async def test_delete_and_the_cancel_command(app, client, redis_url, namespace, capsys) -> None:
    kept = await client.enqueue("t", 1, delay=60)
    assert await client.delete(kept.id) == "scheduled"
    with pytest.raises(obsq.TaskNotFound):
        await client.info(kept.id)
    other = await client.enqueue("t", 2, retention=60)
    code = await asyncio.to_thread(cli.main, ["cancel", other.id, "--redis-url", redis_url,
                                              "--namespace", namespace])
    assert code == 0 and f"cancelled task {other.id}" in capsys.readouterr().out
    code = await asyncio.to_thread(cli.main, ["cancel", "nope", "--redis-url", redis_url,
                                              "--namespace", namespace])
    assert code == 1
