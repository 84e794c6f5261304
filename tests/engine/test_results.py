"""Client.result, progress through update_state, TaskInfo, and the SyncClient."""

from __future__ import annotations

import asyncio

import pytest
from support import wait_until

import obsq
from obsq.broker import QueueKeys


async def test_result_waits_for_the_task(app, client, start_worker) -> None:
    gate = asyncio.Event()

    @app.task("slow")
    async def slow(task: obsq.Task):
        await gate.wait()
        return {"n": task.payload}

    await start_worker()
    info = await client.enqueue("slow", 7, retention=60)
    waiting = asyncio.ensure_future(client.result(info.id, timeout=10))
    await wait_until(lambda: _state(client, info.id, "active"))
    assert not waiting.done()
    gate.set()
    assert await waiting == {"n": 7}
    # once completed (with retention) the result is returned at once, by id or TaskInfo
    assert await client.result(info.id, timeout=1) == {"n": 7}
    assert await client.result(info) == {"n": 7}


async def test_result_of_a_dead_task_raises_task_failed(app, client, start_worker) -> None:
    @app.task("bad")
    async def bad(task: obsq.Task):
        raise obsq.SkipRetry("no such user")

    await start_worker()
    info = await client.enqueue("bad", retention=60)
    with pytest.raises(obsq.TaskFailed) as caught:
        await client.result(info.id, timeout=10)
    assert caught.value.task_id == info.id
    assert caught.value.error == "SkipRetry: no such user"
    # and again once it is dead (it stays in the dead set without retention too)
    with pytest.raises(obsq.TaskFailed):
        await client.result(info.id, timeout=1)


async def test_result_times_out(app, client) -> None:
    info = await client.enqueue("nobody-runs-this")
    with pytest.raises(TimeoutError):
        await client.result(info, timeout=0.3)
    assert (await client.info(info.id)).state == "pending"


async def test_result_without_retention_when_asked_before_completion(
        app, client, start_worker, raw_redis, namespace) -> None:
    gate = asyncio.Event()

    @app.task("no-retention")
    async def no_retention(task: obsq.Task):
        await gate.wait()
        return [1, 2, 3]

    await start_worker()
    info = await client.enqueue("no-retention")
    waiting = asyncio.ensure_future(client.result(info, timeout=10))
    await wait_until(lambda: _state(client, info.id, "active"))
    await wait_until(lambda: _watchers(raw_redis, namespace, info) == 1)  # the waiter is set
    gate.set()
    assert await waiting == [1, 2, 3]
    # the task is gone now: asking afterwards cannot work without retention
    with pytest.raises(obsq.TaskNotFound):
        await client.result(info.id, timeout=1)


async def test_waiters_in_two_clients_on_one_task_all_get_the_result(
        app, client, start_worker, raw_redis, redis_url, namespace) -> None:
    gate = asyncio.Event()

    @app.task("shared")
    async def shared(task: obsq.Task):
        await gate.wait()
        return "for all"

    await start_worker()
    info = await client.enqueue("shared", retention=60)
    async with obsq.Client(redis_url, app=app) as other:
        waiting = [asyncio.ensure_future(c.result(info, timeout=10))
                   for c in (client, client, other)]
        await wait_until(lambda: _state(client, info.id, "active"))
        await wait_until(lambda: _watchers(raw_redis, namespace, info) == 2)  # one entry per client
        gate.set()
        assert await asyncio.gather(*waiting) == ["for all"] * 3
    assert _watchers(raw_redis, namespace, info) == 0


async def test_unknown_ids_raise_task_not_found(app, client) -> None:
    with pytest.raises(obsq.TaskNotFound):
        await client.result("no-such-task", timeout=1)
    with pytest.raises(obsq.TaskNotFound):
        await client.info("no-such-task")
    await client.enqueue("t", queue="elsewhere")  # a known queue does not change that
    with pytest.raises(obsq.TaskNotFound):
        await client.result("no-such-task", timeout=1)
    with pytest.raises(LookupError):  # TaskNotFound is also a LookupError
        await client.info("no-such-task", queue="elsewhere")


async def test_info_reports_the_task(app, client) -> None:
    info = await client.enqueue("report:build", {"month": 11}, queue="reports",
                                max_retry=4, headers={"h": "v"})
    stored = await client.info(info.id)
    assert (stored.id, stored.type, stored.queue, stored.state) == (
        info.id, "report:build", "reports", "pending")
    assert stored.payload == {"month": 11}
    assert stored.headers == {"h": "v"}
    assert stored.max_retry == 4
    assert stored.retry_count == 0
    assert stored.error is None and stored.result is None
    assert stored.enqueued_at is not None and stored.next_run_at is None


