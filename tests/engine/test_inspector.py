"""obsq.Inspector against a real Redis and a real worker: what a task holds, pages of a
state, the repairs in bounded steps, the throughput counters, and a page of a queue of a
million tasks."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis
from support import wait_until

import obsq
from obsq.inspection.inspector import STEP, Inspector


async def test_a_task_shows_everything_kept_for_it(app, client, start_worker,
                                                   inspector: Inspector) -> None:
    release = asyncio.Event()

    @app.task("report:build", max_retry=3)
    async def build(task: obsq.Task):
        await task.update_state({"step": task.retry_count})
        if task.retry_count == 0:
            raise_deep_error()
        await release.wait()
        return {"pages": 3}

    worker = await start_worker(queues="reports")
    info = await client.enqueue("report:build", {"month": "2026-11"}, queue="reports",
                                retention=600, headers={"tenant": "t1"}, timeout=90)
    await wait_until(lambda: _state(inspector, info.id, "retry", "pending", "active"))
    async def second_attempt_running():  # and its progress written
        detail = await _detail_when(inspector, info.id, "active")
        return detail if detail and detail.progress == {"step": 1} else None
    detail = await wait_until(second_attempt_running, what="the second attempt's progress")
    assert detail.queue == "reports" and detail.type == "report:build"
    assert detail.payload == {"month": "2026-11"} and detail.headers == {"tenant": "t1"}
    assert detail.options == {"max_retry": 3, "timeout": 90, "retention": 600}
    assert detail.retry_count == 1 and detail.max_retry == 3
    assert detail.error == "ValueError: the month is not closed yet"
    assert "raise_deep_error" in detail.traceback and "ValueError" in detail.traceback
    assert detail.worker == worker.id and detail.fence is not None
    assert detail.lease_expires_at > detail.enqueued_at
    release.set()
    done = await wait_until(lambda: _detail_when(inspector, info.id, "completed"))
    assert done.result == {"pages": 3} and done.worker is None and done.completed_at
    with pytest.raises(obsq.TaskNotFound):
        await inspector.task("no-such-task")


def raise_deep_error() -> None:
    raise ValueError("the month is not closed yet")


async def test_pages_follow_the_order_of_each_state_and_filter_by_type(
        client, inspector: Inspector) -> None:
    pending = [await client.enqueue(t, i, queue="mail") for i, t in
               enumerate(["mail:send", "mail:bounce", "sms:send"] * 5)]
    later = [await client.enqueue("mail:send", i, queue="mail", delay=100 - i)
             for i in range(3)]
    page = await inspector.tasks("mail", "pending", limit=4)
    assert [t.id for t in page.tasks] == [i.id for i in pending[:4]]  # next to run first
    assert (page.total, page.next_offset) == (15, 4)
    assert page.tasks[0].payload == "0" and page.tasks[0].type == "mail:send"
    last = await inspector.tasks("mail", "pending", limit=4, offset=12)
    assert [t.id for t in last.tasks] == [i.id for i in pending[12:]]
    assert last.next_offset is None
    exact = await inspector.tasks("mail", "pending", limit=20, type="sms:send")
    assert [t.id for t in exact.tasks] == [i.id for i in pending[2::3]]
    prefix = await inspector.tasks("mail", "pending", limit=3, type="mail:")
    assert [t.id for t in prefix.tasks] == [pending[0].id, pending[1].id, pending[3].id]
    assert prefix.next_offset == 4
    scheduled = await inspector.tasks("mail", "scheduled")
    assert [t.id for t in scheduled.tasks] == [i.id for i in reversed(later)]  # soonest first
    assert scheduled.tasks[0].due_at > scheduled.tasks[0].enqueued_at
    with pytest.raises(obsq.QueueNotFound, match="no queue 'post'"):
        await inspector.tasks("post", "pending")
    with pytest.raises(ValueError, match="state must be one of"):
        await inspector.tasks("mail", "sleeping")


async def test_requeue_moves_every_task_in_bounded_steps(client, inspector: Inspector,
                                                         raw_redis, namespace) -> None:
    count = STEP * 2 + 500
    infos = await client.enqueue_many([obsq.Job("t", i, delay=3600) for i in range(count)])
    moved = await inspector.requeue("default", "scheduled")
    assert (moved.moved, moved.left) == (count, 0)
    assert raw_redis.llen(f"{namespace}:{{default}}:pending") == count
    assert (await inspector.task(infos[-1].id)).state == "pending"

    late = await client.enqueue("t", "x", delay=3600)
    result = await inspector.requeue("default", "scheduled", [late.id, "nope", infos[0].id])
    assert (result.moved, result.missing) == (1, ["nope", infos[0].id])
    with pytest.raises(ValueError, match="only dead, cancelled, retry, scheduled"):
        await inspector.requeue("default", "pending")
    with pytest.raises(obsq.QueueNotFound):
        await inspector.requeue("nosuchqueue")


async def test_delete_and_purge(app, client, start_worker, inspector: Inspector,
                                raw_redis, namespace) -> None:
    running = asyncio.Event()
    release = asyncio.Event()

    @app.task("hold")
    async def hold(task):
        running.set()
        await release.wait()

    @app.task("t")
    async def t(task):  # never run: no worker serves its queue
        pass

    waiting = await client.enqueue("t", 1, unique_for=600)
    scheduled = await client.enqueue("t", 2, delay=600)
    assert await inspector.delete(waiting.id) == "pending"
    assert await inspector.delete(scheduled.id) == "scheduled"
    assert raw_redis.llen(f"{namespace}:{{default}}:pending") == 0
    assert not raw_redis.exists(f"{namespace}:{{default}}:t:{waiting.id}")
    with pytest.raises(obsq.DuplicateTask):  # its unique lock lasts unique_for all the same
        await client.enqueue("t", 1, unique_for=600)
    await client.enqueue("t", 1)
    with pytest.raises(obsq.TaskNotFound):
        await inspector.delete(waiting.id)

    await start_worker(queues="holding")
    held = await client.enqueue("hold", queue="holding")
    await asyncio.wait_for(running.wait(), 10)
    with pytest.raises(obsq.TaskRunning):
        await inspector.delete(held.id)
    release.set()

    await client.enqueue_many([obsq.Job("t", i, delay=600) for i in range(STEP + 200)])
    assert await inspector.purge("default", "scheduled") == STEP + 200
    assert raw_redis.zcard(f"{namespace}:{{default}}:scheduled") == 0
    assert await inspector.purge("default", "pending") == 1
    assert [k for k in raw_redis.scan_iter(f"{namespace}:{{default}}:t:*")] == []
    with pytest.raises(ValueError, match="only pending"):
        await inspector.purge("default", "active")


async def test_workers_keep_throughput_and_failure_counts(app, client, start_worker,
                                                          inspector: Inspector) -> None:
    @app.task("job", max_retry=0)
    async def job(task):
        if task.payload == "fail":
            raise ValueError("no")

    first = await start_worker(queues="jobs")
    second = await start_worker(queues="jobs")  # shares the App: each attempt counts once
    infos = await client.enqueue_many([obsq.Job("job", "ok", queue="jobs")] * 7 +
                                      [obsq.Job("job", "fail", queue="jobs")] * 3)
    await wait_until(lambda: _all_ended(client, infos))
    workers = await inspector.workers()
    assert sorted(w.id for w in workers) == sorted([first.id, second.id])
    w = next(w for w in workers if w.id == second.id)
    assert w.queues == {"jobs": 1} and w.concurrency == 10 and w.version == obsq.__version__
    assert w.last_heartbeat and w.started_at and w.pid and w.host

    first.stop()  # a stopping worker flushes its counts; the other one within seconds
    (queue,) = await wait_until(lambda: _counted(inspector, 10))
    assert queue.name == "jobs" and queue.depth["dead"] == 3
    assert (queue.last_hour.processed, queue.last_hour.failed) == (10, 3)
    # the last minute slides over two buckets: across a minute's turn it counts part of one
    assert 8 <= queue.last_minute.processed <= 10 and queue.last_minute.failed <= 3
    assert len(queue.per_minute) == 60 and sum(r.processed for r in queue.per_minute) == 10


async def test_namespaces_are_found_by_a_bounded_scan(client, inspector: Inspector,
                                                      namespace) -> None:
    await client.enqueue("t")
    assert namespace in await inspector.namespaces()


async def test_a_page_of_a_million_tasks_is_read_in_milliseconds(private_redis) -> None:
    """A benchmark, not a timed assertion: it prints the figures."""
    count, ns = 1_000_000, "big"
    fill = """
    local prefix = KEYS[1]
    for i = tonumber(ARGV[1]), tonumber(ARGV[2]) do
      local id = string.format('%032x', i)
      redis.call('HSET', prefix .. 't:' .. id, 'type', (i % 10 == 0) and 'rare' or 'common',
                 'payload', '{"n":' .. i .. '}', 'state', 'dead', 'enq', i, 'due', i,
                 'done', i, 'error', 'ValueError: ' .. i)
      redis.call('LPUSH', prefix .. 'pending', id)
      redis.call('ZADD', prefix .. 'dead', i, id)
    end"""
    r = redis.Redis.from_url(private_redis.url, socket_timeout=120)  # a loaded machine's pace
    started = time.perf_counter()
    for start in range(0, count, 100_000):
        r.eval(fill, 1, f"{ns}:{{big}}:", start, start + 99_999)
    r.sadd(f"{ns}:queues", "big")
    print(f"\nfilled {count:,} tasks in {time.perf_counter() - started:.1f} s")
    async with Inspector(private_redis.url, ns) as inspector:
        await inspector.tasks("big", "pending")  # scripts loaded
        for label, call in [
            ("pending, first page of 20", inspector.tasks("big", "pending")),
            ("dead, first page of 20", inspector.tasks("big", "dead")),
            ("dead, page at offset 500,000", inspector.tasks("big", "dead", offset=500_000)),
            ("pending, page at offset 500,000",
             inspector.tasks("big", "pending", offset=500_000)),
            ("dead, 20 of type 'rare' (1 in 10)", inspector.tasks("big", "dead", type="rare")),
            ("queues() with depths and rates", inspector.queues()),
        ]:
            started = time.perf_counter()
            result = await call
            ms = (time.perf_counter() - started) * 1000
            print(f"{label}: {ms:.2f} ms")
            if label.startswith("dead, first"):
                assert result.total == count and len(result.tasks) == 20
                assert result.tasks[0].id == f"{count - 1:032x}"
    r.close()


async def _state(inspector: Inspector, task_id: str, *states: str) -> bool:
    return (await inspector.task(task_id)).state in states


async def _detail_when(inspector: Inspector, task_id: str, state: str):
    detail = await inspector.task(task_id)
    return detail if detail.state == state else None


async def _all_ended(client: obsq.Client, infos: list[obsq.TaskInfo]) -> bool:
    for info in infos:
        try:
            if (await client.info(info.id)).state not in ("dead", "completed"):
                return False
        except obsq.TaskNotFound:
            pass  # completed without retention
    return True


async def _counted(inspector: Inspector, n: int):
    queues = await inspector.queues()
    return queues if queues and queues[0].last_hour.processed >= n else None



async def test_the_inspector_works_on_a_redis_cluster(redis_cluster: str) -> None:
    ns = "inspect-cluster"
    async with obsq.Client(redis_cluster, ns) as client, \
            Inspector(redis_cluster, ns) as inspector:
        for queue in ("a", "b", "c"):
            await client.enqueue_many([obsq.Job("t", i, queue=queue, delay=600)
                                       for i in range(5)])
        queues = await inspector.queues()
        assert [(q.name, q.depth["scheduled"]) for q in queues] == [("a", 5), ("b", 5),
                                                                     ("c", 5)]
        page = await inspector.tasks("b", "scheduled", limit=2)
        assert len(page.tasks) == 2 and page.next_offset == 2
        assert (await inspector.task(page.tasks[0].id)).queue == "b"
        assert (await inspector.requeue("b", "scheduled")).moved == 5
        assert await inspector.purge("b", "pending") == 5
        assert await inspector.delete((await inspector.tasks("c", "scheduled")).tasks[0].id) \
            == "scheduled"
        for queue in ("a", "c"):
            await inspector.purge(queue, "scheduled")


async def test_a_task_looked_up_in_the_wrong_queue_says_where_it_is(client, inspector
                                                                    ) -> None:
    info = await client.enqueue("t", queue="mail")
    with pytest.raises(obsq.TaskNotFound, match="in queue 'default': it is in queue 'mail'"):
        await inspector.task(info.id, "default")
    assert (await inspector.task(info.id, "mail")).queue == "mail"


async def test_tasks_waiting_behind_an_ordering_key_are_listed_as_pending(
        client, inspector: Inspector, obsq_cli) -> None:
    """They count as pending (obsq queues), so the pending pages list them, after the rest
    and in the order they were enqueued; one that starts or leaves is listed no more."""
    keyed = [await client.enqueue("t", i, queue="flat", ordering_key="k1") for i in range(4)]
    urgent = await client.enqueue("t", "urgent", queue="flat", priority=5)
    assert (await inspector.queue("flat")).depth["pending"] == 5
    page = await inspector.tasks("flat", "pending", limit=3)
    assert [t.id for t in page.tasks] == [urgent.id, keyed[0].id, keyed[1].id]
    assert (page.total, page.next_offset) == (5, 3)
    rest = await inspector.tasks("flat", "pending", limit=3, offset=3)
    assert [t.id for t in rest.tasks] == [keyed[2].id, keyed[3].id]
    code, out = await obsq_cli("tasks", "flat", "pending")
    assert code == 0 and "5 shown" in out and all(i.id in out for i in keyed)

    assert await client.cancel(keyed[2].id) == "cancelled"  # one waiting leaves
    await inspector.delete(keyed[0].id)  # the first leaves: keyed[1] is pending now
    page = await inspector.tasks("flat", "pending")
    assert [t.id for t in page.tasks] == [urgent.id, keyed[1].id, keyed[3].id]
    assert page.total == (await inspector.queue("flat")).depth["pending"] == 3