async def test_update_state_progress_is_visible_in_info(app, client, start_worker) -> None:
    step = asyncio.Event()
    finish = asyncio.Event()

    @app.task("long")
    async def long(task: obsq.Task):
        await task.update_state({"step": 1, "of": 2})
        await step.wait()
        await task.update_state({"step": 2, "of": 2})
        await finish.wait()
        return "done"

    await start_worker()
    info = await client.enqueue("long", retention=60)
    first = await wait_until(lambda: _progress(client, info.id, {"step": 1, "of": 2}))
    assert first.state == "active"
    step.set()
    await wait_until(lambda: _progress(client, info.id, {"step": 2, "of": 2}))
    finish.set()
    assert await client.result(info, timeout=10) == "done"
    with pytest.raises(RuntimeError):
        await obsq.Task(id="x", type="t", queue="q", raw_payload=b"null", raw_headers=b"",
                        retry_count=0, max_retry=0, timeout=1,
                        retention=0).update_state("outside a worker")


async def test_sync_client_enqueue_result_info(app, redis_url, namespace,
                                               start_worker) -> None:
    @app.task("add")
    def add(task: obsq.Task):
        return sum(task.payload)

    await start_worker()

    def use_sync_client() -> tuple[object, object, list[bool]]:
        with obsq.SyncClient(redis_url, namespace, app=app) as sync:
            info = sync.enqueue("add", [1, 2, 3], retention=60)
            result = sync.result(info, timeout=10)
            stored = sync.info(info.id)
            many = sync.enqueue_many([obsq.Job("add", [1]), obsq.Job("add", [2])])
            with pytest.raises(obsq.DuplicateTask):
                sync.enqueue("add", [0], task_id=info.id)
        return result, stored, [m.duplicate for m in many]

    result, stored, duplicates = await asyncio.to_thread(use_sync_client)
    assert result == 6
    assert (stored.state, stored.result) == ("completed", 6)
    assert duplicates == [False, False]


async def _state(client: obsq.Client, task_id: str, state: str) -> bool:
    return (await client.info(task_id)).state == state


async def _progress(client: obsq.Client, task_id: str, progress: object
                    ) -> obsq.TaskInfo | None:
    info = await client.info(task_id)
    return info if info.progress == progress else None



def _watchers(raw_redis, namespace: str, info: obsq.TaskInfo) -> int:
    """How many clients wait for the task (one entry each, whatever their waiters)."""
    entry = raw_redis.hget(QueueKeys(namespace, info.queue).watched, info.id)
    return len(entry.split()) if entry else 0


async def test_results_follow_the_payload_rules_a_datetime_or_nan_is_not_json(
        app, client, start_worker, caplog) -> None:
    import datetime

    @app.task("when")
    def when(task: obsq.Task):
        return datetime.datetime(2026, 12, 3, 16, 4, 10)

    @app.task("ratio")
    async def ratio(task: obsq.Task):
        return {"ratio": float("nan")}

    await start_worker()
    kept = [await client.enqueue(name, retention=60) for name in ("when", "ratio")]
    await client.enqueue("ratio")  # without retention: completes, the result dropped
    for info in kept:
        with pytest.raises(obsq.TaskFailed) as caught:
            await client.result(info.id, timeout=15)
        assert "is not run again" in caught.value.error
    assert "not JSON-serializable" in (await client.info(kept[0].id)).error
    assert "NaN or an infinity" in (await client.info(kept[1].id)).error
    await wait_until(lambda: "the result of task type 'ratio' holds NaN or an infinity, "
                     "which JSON cannot represent; it is not kept" in caplog.text,
                     what="the warning for the dropped result")


async def test_a_plain_handler_calls_update_state_without_await(
        app, client, start_worker, recwarn) -> None:
    import threading

    finish = threading.Event()

    @app.task("plain_long")
    def plain_long(task: obsq.Task):
        task.update_state({"step": 1})  # returns once written
        finish.wait(20)
        return "done"

    await start_worker()
    info = await client.enqueue("plain_long", retention=60)
    first = await wait_until(lambda: _progress(client, info.id, {"step": 1}))
    assert first.state == "active"
    finish.set()
    assert await client.result(info, timeout=10) == "done"
    assert not [w for w in recwarn if "never awaited" in str(w.message)]
